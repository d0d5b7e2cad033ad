"""Adaptive speculation against plain decoding in one process: two engines over one target (its weights shared), their
timed runs alternated round by round (plain first in even rounds, adaptive first in odd ones), each round a paired
ratio. The study (benchmarks/study.py) times each engine in processes of its own, and an engine's step time moves by
up to 8% from one process to the next on the H200: at three repeats a point, a difference of 0.5% (issue 17's
adaptive at a collapsed acceptance, batch 64: 0.995x of plain) cannot be told from that. Here whatever a process
draws (allocations, kernel launches, clocks) falls on both engines alike. The adaptive engine is held from round to
round, as a server holds it: its first round explores the shapes, later ones run what it learnt (a row per round).
Both engines run the study's synthetic drafts (adaptive: chains up to 4 and the study's tree) and the same timed
batch as `specdec bench` (time_batch: warm-up, prefill, then the timed steps). --fixed adds a third engine, fixed
4-chains of the same drafts, to the rotation (adaptive / fixed per round: issue 17's other target, >= 0.95x of the
best fixed shape); --control adds a second plain engine built as the adaptive one is (its own pools and graphs over
the same target, after the first's): second plain / plain per round is what being another engine in the process
costs, the floor under adaptive / plain; --prompt-tokens sets the context the steps start from (the study's is 128).

    python -m benchmarks.paired_adaptive --model qwen3.5-9b --batch 64 --accepted 1.2 --rounds 8 --out paired.json
    python -m benchmarks.paired_adaptive --model qwen3.5-9b --batch 16 --accepted 2.72 --prompt-tokens 8192 --fixed
    python -m benchmarks.paired_adaptive --model nemotron-3-nano --batch 1 --accepted 1.2 --rounds 6 --control
    python -m benchmarks.paired_adaptive --tiny --device cpu --batch 4 --rounds 2 --new-tokens 16   (a smoke run)
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
from dataclasses import replace
from pathlib import Path

import torch

from benchmarks.study import ACCEPTED_LENGTH, SHAPES, TREE
from specdec.eval.bench import (
    BenchSettings,
    bench_engine_config,
    bench_peaks,
    bench_prompts,
    capture_ahead,
    load_llm,
    time_batch,
)
from specdec.eval.step_cost import with_device_prior
from specdec.eval.synthetic import synthetic_speculation

MODES = ("plain", "adaptive")
FIXED = "speculative"  # (--fixed: fixed 4-chains, the mode's name in `specdec bench` rows)
CONTROL = "control"  # (--control: a second plain engine)


def build(settings: BenchSettings, fixed: bool = False, control: bool = False) -> dict:
    """mode -> LLM: the plain engine as `specdec bench` loads it, and an adaptive engine over its very target
    (LLM.beside: its own drafter, pools and graphs, the weights shared); fixed: a third, fixed speculation with
    4-chains of the same drafts (the chains' depth, no tree); control: another plain engine, built as the adaptive
    one is (after the first, beside it)."""
    plain = load_llm(settings, "kvbuffer", "plain")
    llms = {"plain": plain}
    chains = replace(settings, topk=1, num_draft_tokens=None, dynamic_tree=False)
    for mode, mode_settings in (("adaptive", settings), *(((FIXED, chains),) if fixed else ())):
        config = bench_engine_config(mode_settings, "kvbuffer", mode)
        drafter, acceptance = synthetic_speculation(settings.draft, config.shape.depth)
        llms[mode] = plain.beside(drafter, config=config, acceptance=acceptance)
    if control:
        llms[CONTROL] = plain.beside(None, config=bench_engine_config(settings, "kvbuffer", "plain"))
    return llms


def run(settings: BenchSettings, rounds: int, fixed: bool = False, control: bool = False) -> dict:
    """The engines, `rounds` timed runs each, alternated (the order turned each round). -> the rounds' rows and
    their paired ratios: adaptive / plain, with `fixed` adaptive / fixed 4-chains too, with `control` second plain
    / plain too."""
    peaks = bench_peaks(settings)
    llms = build(settings, fixed, control)
    modes = (*MODES, *((FIXED,) if fixed else ()), *((CONTROL,) if control else ()))
    with_device_prior(llms["adaptive"], peaks)
    batch = settings.batch_sizes[0]
    prompts = bench_prompts(llms["plain"], settings, batch)
    if settings.capture_ahead:
        for llm in llms.values():
            capture_ahead(llm, batch, settings)
    runs: list[dict] = []
    for number in range(rounds):
        order = modes if number % 2 == 0 else modes[::-1]
        rows = {mode: time_batch(llms[mode], prompts, batch, settings, "kvbuffer", "plain" if mode == CONTROL else mode,
                                 0, 0, peaks) for mode in order}
        ratio = rows["adaptive"].tokens_per_second / rows["plain"].tokens_per_second
        versus_fixed = ({"ratio_to_fixed": rows["adaptive"].tokens_per_second / rows[FIXED].tokens_per_second}
                        if fixed else {})
        versus_control = ({"control_ratio": rows[CONTROL].tokens_per_second / rows["plain"].tokens_per_second}
                          if control else {})
        runs.append({"round": number, "order": list(order), "ratio": ratio, **versus_fixed, **versus_control,
                     **{mode: {"tokens_per_second": row.tokens_per_second, "ms_per_step": row.ms_per_step,
                               "full_batch_step_ms": row.full_batch_step_ms, "gc_pause_ms": row.gc_pause_ms,
                               "shapes": row.shapes, "step_ms": row.step_ms} for mode, row in rows.items()}})
        against_fixed = (f", fixed 4-chains {rows[FIXED].tokens_per_second:.1f} (adaptive "
                         f"{versus_fixed['ratio_to_fixed']:.4f}x of it)" if fixed else "")
        against_fixed += (f", second plain {versus_control['control_ratio']:.4f}x of plain" if control else "")
        print(f"[paired] round {number + 1}/{rounds}: plain {rows['plain'].tokens_per_second:.1f} tok/s, adaptive "
              f"{rows['adaptive'].tokens_per_second:.1f} ({ratio:.4f}x){against_fixed}, shapes "
              f"{rows['adaptive'].shapes}", flush=True)
    return {"runs": runs, **summary(runs)}


def summary(runs: list[dict]) -> dict:
    """The paired ratios adaptive / plain: all rounds', and those after the first (the held engine's, its shapes
    explored): median, lowest, highest, and how many rounds adaptive was at least as fast."""
    def figures(ratios: list[float]) -> dict:
        return {"median": statistics.median(ratios), "lowest": min(ratios), "highest": max(ratios),
                "at_least_plain": sum(r >= 1.0 for r in ratios), "rounds": len(ratios)} if ratios else {}

    ratios = [r["ratio"] for r in runs]
    to_fixed = [r["ratio_to_fixed"] for r in runs if "ratio_to_fixed" in r]
    fixed = {"to_fixed": {k: v for k, v in figures(to_fixed).items() if k != "at_least_plain"}} if to_fixed else {}
    controls = [r["control_ratio"] for r in runs if "control_ratio" in r]
    control = {"control": figures(controls)} if controls else {}
    return {"all_rounds": figures(ratios), "after_the_first": figures(ratios[1:]), **fixed, **control}


def table(result: dict) -> str:
    fixed, control = "to_fixed" in result, "control" in result
    lines = [f"{result['model']}, batch {result['batch']}, {result.get('prompt_tokens', 128)} prompt tokens, "
             f"{result['accepted']} accepted, {result['new_tokens']} new tokens, {result['device']}", "",
             "| round | first | plain tok/s | adaptive tok/s | adaptive / plain |"
             + (" fixed 4-chains tok/s | adaptive / fixed |" if fixed else "")
             + (" second plain tok/s | second plain / plain |" if control else "") + " adaptive's shapes |",
             "|---|---|---|---|---|" + ("---|---|" if fixed else "") + ("---|---|" if control else "") + "---|"]
    for run in result["runs"]:
        shapes = ", ".join(f"{k} {v}" for k, v in sorted((run["adaptive"]["shapes"] or {}).items(),
                                                         key=lambda item: -item[1]))
        against = (f" {run[FIXED]['tokens_per_second']:.1f} | {run['ratio_to_fixed']:.4f}x |" if fixed else "")
        against += (f" {run[CONTROL]['tokens_per_second']:.1f} | {run['control_ratio']:.4f}x |" if control else "")
        lines.append(f"| {run['round'] + 1} | {run['order'][0]} | {run['plain']['tokens_per_second']:.1f} | "
                     f"{run['adaptive']['tokens_per_second']:.1f} | {run['ratio']:.4f}x |{against} {shapes} |")
    for name in ("all_rounds", "after_the_first"):
        f = result[name]
        if f:
            lines.append(f"\n{name.replace('_', ' ')}: median {f['median']:.4f}x, {f['lowest']:.4f}-"
                         f"{f['highest']:.4f}, adaptive >= plain in {f['at_least_plain']} of {f['rounds']}")
    if fixed:
        f = result["to_fixed"]
        lines.append(f"\nadaptive / fixed 4-chains, all rounds: median {f['median']:.4f}x, {f['lowest']:.4f}-"
                     f"{f['highest']:.4f}")
    if control:
        f = result["control"]
        lines.append(f"\nsecond plain / plain, all rounds: median {f['median']:.4f}x, {f['lowest']:.4f}-"
                     f"{f['highest']:.4f}, >= plain in {f['at_least_plain']} of {f['rounds']}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(ACCEPTED_LENGTH), default="qwen3.5-9b")
    parser.add_argument("--layers", type=int, default=None, help="the first LAYERS of the model (default: all)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--accepted", type=float, default=1.2, help="the drafts' mean accepted length, bonus included")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--prompt-tokens", type=int, default=128, help="tokens of each random prompt (the context "
                        "the steps start from)")
    parser.add_argument("--fixed", action="store_true", help="a third engine, fixed 4-chains of the same drafts, "
                        "timed in the rotation too (adaptive / fixed per round)")
    parser.add_argument("--control", action="store_true", help="another plain engine, built as the adaptive one, "
                        "timed in the rotation too (second plain / plain per round: the floor under adaptive / plain)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="the shipped Qwen3.5 instead (smoke run)")
    parser.add_argument("--policy-trace", type=Path, default=None, help="append the adaptive engine's step "
                        "decisions to this JSONL file (as `specdec bench --policy-trace`), every round's")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: pass --device cpu --tiny for a smoke run")
    if min(args.rounds, args.batch, args.prompt_tokens) < 1:
        raise SystemExit(f"--rounds, --batch and --prompt-tokens take values >= 1, got {args.rounds}, {args.batch} "
                         f"and {args.prompt_tokens}")
    layers = args.layers or SHAPES[args.model][1]
    target = "qwen3.5" if args.tiny else f"random:{args.model}:{layers}"
    settings = BenchSettings(target=target, draft=f"synthetic:{args.accepted}", batch_sizes=(args.batch,),
                             max_new_tokens=args.new_tokens, prompt_tokens=args.prompt_tokens, device=args.device,
                             speculation=("adaptive",), policy_trace=args.policy_trace and str(args.policy_trace),
                             **TREE)
    result = {"model": args.model if not args.tiny else "qwen3.5 (shipped)", "layers": layers, "target": target,
              "batch": args.batch, "accepted": args.accepted, "new_tokens": args.new_tokens,
              "prompt_tokens": args.prompt_tokens,
              "date": datetime.date.today().isoformat(),
              "device": torch.cuda.get_device_name() if args.device == "cuda" else "CPU", "torch": torch.__version__,
              **run(settings, args.rounds, args.fixed, args.control)}
    print(table(result), flush=True)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
