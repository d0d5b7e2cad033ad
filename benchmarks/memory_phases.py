"""Where an engine's GPU memory goes, phase by phase: what the built engine holds (weights, pools) and the peak each
phase of a bench batch adds above it (CUDA-graph capture, the warm-up round, the batch's prefill, its decoding).
`specdec bench`'s "largest batch in memory" divides the highest of these peaks by the batch; this says which phase
sets it, so that the right one gets cut:

    python -m benchmarks.memory_phases --target random:qwen3.5-9b --draft synthetic:2.72 --batch 256

One engine per run; allocated and reserved (the caching allocator's blocks, free ones included) in GiB.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from specdec.eval.bench import WARMUP_TOKENS, BenchSettings, bench_prompts, load_llm

GIB = 2**30


def peaks_since(device: torch.device) -> tuple[float, float]:
    """(peak allocated, peak reserved) in GiB since the last reset; then resets them for the next phase."""
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) / GIB, torch.cuda.max_memory_reserved(device) / GIB
    torch.cuda.reset_peak_memory_stats(device)
    return peak


def phases(settings: BenchSettings, backend: str, mode: str, batch: int) -> list[tuple[str, float, float]]:
    """[(phase, peak allocated GiB, peak reserved GiB)], the built engine first (its figures: what it holds)."""
    llm = load_llm(settings, backend, mode)
    device, engine = llm.model.device, llm.engine
    prompts = bench_prompts(llm, settings, batch)
    torch.cuda.synchronize(device)
    cache_gib = engine.runner.cache.nbytes() / GIB
    rows = [("built: weights + pools", torch.cuda.memory_allocated(device) / GIB,
             torch.cuda.memory_reserved(device) / GIB), (f"  of which the cache pools ({backend})", cache_gib, 0.0)]
    torch.cuda.reset_peak_memory_stats(device)
    engine.scheduler.max_batch = batch
    engine.prepare_steps(batch, settings.prompt_tokens, settings.max_new_tokens)
    rows.append(("CUDA-graph capture", *peaks_since(device)))
    for prompt in prompts:
        llm.submit(prompt, settings.flush_length + WARMUP_TOKENS)
    engine.run()
    rows.append(("warm-up round (prefill + steps)", *peaks_since(device)))
    for prompt in prompts:
        llm.submit(prompt, settings.max_new_tokens)
    engine.admit_and_prefill()
    rows.append((f"prefill of {batch} x {settings.prompt_tokens} tokens", *peaks_since(device)))
    engine.run()
    rows.append(("decoding to the end", *peaks_since(device)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", default=None, help="e.g. synthetic:2.72 (default: plain decoding)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--backend", choices=("kvbuffer", "recurrent"), default="kvbuffer")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=None, help="also write the table to this markdown file")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("the memory phases need a CUDA GPU (the CPU has no allocator figures)")
    mode = "speculative" if args.draft else "plain"
    settings = BenchSettings(target=args.target, draft=args.draft, batch_sizes=(args.batch,),
                             max_new_tokens=args.new_tokens, device="cuda")
    rows = phases(settings, args.backend, mode, args.batch)
    total = torch.cuda.get_device_properties(0).total_memory / GIB
    lines = [f"# Memory by phase: {args.target}, {args.backend} {mode}, batch {args.batch} ({total:.1f} GiB device)",
             "", "| phase | peak allocated GiB | peak reserved GiB |", "|---|---|---|"]
    lines += [f"| {name} | {allocated:.2f} | {reserved:.2f} |" for name, allocated, reserved in rows]
    print("\n".join(lines), flush=True)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
