"""The MoE routers on the GPU. The sigmoid router: its Triton kernel (verify_kernels/moe/router.py) against the torch
path the model ran before it (sigmoid_router_ref: the fp32 GEMM, sigmoid, bias, top-k, gather, renormalisation), at
Nemotron-3-Nano's shapes (hidden 2688, 128 experts, 6 a token, bf16 rows), checked against each other first, timed
as the kernel benchmarks time (CUDA graphs, medians, inputs rotated so that the L2 holds none of them between
calls): the kernel as the model launches it, and each of its two forms (one launch; a program a chunk of columns,
then the selection), against the bound of its bytes (the weight read once, the rows, the outputs) at the copy
bandwidth of the run.

    python -m benchmarks.moe_router [--tokens 1 16 128 640 2048 8192] [--tiles 16x128 32x128 16x256]

--tiles: also time each form at other settings of router.py's BLOCK_M x CHUNK_D (rows a program, columns a chunk),
one table a setting (the defaults' first), to choose them.

Then the softmax router at Qwen3.5-35B-A3B's shapes (hidden 2048, 256 experts, 8 a token, bf16): the torch path the
model ran before (the logits' GEMM, softmax, top-k, renormalisation) against the GEMM and the kernel, and the kernel
alone against its bytes' bound (the logits read, the choice written); --softmax-tiles: other SOFTMAX_BLOCK_M x
SOFTMAX_WARPS settings (rows a program x warps).
"""

from __future__ import annotations

import argparse
from functools import partial

import torch
import torch.nn.functional as F
from triton.runtime.errors import OutOfResources

from benchmarks.timing import copy_bandwidth, rotations_for, time_calls
from verify_kernels.moe import router, sigmoid_router, sigmoid_router_ref, softmax_router, softmax_router_ref

HIDDEN, EXPERTS, TOP_K, SCALING = 2688, 128, 6, 2.5  # Nemotron-3-Nano
SOFTMAX_HIDDEN, SOFTMAX_EXPERTS, SOFTMAX_TOP_K = 2048, 256, 8  # Qwen3.5-35B-A3B


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 16, 128, 640, 2048, 8192])
    parser.add_argument("--tiles", nargs="*", default=[], metavar="MxD",
                        help="other BLOCK_M x CHUNK_D settings to time (e.g. 32x128)")
    parser.add_argument("--softmax-tiles", nargs="*", default=[], metavar="MxW",
                        help="other SOFTMAX_BLOCK_M x SOFTMAX_WARPS settings to time (e.g. 1x1 16x4)")
    args = parser.parse_args()
    tiles = [(router.BLOCK_M, router.CHUNK_D)] + [parse_tile(t) for t in args.tiles]
    softmax_tiles = [(router.SOFTMAX_BLOCK_M, router.SOFTMAX_WARPS)] + [parse_pair(t) for t in args.softmax_tiles]
    if not torch.cuda.is_available():
        raise SystemExit("the router benchmark needs a CUDA GPU")
    gen = torch.Generator(device="cuda").manual_seed(0)
    weight = torch.randn(EXPERTS, HIDDEN, device="cuda", generator=gen) * 0.02
    bias = torch.randn(EXPERTS, device="cuda", generator=gen) * 0.01
    copy_bw = copy_bandwidth()
    print(f"device copy: {copy_bw / 1e12:.2f} TB/s")
    for block_m, chunk_d in tiles:
        router.BLOCK_M, router.CHUNK_D = block_m, chunk_d
        print(f"\nBLOCK_M {block_m}, CHUNK_D {chunk_d}:")
        fitting(time_tokens, args.tokens, weight, bias, gen, copy_bw)
    softmax_weight = torch.randn(SOFTMAX_EXPERTS, SOFTMAX_HIDDEN, device="cuda", generator=gen).bfloat16() * 0.02
    for block_m, warps in softmax_tiles:
        router.SOFTMAX_BLOCK_M, router.SOFTMAX_WARPS = block_m, warps
        print(f"\nsoftmax router, Qwen3.5-35B-A3B shapes, SOFTMAX_BLOCK_M {block_m}, SOFTMAX_WARPS {warps}:")
        fitting(time_softmax, args.tokens, softmax_weight, gen, copy_bw)


