"""What adaptive speculation's engine costs on its own: plain decoding against the adaptive engine held to plain steps
(every request collapsed, no probes, no refreshes: its plans, bookkeeping and the drafter told the tokens, nothing
drafted) and against free adaptive speculation, on the shipped Qwen3.5 with a drafter, batch 1 (or --batch N: the
prompts N at a time), the engines alternated over several rounds so that a machine's drift falls on all alike (the
CPU eval times each once). Every engine runs over the first's target (LLM.beside: its weights and tokenizer shared,
pools, drafter and graphs its own). A second plain decoding engine, built last, is the control: what being another
engine of the process moves, with no difference in code.

    python -m benchmarks.adaptive_overhead --draft small --prompts 6 --rounds 3
    python -m benchmarks.adaptive_overhead --draft small --prompts 8 --rounds 3 --batch 4
    python -m benchmarks.adaptive_overhead --draft small --prompts 4 --rounds 20 --batch 4 --max-new-tokens 64
        (many short rounds: the paired ratios' median tells a difference of well under 1%)
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

from specdec.api import LLM
from specdec.engine.engine import EngineConfig
from specdec.eval.datasets import load_prompts
from specdec.speculation.adaptive import AdaptiveConfig


def decode(llm: LLM, prompts: list[str], new_tokens: int, batch: int) -> tuple[float, int, int]:
    """The prompts `batch` at a time, greedy -> (tokens a second, tokens the steps emitted, target steps). The steps
    emit every token but each prompt's first (the prefill's); a last step's tokens past max_new_tokens not counted."""
    start, generated, steps = time.perf_counter(), 0, 0
    for first in range(0, len(prompts), batch):
        for output in llm.generate(prompts[first:first + batch], max_new_tokens=new_tokens):
            generated += len(output.token_ids)
            steps += output.stats.steps
    return generated / (time.perf_counter() - start), generated - len(prompts), steps


def alternated_run_arguments(description: str, draft: str) -> argparse.Namespace:
    """The flags of a benchmark that alternates engines over rounds of MT-bench questions on the shipped target."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--target", default="qwen3.5")
    parser.add_argument("--draft", default=draft)
    parser.add_argument("--prompts", type=int, default=6, help="the first N MT-bench questions")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=1, help="prompts decoded together")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    return parser.parse_args()


def main() -> None:
    args = alternated_run_arguments(__doc__.split("\n\n")[0], draft="small")
    prompts = [p.text for p in load_prompts("mt-bench", args.prompts)]
    adaptive = EngineConfig.from_flags(speculation="adaptive")
    held = replace(adaptive, adaptive=AdaptiveConfig(collapse=1.01, probe_every=10**9, refresh_every=0))
    first = LLM(args.target)  # (every engine over its weights, LLM.beside: a copy of their own moved a CPU's linear
    # layers by ~4%, which swamped the engines' difference)
    engines = {"plain decoding": first, "adaptive, held to plain steps": first.beside(args.draft, config=held),
               "adaptive": first.beside(args.draft, config=adaptive),
               "plain decoding, a second engine": first.beside(None, config=EngineConfig.from_flags())}
    for llm in engines.values():  # warm-up
        llm.generate(prompts[:1], max_new_tokens=16)
    rates: dict[str, list[float]] = {name: [] for name in engines}
    for number in range(args.rounds):  # (the order turned every round: neither engine always runs first)
        for name, llm in (list(engines.items()) if number % 2 == 0 else list(engines.items())[::-1]):
            rates[name].append(decode(llm, prompts, args.max_new_tokens, args.batch)[0])
    print(f"{args.target} + {args.draft}, batch {args.batch}, {args.prompts} MT-bench questions, "
          f"{args.max_new_tokens} tokens, {args.rounds} rounds alternated")
    print("| engine | tok/s per round | median | / plain | / plain, paired (median of the rounds' ratios) |")
    print("|---|---|---|---|---|")
    plain = rates["plain decoding"]
    base = statistics.median(plain)
    for name, values in rates.items():
        median = statistics.median(values)
        paired = statistics.median(v / p for v, p in zip(values, plain, strict=True))
        print(f"| {name} | {', '.join(f'{v:.1f}' for v in values)} | {median:.1f} | {median / base:.2f}x | "
              f"{paired:.3f}x |")
    counts = engines["adaptive"].engine.policy.counts
    total = sum(counts.values())
    print("adaptive shapes:", ", ".join(f"{label} {n / total:.0%}" for label, n in counts.most_common()))


if __name__ == "__main__":
    main()
