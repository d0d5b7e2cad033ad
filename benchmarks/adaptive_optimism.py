"""Adaptive speculation at several values of its optimism (AdaptiveConfig.optimism: how many deviations above a row's
acceptance estimate its hopeful figures take it) beside plain decoding and fixed 4-chains, on the shipped Qwen3.5 on
the CPU over MT-bench questions, the engines' order turned round by round so that the machine's drift falls on all
alike. Where a drafter's speculation barely pays (the shipped draft model on a 2-core CPU: its 2-chain step emits
about what two plain steps cost), what the policy does with its hopes decides whether it runs at plain decoding's
speed or below it. To compare two policies, copy this file into the other checkout's benchmarks/ and run it from
each checkout's root in turn (`python -m` imports the specdec of the folder it runs in).

    OMP_NUM_THREADS=1 python -m benchmarks.adaptive_optimism --draft small --batch 1 --prompts 20 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace

import torch

from benchmarks.adaptive_overhead import decode
from specdec.api import LLM
from specdec.engine.engine import EngineConfig
from specdec.eval.datasets import load_prompts


def engines(target: str, draft: str, batch: int, optimisms: list[float]) -> dict[str, LLM]:
    """name -> LLM: plain decoding, fixed 4-chains, adaptive speculation (chains of 1, 2 or 4 or none) at each
    optimism."""
    flags = dict(max_batch=max(batch, 8))
    llms = {"plain decoding": LLM(target),
            "fixed 4-chains": LLM(target, draft, config=EngineConfig.from_flags(speculation="fixed", **flags))}
    for optimism in optimisms:
        config = EngineConfig.from_flags(speculation="adaptive", **flags)
        llms[f"adaptive, optimism {optimism:g}"] = LLM(
            target, draft, config=replace(config, adaptive=replace(config.adaptive, optimism=optimism)))
    return llms


def run(llms: dict[str, LLM], prompts: list[str], rounds: int, batch: int, new_tokens: int) -> dict[str, list[float]]:
    """Every engine over the prompts once a round, the order turned each round -> name: tokens a second per round."""
    for llm in llms.values():  # (warm-up)
        llm.generate(prompts[:1], max_new_tokens=16)
    names = list(llms)
    rates: dict[str, list[float]] = {name: [] for name in names}
    for number in range(rounds):
        for name in names[number % len(names):] + names[:number % len(names)]:
            rates[name].append(decode(llms[name], prompts, new_tokens, batch)[0])
        print(f"[optimism] round {number + 1}/{rounds}: "
              + ", ".join(f"{name} {values[-1]:.1f}" for name, values in rates.items()), flush=True)
    return rates


def table(llms: dict[str, LLM], rates: dict[str, list[float]]) -> str:
    plain = rates["plain decoding"]
    lines = ["| engine | tok/s (median) | / plain (median of the rounds' ratios) | rounds' / plain | shapes chosen |",
             "|---|---|---|---|---|"]
    for name, values in rates.items():
        ratios = [value / base for value, base in zip(values, plain, strict=True)]
        policy = llms[name].engine.policy
        shapes = ""
        if policy is not None:
            total = sum(policy.counts.values())
            shapes = ", ".join(f"{label} {n / total:.0%}" for label, n in policy.counts.most_common())
        lines.append(f"| {name} | {statistics.median(values):.1f} | {statistics.median(ratios):.3f}x | "
                     f"{min(ratios):.3f}-{max(ratios):.3f} | {shapes} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="qwen3.5")
    parser.add_argument("--draft", default="small")
    parser.add_argument("--batch", type=int, default=1, help="prompts decoded together")
    parser.add_argument("--prompts", type=int, default=20, help="the first N MT-bench questions")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--optimism", type=float, nargs="+", default=[1.0, 0.0])
    args = parser.parse_args()
    if min(args.batch, args.prompts, args.rounds, args.max_new_tokens) < 1 or min(args.optimism) < 0:
        raise SystemExit("--batch, --prompts, --rounds and --max-new-tokens take values >= 1, --optimism values >= 0")
    torch.set_num_threads(1)  # (as the CPU eval: one torch thread, benchmarks/cpu_eval.py says why)
    prompts = [p.text for p in load_prompts("mt-bench", args.prompts)]
    llms = engines(args.target, args.draft, args.batch, args.optimism)
    rates = run(llms, prompts, args.rounds, args.batch, args.max_new_tokens)
    print(f"\n{args.target} + {args.draft}, batch {args.batch}, {args.prompts} MT-bench questions, "
          f"{args.max_new_tokens} greedy tokens, {args.rounds} rounds, the order turned each round (this CPU)\n")
    print(table(llms, rates))


if __name__ == "__main__":
    main()
