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

from specdec.eval.bench import WARMUP_TOKENS, BenchSettings, load_llm


def profile_backend(settings: BenchSettings, backend: str, batch: int, top: int) -> list[str]:
    mode = "speculative" if settings.draft else "plain"
    llm = load_llm(settings, backend, mode)
    engine = llm.engine
    prompt = torch.randint(2, llm.model.hf_config.vocab_size, (settings.prompt_tokens,),
                           generator=torch.Generator().manual_seed(0)).tolist()
    engine.capture_graphs(batch, len(prompt), settings.max_new_tokens)
    for _ in range(batch):
        llm.submit(prompt, settings.flush_length + WARMUP_TOKENS)
    engine.run()
    requests = [llm.submit(prompt, settings.max_new_tokens)[0] for _ in range(batch)]
    engine.step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        engine.run()
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
    del llm, engine
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