def fitting(time_table, *args) -> None:
    """Run one setting's table; a setting whose kernel needs more shared memory than the device has ends its table
    with that line (the sweep goes on to the next setting)."""
    try:
        time_table(*args)
    except OutOfResources as error:
        print(f"(this setting does not fit the device: {error})")


def parse_pair(text: str) -> tuple[int, int]:
    """"MxW" -> (SOFTMAX_BLOCK_M, SOFTMAX_WARPS), both powers of two."""
    try:
        block_m, warps = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise SystemExit(f"--softmax-tiles takes MxW settings such as 4x4, got {text!r}") from None
    if min(block_m, warps) < 1 or block_m & (block_m - 1) or warps & (warps - 1):
        raise SystemExit(f"--softmax-tiles {text}: rows and warps must be powers of two")
    return block_m, warps


def routed(choose, x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The softmax router as the model runs it: the logits' GEMM, then `choose` (the torch path or the kernel)."""
    return choose(F.linear(x, weight), SOFTMAX_TOP_K, x.dtype)


def time_softmax(token_counts: list[int], weight: torch.Tensor, gen: torch.Generator, copy_bw: float) -> None:
    """The softmax router's table: torch's path against the GEMM and the kernel, the kernel alone against its bound."""
    print("| tokens | torch us | GEMM + kernel us | x torch | kernel us | bound us | % of bound | experts differing |"
          "\n|---|---|---|---|---|---|---|---|")
    for tokens in token_counts:
        rotations = rotations_for(tokens * SOFTMAX_HIDDEN * 2)
        x = torch.randn(rotations, tokens, SOFTMAX_HIDDEN, device="cuda", generator=gen).bfloat16()
        logits = [F.linear(x[r], weight) for r in range(rotations)]
        ours = softmax_router(logits[0], SOFTMAX_TOP_K, x.dtype)
        ref = softmax_router_ref(logits[0], SOFTMAX_TOP_K, x.dtype)
        differing = (ours[0].sort(1).values != ref[0].sort(1).values).any(1).sum().item()  # (ties only)
        torch_us = time_calls([partial(routed, softmax_router_ref, x[r], weight) for r in range(rotations)]) * 1e6
        both_us = time_calls([partial(routed, softmax_router, x[r], weight) for r in range(rotations)]) * 1e6
        kernel_us = time_calls([partial(softmax_router, logits[r], SOFTMAX_TOP_K, x.dtype)
                                for r in range(rotations)]) * 1e6
        bound_us = (logits[0].nbytes + tokens * SOFTMAX_TOP_K * (8 + 2)) / copy_bw * 1e6
        print(f"| {tokens} | {torch_us:.1f} | {both_us:.1f} | {torch_us / both_us:.2f} | {kernel_us:.1f} "
              f"| {bound_us:.2f} | {bound_us / kernel_us:.0%} | {differing} of {tokens} |", flush=True)


def parse_tile(text: str) -> tuple[int, int]:
    """"MxD" -> (BLOCK_M, CHUNK_D), checked: M a power of two >= 16, D a multiple of router.BLOCK_D."""
    try:
        block_m, chunk_d = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise SystemExit(f"--tiles takes MxD settings such as 32x128, got {text!r}") from None
    if block_m < 16 or block_m & (block_m - 1) or chunk_d < router.BLOCK_D or chunk_d % router.BLOCK_D:
        raise SystemExit(f"--tiles {text}: M must be a power of two >= 16 and D a multiple of {router.BLOCK_D}")
    return block_m, chunk_d


def time_tokens(token_counts: list[int], weight: torch.Tensor, bias: torch.Tensor, gen: torch.Generator,
                copy_bw: float) -> None:
    """The table of one setting: each token count's torch path and kernel forms, checked against each other."""
    print("| tokens | torch us | kernel us | x torch | one launch us | chunks us | bound us | % of bound "
          "| experts differing |\n|---|---|---|---|---|---|---|---|---|")
    for tokens in token_counts:
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
