"""The sigmoid router on the GPU: its Triton kernel (verify_kernels/moe/router.py) against the torch path the model
ran before it (sigmoid_router_ref: the fp32 GEMM, sigmoid, bias, top-k, gather, renormalisation), at Nemotron-3-Nano's
shapes (hidden 2688, 128 experts, 6 a token, bf16 rows), checked against each other first, timed as the kernel
benchmarks time (CUDA graphs, medians, inputs rotated so that the L2 holds none of them between calls): the kernel
as the model launches it, and each of its two forms (one launch; a program a chunk of columns, then the selection),
against the bound of its bytes (the weight read once, the rows, the outputs) at the copy bandwidth of the run.

    python -m benchmarks.moe_router [--tokens 1 16 128 640 2048 8192]
"""

from __future__ import annotations

import argparse
from functools import partial

import torch

from benchmarks.timing import copy_bandwidth, rotations_for, time_calls
from verify_kernels.moe import sigmoid_router, sigmoid_router_ref

HIDDEN, EXPERTS, TOP_K, SCALING = 2688, 128, 6, 2.5  # Nemotron-3-Nano


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 16, 128, 640, 2048, 8192])
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("the router benchmark needs a CUDA GPU")
    gen = torch.Generator(device="cuda").manual_seed(0)
    weight = torch.randn(EXPERTS, HIDDEN, device="cuda", generator=gen) * 0.02
    bias = torch.randn(EXPERTS, device="cuda", generator=gen) * 0.01
    copy_bw = copy_bandwidth()
    print(f"device copy: {copy_bw / 1e12:.2f} TB/s")
    print("| tokens | torch us | kernel us | x torch | one launch us | chunks us | bound us | % of bound "
          "| experts differing |\n|---|---|---|---|---|---|---|---|---|")
    for tokens in args.tokens:
        rotations = rotations_for(tokens * HIDDEN * 2)
        x = torch.randn(rotations, tokens, HIDDEN, device="cuda", generator=gen).bfloat16()
        ours, ref = sigmoid_router(x[0], weight, bias, TOP_K, True, SCALING), sigmoid_router_ref(
            x[0], weight, bias, TOP_K, 1, 1, True, SCALING)
        differing = (ours[0].sort(1).values != ref[0].sort(1).values).any(1).sum().item()  # (near-ties only)
        torch_us = time_calls([partial(sigmoid_router_ref, x[r], weight, bias, TOP_K, 1, 1, True, SCALING)
                               for r in range(rotations)]) * 1e6
        kernel_us, one_us, chunks_us = (
            time_calls([partial(sigmoid_router, x[r], weight, bias, TOP_K, True, SCALING, one_launch=form)
                        for r in range(rotations)]) * 1e6
            for form in (None, True, False))
        bound_us = (weight.nbytes + bias.nbytes + x[0].nbytes + tokens * TOP_K * (8 + 4)) / copy_bw * 1e6
        print(f"| {tokens} | {torch_us:.1f} | {kernel_us:.1f} | {torch_us / kernel_us:.2f} | {one_us:.1f} "
              f"| {chunks_us:.1f} | {bound_us:.2f} | {bound_us / kernel_us:.0%} | {differing} of {tokens} |",
              flush=True)


if __name__ == "__main__":
    main()
