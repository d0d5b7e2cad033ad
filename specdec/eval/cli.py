"""`specdec eval` (acceptance rate and throughput of a drafter on a prompt set, against plain decoding) and
`specdec bench` (a throughput sweep over batch sizes, KVBuffer against the intermediate-state baseline)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from specdec.options import (
    add_model_arguments,
    add_prefill_argument,
    add_speculation_arguments,
    add_speculation_mode_argument,
    add_tp_argument,
    check_tree,
    check_writable,
    int_at_least,
    not_utf8,
    number,
)


def add_commands(commands) -> None:
    evaluate = commands.add_parser(
        "eval", help="acceptance rate and throughput of a drafter on a prompt set",
        description="Run a prompt set with plain decoding and with speculative decoding on the same engine, at one "
        "or more batch sizes; write per-request JSONL, a summary table (mean accepted length, acceptance per draft "
        "position, draft acceptance rate, tokens/s, speedup over plain decoding, peak memory) and PNG plots. "
        "Re-running on the same --output resumes.")
    add_model_arguments(evaluate)
    evaluate.add_argument("--dataset", default="mt-bench",
                          help="mt-bench, humaneval, gsm8k (shipped) or a .jsonl file with a 'prompt' field per line "
                          "(default: mt-bench)")
    evaluate.add_argument("--chat", action="store_true",
                          help="apply the chat template to a .jsonl file's prompts (the shipped sets say themselves)")
    evaluate.add_argument("--num-prompts", type=int_at_least(1), default=None,
                          help="the first N prompts (default: all)")
    evaluate.add_argument("--batch-size", type=int_at_least(1), nargs="+", default=[1],
                          help="requests decoded together; several values make a throughput sweep (default: 1)")
    evaluate.add_argument("--max-new-tokens", type=int_at_least(1), default=128)
    evaluate.add_argument("--temperature", type=number(0.0), default=0.0, help="0 = greedy (default)")
    evaluate.add_argument("--seed", type=int, default=0, help="prompt i samples with seed + i")
    add_speculation_arguments(evaluate)
    add_prefill_argument(evaluate)
    add_tp_argument(evaluate)
    add_speculation_mode_argument(evaluate, several=True)
    evaluate.add_argument("--no-baseline", action="store_true",
                          help="skip the plain-decoding runs (no speedup column)")
    evaluate.add_argument("--rounds", type=int_at_least(1), default=1,
                          help="cut the prompts into N parts and run each part through every mode before the next, "
                          "so a machine whose speed drifts (a shared CPU) slows every mode alike, and report the "
                          "speedup part by part too; keeps every mode's engine loaded (default: 1, mode after mode)")
    evaluate.add_argument("--output", type=Path, default=None,
                          help="results folder (default: eval-results/TARGET_DRAFT_DATASET)")
    evaluate.set_defaults(handler=evaluate_command, launch_check=check_eval)

    bench = commands.add_parser(
        "bench", help="throughput sweep over batch sizes, KVBuffer against the intermediate-state baseline",
        description="Time plain and (with --draft) speculative decoding of random prompts at each batch size on the "
        "KVBuffer and, with --baseline recurrent, on the same engine running the target's linear layers the way "
        "SGLang and vLLM do (no buffer, one state written per draft token); report tokens/s, the speedup, the "
        "linear-attention state memory per request and how many requests fit --state-memory-gb; beside each step "
        "time, its roofline (bytes at the device's copy bandwidth, GEMM FLOPs at its GEMM peak, both measured in the "
        "run) and the roofline ratio between the backends.")
    add_model_arguments(bench)
    bench.add_argument("--batch-sizes", type=int_at_least(1), nargs="+", default=[1, 4, 16])
    bench.add_argument("--baseline", choices=["recurrent"], default=None,
                       help="also time the intermediate-state baseline in the same run")
    bench.add_argument("--max-new-tokens", type=int_at_least(1), default=128)
    bench.add_argument("--prompt-tokens", type=int_at_least(1), default=128, help="tokens of the random prompt")
    add_speculation_arguments(bench)
    add_speculation_mode_argument(bench, several=True)
    bench.add_argument("--state-memory-gb", type=number(0.0, above=True), default=40.0,
                       help="the budget for the requests-that-fit column (default: 40)")
    bench.add_argument("--peak-copy-gbs", type=number(0.0, above=True), default=None,
                       help="the roofline's copy bandwidth in GB/s (bytes read + written), with --peak-gemm-tflops; "
                       "default: both measured on the device at the start of the run (on the CPU: this machine's)")
    bench.add_argument("--peak-gemm-tflops", type=number(0.0, above=True), default=None,
                       help="the roofline's GEMM throughput in TFLOP/s, with --peak-copy-gbs")
    add_prefill_argument(bench)
    bench.add_argument("--disable-cuda-graph", action="store_true")
    bench.add_argument("--capture-per-row", action="store_true",
                       help="capture each batch's step graphs when its row comes (default: every row's before the "
                       "first is timed, so that all rows run holding the same graphs, as a warmed-up server does)")
    bench.add_argument("--policy-trace", type=Path, default=None,
                       help="with --speculation adaptive: append each step's decision (batch, shape chosen, each "
                       "shape's estimated ms and tokens/s, the measured ms) to this JSONL file")
    add_tp_argument(bench)
    bench.add_argument("--hf-reference", action="store_true",
                       help="also time transformers' generate() on the same checkpoint and batch sizes")
    bench.add_argument("--output", type=Path, default=None, help="write the rows and settings to this JSON file")
    bench.set_defaults(handler=bench_command, launch_check=check_bench)


def check_before_loading(args: argparse.Namespace, draft_name: bool) -> None:
    """The device, the drafter's name (the speculative runs load it after the plain ones) and the tree size."""
    from specdec.api import check_device, check_draft_name
    from specdec.eval.acceptance_prior import adaptive_settings
    from specdec.presets import DEFAULT_TARGET, drafter_asked

    check_device(args.device)
    check_tree(args)
    adaptive_settings(args)
    draft = drafter_asked(args.target, args.draft)
    if draft_name and draft is not None:
        check_draft_name(args.target or DEFAULT_TARGET, draft)


