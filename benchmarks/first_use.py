"""What a server's first requests wait for on a GPU, beyond their own work:

1. `specdec serve`'s start-up capture (specdec/serve/cli.py capture_graphs: the CUDA graphs of every batch up to
   --max-batch and request length up to --max-seq-len): how many graphs, how long, and the GPU memory it reserves;
   then its warm-up (warm_kernels: a request of each of WARM_UP_LENGTHS prompt tokens), how long, what it compiled;
2. prefills at prompt lengths not seen before: each request's seconds and the Triton kernels compiled for it
   (triton.knobs.runtime.jit_post_compile_hook), then the same lengths again, compiled. Run it with a fresh
   TRITON_CACHE_DIR to count compiles rather than loads from the disk cache.

The GPU eval of 2026-12-06 (H100, the shipped Qwen3.5 pair) spent 3-7 s of prefill on each request whose prompt
length was new (41-76 tokens; 51.7 s for the first, which compiles everything), its 89-128 tokens of decoding ~40 ms:
the kernels took the length as a compile-time argument (tests/test_prefill_compiles.py). This measures the fix.

    TRITON_CACHE_DIR=$(mktemp -d) python -m benchmarks.first_use [--target qwen3.5] [--draft mtp] \\
        [--speculation fixed|adaptive] [--max-batch 8] [--max-seq-len 4096] [--lengths 41 42 57 ...] [--out FILE]

Needs a CUDA GPU. Prints a table last (and writes it to --out).
"""

from __future__ import annotations

import argparse
import collections
import time

import torch
import triton

from specdec.api import LLM
from specdec.engine.engine import EngineConfig
from specdec.eval.step_cost import with_device_prior
from specdec.serve.cli import capture_graphs, warm_kernels

LENGTHS = (41, 42, 57, 67, 74, 76, 100, 130, 1000, 3000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="qwen3.5")
    parser.add_argument("--draft", default="mtp", help="a drafter as `specdec serve --draft` takes; 'none': plain")
    parser.add_argument("--speculation", choices=["fixed", "adaptive"], default="fixed")
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--max-seq-len", type=int, default=4096)
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS), help="prompt tokens, in turn")
    parser.add_argument("--out", default=None, help="also write the table here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (there are no CUDA graphs nor compiled kernels to time on the CPU)")
    if max(args.lengths) + 8 + 32 > args.max_seq_len:
        parser.error(f"--lengths up to {max(args.lengths)} need --max-seq-len of at least {max(args.lengths) + 40}")

    compiled: list[str] = []
    # each compile's signature as Triton specialised it (the argument types, constants, and the attributes of the
    # arguments it specialised: `tt.divisibility` 16 where an integer was a multiple of 16), printed for the compiles
    # after the warm-up: what a new length brought that the warm-up's did not. (The hook's `repr` alone printed no
    # argument under triton 3.6.)
    signatures: list[str] = []

    def hook(*_, **kwargs):  # (a compile, not a load from the in-memory cache)
        compiled.append(getattr(kwargs.get("fn"), "name", "?").split(".")[-1])
        build = kwargs.get("compile") or {}
        signatures.append(f"{compiled[-1]} signature {build.get('signature')} constants {build.get('constants')} "
                          f"attributes {build.get('configs')}")
        return False

    triton.knobs.runtime.jit_post_compile_hook = hook
    config = EngineConfig.from_flags(max_batch=args.max_batch, max_seq_len=args.max_seq_len,
                                     speculation=args.speculation)
    start = time.perf_counter()
    llm = LLM(args.target, None if args.draft == "none" else args.draft, device="cuda", config=config)
    with_device_prior(llm)
    torch.cuda.synchronize()
    rows = [("load", "", f"{time.perf_counter() - start:.1f}", len(compiled), "")]
    compiled.clear()
    reserved = torch.cuda.memory_reserved()
    start = time.perf_counter()
    capture_graphs(llm, announce=True)
    torch.cuda.synchronize()
    graphs = f"{(torch.cuda.memory_reserved() - reserved) / 2**30:+.2f} GiB reserved"
    rows.append(("start-up capture", "", f"{time.perf_counter() - start:.1f}", len(compiled), graphs))
    compiled.clear()
    start = time.perf_counter()
    warmed = warm_kernels(llm, announce=True)
    torch.cuda.synchronize()
    which = ", ".join(f"{name} {n}" for name, n in collections.Counter(compiled).most_common(5))
    rows.append(("start-up warm-up", " ".join(map(str, warmed)), f"{time.perf_counter() - start:.1f}",
                 len(compiled), which))
    vocab = llm.model.hf_config.vocab_size
    for turn in ("new length", "again"):
        for length in args.lengths:
            compiled.clear()
            signatures.clear()
            prompt = [(7 * i + length) % (vocab - 10) + 5 for i in range(length)]
            torch.cuda.synchronize()
            start = time.perf_counter()
            llm.generate([prompt], max_new_tokens=8)
            torch.cuda.synchronize()
            which = ", ".join(f"{name} {n}" for name, n in collections.Counter(compiled).most_common(5))
            rows.append((turn, length, f"{time.perf_counter() - start:.2f}", len(compiled), which))
            print(rows[-1], flush=True)
            for signature in signatures:
                print(f"[first_use] compiled at {length} tokens: {signature}", flush=True)
    table = [f"{args.target} + {args.draft} ({args.speculation}), max batch {args.max_batch}, max_seq_len "
             f"{args.max_seq_len}, on {torch.cuda.get_device_name()}, triton {triton.__version__}", "",
             "| what | prompt tokens | seconds | kernels compiled | notes |", "|---|---|---|---|---|"]
    table += [f"| {' | '.join(str(cell) for cell in row)} |" for row in rows]
    print("\n".join(table))
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(table) + "\n")


if __name__ == "__main__":
    main()
