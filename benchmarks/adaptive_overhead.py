"""What adaptive speculation's engine costs on its own: plain decoding against the adaptive engine held to plain steps
(every request collapsed, no probes, no refreshes: its plans, bookkeeping and the drafter told the tokens, nothing
drafted) and against free adaptive speculation, on the shipped Qwen3.5 with a drafter, batch 1 (or --batch N: the
prompts N at a time), the engines alternated over several rounds so that a machine's drift falls on all three alike
(the CPU eval times each once).

    python -m benchmarks.adaptive_overhead --draft small --prompts 6 --rounds 3
    python -m benchmarks.adaptive_overhead --draft small --prompts 8 --rounds 3 --batch 4
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


def tokens_per_second(llm: LLM, prompts: list[str], new_tokens: int, batch: int) -> float:
    """The prompts `batch` at a time, greedy -> emitted tokens per second."""
    start, emitted = time.perf_counter(), 0
    for first in range(0, len(prompts), batch):
        outputs = llm.generate(prompts[first:first + batch], max_new_tokens=new_tokens)
        emitted += sum(len(output.token_ids) for output in outputs)
    return emitted / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="qwen3.5")
    parser.add_argument("--draft", default="small")
    parser.add_argument("--prompts", type=int, default=6, help="the first N MT-bench questions")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=1, help="prompts decoded together")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()
    prompts = [p.text for p in load_prompts("mt-bench", args.prompts)]
    adaptive = EngineConfig.from_flags(speculation="adaptive")
    held = replace(adaptive, adaptive=AdaptiveConfig(collapse=1.01, probe_every=10**9, refresh_every=0))
    engines = {"plain decoding": LLM(args.target), "adaptive, held to plain steps": LLM(args.target, args.draft,
                                                                                       config=held),
               "adaptive": LLM(args.target, args.draft, config=adaptive)}
    for llm in engines.values():  # warm-up
        llm.generate(prompts[:1], max_new_tokens=16)
    rates: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(args.rounds):
        for name, llm in engines.items():
            rates[name].append(tokens_per_second(llm, prompts, args.max_new_tokens, args.batch))
    print(f"{args.target} + {args.draft}, batch {args.batch}, {args.prompts} MT-bench questions, "
          f"{args.max_new_tokens} tokens, {args.rounds} rounds alternated")
    print("| engine | tok/s per round | median | / plain |")
    print("|---|---|---|---|")
    base = statistics.median(rates["plain decoding"])
    for name, values in rates.items():
        median = statistics.median(values)
        print(f"| {name} | {', '.join(f'{v:.1f}' for v in values)} | {median:.1f} | {median / base:.2f}x |")
    counts = engines["adaptive"].engine.policy.counts
    total = sum(counts.values())
    print("adaptive shapes:", ", ".join(f"{label} {n / total:.0%}" for label, n in counts.most_common()))


if __name__ == "__main__":
    main()
