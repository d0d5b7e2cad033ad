"""Adaptive speculation against every fixed shape a drafter offers, trees included, on the shipped Qwen3.5 on the
CPU: plain decoding, fixed 4-chains, a static tree (--topk 2 --num-draft-tokens 16), a dynamic tree (--dynamic-tree
--topk 4 --num-draft-tokens 16, drafters with their own features: mtp, eagle3) and adaptive speculation (chains of
1, 2 or 4 drafts or none; offered the static tree too; and the dynamic tree, where the drafter drafts one), the
engines alternated over several rounds so that the machine's drift falls on all alike. Issue 17's target is adaptive
>= 0.95x the best of plain decoding and every fixed shape; the CPU eval compares adaptive with fixed chains only, so
this is where the trees stand.

    python -m benchmarks.shapes_cpu --draft mtp --prompts 6 --rounds 3 [--batch 4]
"""

from __future__ import annotations

import statistics

from benchmarks.adaptive_overhead import alternated_run_arguments, decode
from specdec.api import LLM
from specdec.engine.engine import EngineConfig
from specdec.eval.datasets import load_prompts

DYNAMIC_DRAFTERS = ("mtp", "eagle3")  # (a draft model drafts static trees only)


def shapes(draft: str, batch: int) -> dict[str, EngineConfig | None]:
    """engine name -> its config (None: plain decoding)."""
    flags = dict(max_batch=max(batch, 8))
    configs = {"plain decoding": None,
               "fixed 4-chains": EngineConfig.from_flags(speculation="fixed", **flags),
               "fixed static tree, topk 2, 16 drafts": EngineConfig.from_flags(
                   speculation="fixed", topk=2, num_draft_tokens=16, **flags)}
    if draft in DYNAMIC_DRAFTERS:
        configs["fixed dynamic tree, topk 4, 16 drafts"] = EngineConfig.from_flags(
            speculation="fixed", topk=4, num_draft_tokens=16, dynamic_tree=True, **flags)
    configs["adaptive (chains of 1, 2, 4 or none)"] = EngineConfig.from_flags(speculation="adaptive", **flags)
    configs["adaptive (chains, the static tree or none)"] = EngineConfig.from_flags(
        speculation="adaptive", topk=2, num_draft_tokens=16, **flags)
    if draft in DYNAMIC_DRAFTERS:
        configs["adaptive (chains, the dynamic tree or none)"] = EngineConfig.from_flags(
            speculation="adaptive", topk=4, num_draft_tokens=16, dynamic_tree=True, **flags)
    return configs


def main() -> None:
    args = alternated_run_arguments(__doc__.split("\n\n")[0], draft="mtp")
    prompts = [p.text for p in load_prompts("mt-bench", args.prompts)]
    engines = {name: LLM(args.target) if config is None else LLM(args.target, args.draft, config=config)
               for name, config in shapes(args.draft, args.batch).items()}
    for llm in engines.values():  # warm-up
        llm.generate(prompts[:1], max_new_tokens=16)
    rates: dict[str, list[float]] = {name: [] for name in engines}
    per_step = {name: [0, 0] for name in engines}  # tokens the steps emitted, steps
    for _ in range(args.rounds):
        for name, llm in engines.items():
            rate, emitted, steps = decode(llm, prompts, args.max_new_tokens, args.batch)
            rates[name].append(rate)
            per_step[name][0] += emitted
            per_step[name][1] += steps
    print(f"{args.target} + {args.draft}, batch {args.batch}, {args.prompts} MT-bench questions, "
          f"{args.max_new_tokens} greedy tokens, {args.rounds} rounds alternated (this CPU)")
    print("| engine | tokens a step | tok/s per round | median | / plain | / best of plain and the fixed shapes |")
    print("|---|---|---|---|---|---|")
    medians = {name: statistics.median(values) for name, values in rates.items()}
    plain = medians["plain decoding"]
    best_fixed = max(median for name, median in medians.items() if not name.startswith("adaptive"))
    for name, values in rates.items():
        emitted, steps = per_step[name]
        rounds = ", ".join(f"{v:.1f}" for v in values)
        print(f"| {name} | {emitted / max(steps, 1):.2f} | {rounds} | {medians[name]:.1f} | "
              f"{medians[name] / plain:.2f}x | {medians[name] / best_fixed:.2f}x |")
    for name, llm in engines.items():
        if name.startswith("adaptive"):
            counts = llm.engine.policy.counts
            total = sum(counts.values())
            print(f"{name} shapes:", ", ".join(f"{label} {n / total:.0%}" for label, n in counts.most_common()))


if __name__ == "__main__":
    main()
