"""cProfile of the engine's host during timed speculative steps on the GPU: where the host's time goes between waiting
for the device (`tolist`, the accepted tokens read back) and its own Python (drafting, packing, acceptance
bookkeeping, emit), which no device work overlaps in a speculative step. Random weights at a real model's shapes,
synthetic drafts accepted at a set mean, CUDA graphs, as `specdec bench`. Three timed runs, the third profiled:

    python -m benchmarks.host_profile --target random:qwen3.5-9b --batch 128 --draft synthetic:2.72

The H200 run of 2026-12-03: benchmarks/results/profile_h200/qwen3.5-9b_spec_b128_host_cprofile_2026-12-03.txt.
benchmarks/host_step.py measures the same host work on a CPU with the forward stubbed out.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import torch

from specdec.eval.bench import BenchSettings, bench_prompts, load_llm, warm_up_and_prefill


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="random:qwen3.5-9b")
    parser.add_argument("--draft", default="synthetic:2.72")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--top", type=int, default=35)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("host_profile times CUDA-graph steps: it needs a CUDA GPU (benchmarks/host_step.py: CPU)")
    settings = BenchSettings(target=args.target, draft=args.draft, batch_sizes=(args.batch,),
                             max_new_tokens=args.new_tokens, device="cuda", speculation=("fixed",))
    llm = load_llm(settings, "kvbuffer", "speculative")
    prompts = bench_prompts(llm, settings, args.batch)
    profile = cProfile.Profile()
    for run in range(3):
        requests = warm_up_and_prefill(llm, prompts, args.batch, settings)
        torch.cuda.synchronize()
        start = time.perf_counter()
        if run == 2:
            profile.enable()
        llm.engine.run()
        torch.cuda.synchronize()
        if run == 2:
            profile.disable()
        steps = max(r.stats.steps for r in requests)
        print(f"run {run}{' (profiled)' if run == 2 else ''}: {steps} steps, "
              f"{(time.perf_counter() - start) / steps * 1e3:.3f} ms/step")
    for order in ("tottime", "cumtime"):
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats(order).print_stats(args.top)
        print(out.getvalue())


if __name__ == "__main__":
    main()