def check_bench(args: argparse.Namespace) -> None:
    check_before_loading(args, draft_name=False)  # --draft synthetic:RATE is bench's own
    if args.output is not None:
        check_writable(args.output, "--output")


def check_eval(args: argparse.Namespace) -> None:
    from specdec.eval.datasets import load_prompts

    check_before_loading(args, draft_name=True)
    if args.output is not None:
        check_writable(args.output, "--output", folder=True)
    try:
        load_prompts(args.dataset, args.num_prompts, chat=args.chat)
    except UnicodeDecodeError as error:
        raise not_utf8(args.dataset, error) from None


def bench_command(args: argparse.Namespace) -> None:
    check_bench(args)
    bench(args)


def evaluate_command(args: argparse.Namespace) -> None:
    check_eval(args)
    try:
        evaluate(args)
    except KeyboardInterrupt:
        raise KeyboardInterrupt(f"finished requests are recorded in {output_folder(args)}; the same command "
                                "resumes") from None


def bench(args: argparse.Namespace) -> None:
    import json
    from dataclasses import asdict

    from specdec.eval.bench import BenchSettings, bench_peaks, markdown_table, run_bench
    from specdec.parallel import is_primary
    from specdec.presets import DEFAULT_TARGET, drafter_asked

    settings = BenchSettings(
        target=args.target or DEFAULT_TARGET, draft=drafter_asked(args.target, args.draft),
        batch_sizes=tuple(args.batch_sizes), baseline=args.baseline == "recurrent",
        max_new_tokens=args.max_new_tokens, prompt_tokens=args.prompt_tokens, num_steps=args.num_steps,
        topk=args.topk, num_draft_tokens=args.num_draft_tokens, dynamic_tree=args.dynamic_tree,
        flush_length=args.flush_length, state_memory_gb=args.state_memory_gb, device=args.device, dtype=args.dtype,
        cuda_graphs=not args.disable_cuda_graph, hf_reference=args.hf_reference, peak_copy_gbs=args.peak_copy_gbs,
        peak_gemm_tflops=args.peak_gemm_tflops, tp=args.tp, speculation=tuple(args.speculation),
        policy_trace=str(args.policy_trace) if args.policy_trace else None, capture_ahead=not args.capture_per_row,
        acceptance_prior=tuple(map(str, args.acceptance_prior or ())), max_prefill_tokens=args.max_prefill_tokens)
    peaks = bench_peaks(settings)
    print(f"[specdec] roofline peaks: {peaks}")
    rows = run_bench(settings, peaks)
    print(markdown_table(rows, settings.state_memory_gb))
    if args.output is not None and is_primary():
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps({"settings": asdict(settings), "peaks": asdict(peaks),
                                           "rows": [asdict(r) for r in rows]}, indent=1))
        print(f"[specdec] rows in {args.output}")


def evaluate(args: argparse.Namespace) -> None:
    from specdec.eval.datasets import load_prompts
    from specdec.eval.run import EvalSettings, run_eval
    from specdec.eval.summary import markdown_table
    from specdec.presets import DEFAULT_TARGET, drafter_asked

    settings = EvalSettings(
        target=args.target or DEFAULT_TARGET, draft=drafter_asked(args.target, args.draft), dataset=args.dataset,
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed, num_steps=args.num_steps,
        topk=args.topk, num_draft_tokens=args.num_draft_tokens, dynamic_tree=args.dynamic_tree,
        flush_length=args.flush_length, device=args.device, dtype=args.dtype, tp=args.tp,
        acceptance_prior=tuple(map(str, args.acceptance_prior or ())), max_prefill_tokens=args.max_prefill_tokens)
    try:
        prompts = load_prompts(args.dataset, args.num_prompts, chat=args.chat)
    except UnicodeDecodeError as error:
        raise not_utf8(args.dataset, error) from None
    out = output_folder(args)
    rows = run_eval(settings, prompts, args.batch_size, out, baseline=not args.no_baseline,
                    speculation=tuple(args.speculation), rounds=args.rounds)
    print(markdown_table(rows))
    print(f"[specdec] results in {out}")
    if any(row.mode == "speculative" and row.position_acceptance for row in rows) and not args.dynamic_tree:
        kind = "a chain's" if args.topk == 1 else "a static tree's (beside a chain's eval)"
        print(f"[specdec] adaptive speculation can start from this pair's figures: --acceptance-prior {out} ({kind})")


def output_folder(args: argparse.Namespace) -> Path:
    from specdec.presets import DEFAULT_TARGET, drafter_asked

    parts = (args.target or DEFAULT_TARGET, drafter_asked(args.target, args.draft) or "plain", Path(args.dataset).stem)
    return args.output or Path("eval-results") / "_".join(_slug(part) for part in parts)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]+", "-", Path(text).name if "/" in text else text).strip("-")
