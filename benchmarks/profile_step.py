"""Where a decode / verify step's time goes on the GPU: `specdec bench`'s timed round under torch.profiler, per
backend, as the wall time per step, the GPU's busy time per step (the rest is the host and idle time between
kernels) and the kernels that take it. A diagnostic (it writes nothing), e.g.
    python -m benchmarks.profile_step --target random:nemotron-3-nano:8 --draft synthetic:2.58 --batch 256
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from specdec.eval.bench import BenchSettings, bench_prompt, load_llm, warm_up_and_prefill


def profile_backend(settings: BenchSettings, backend: str, batch: int, top: int) -> list[str]:
    mode = "speculative" if settings.draft else "plain"
    llm = load_llm(settings, backend, mode)
    requests = warm_up_and_prefill(llm, bench_prompt(llm, settings), batch, settings)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        llm.engine.run()
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    steps = max(r.stats.steps for r in requests)
    kernels: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels[event.name][0] += event.device_time / 1e3  # ms
            kernels[event.name][1] += 1
    busy = sum(total for total, _ in kernels.values())
    lines = [f"## {backend} {mode}, batch {batch}: {1e3 * seconds / steps:.2f} ms/step wall, "
             f"{busy / steps:.2f} ms/step on the GPU, {steps} steps", "", "| kernel | ms/step | calls/step |",
             "|---|---|---|"]
    for name, (total, calls) in sorted(kernels.items(), key=lambda item: -item[1][0])[:top]:
        lines.append(f"| {name[:90]} | {total / steps:.3f} | {calls / steps:.1f} |")
    del llm
    torch.cuda.empty_cache()
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", default=None, help="e.g. synthetic:2.6 (default: plain decoding)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--backends", nargs="+", default=["kvbuffer", "recurrent"])
    parser.add_argument("--top", type=int, default=14)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("the step profile needs a CUDA GPU")
    settings = BenchSettings(target=args.target, draft=args.draft, batch_sizes=(args.batch,),
                             max_new_tokens=args.new_tokens, device="cuda")
    for backend in args.backends:
        print("\n".join(profile_backend(settings, backend, args.batch, args.top)) + "\n", flush=True)


if __name__ == "__main__":
    main()
