"""Launch helpers shared by the glue kernels: a tensor's leading dims as rows of one stride, and warps per row."""

import torch
import triton

FLOAT_INPUTS = (torch.float32, torch.bfloat16, torch.float16)


def as_rows(name: str, x: torch.Tensor) -> torch.Tensor:
    """x [..., D] with unit channel stride -> a [rows, D] view (rows may be strided, e.g. a split or chunk of a
    projection's output). Never copies: a layout that cannot be viewed so is the caller's to make contiguous."""
    if x.dtype not in FLOAT_INPUTS:
        raise ValueError(f"{name} must be float32, bfloat16 or float16, got {x.dtype}")
    if x.stride(-1) != 1 and x.shape[-1] > 1:
        raise ValueError(f"{name} needs unit stride over its last dim, got strides {x.stride()}")
    try:
        return x.view(-1, x.shape[-1])
    except RuntimeError as error:
        raise ValueError(f"{name} {tuple(x.shape)} with strides {x.stride()} cannot be viewed as rows of one "
                         "stride; pass a contiguous tensor") from error


def check_vector(name: str, t: torch.Tensor, size: int | tuple[int, ...]) -> None:
    sizes = (size,) if isinstance(size, int) else size
    if t.dim() != 1 or t.shape[0] not in sizes or not t.is_contiguous():
        raise ValueError(f"{name} must be a contiguous vector of {' or '.join(map(str, sizes))}, got "
                         f"{tuple(t.shape)}")


TILE = 2048  # elements a program holds where it takes several rows or heads


def tile_rows(rows: int, block: int) -> int:
    """Rows (or heads) of `block` elements a program takes: one row of a wide tensor, several narrow ones up to
    TILE elements (fewer, smaller programs for narrow heads; and in Triton's interpreter, which runs programs one
    after another, far fewer)."""
    return max(1, min(triton.next_power_of_2(rows), TILE // block))


def row_warps(block: int) -> int:
    """Warps for a program that reduces `block` elements: 4 up to 2K, then 8, then 16 (about 8 to 16 elements a
    thread, so that bf16 rows load in 16-byte vectors)."""
    return 4 if block <= 2048 else 8 if block <= 8192 else 16
