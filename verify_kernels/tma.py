"""Whether a kernel may read its tiles through Hopper's tensor memory accelerator (TMA): Triton's host tensor
descriptors (triton.tools.tensor_descriptor, in recent Triton releases) on a GPU of compute capability 9.0 or
later, or Triton's interpreter on CPU tensors (TRITON_INTERPRET=1, the tests). Elsewhere (an A100, an older Triton)
the kernels that default to TMA tiles fall back to their pointer loads, so one default serves every machine.
"""

import functools

import torch


@functools.cache
def host_descriptors() -> bool:
    """Triton's host tensor descriptors import."""
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def _device_has_tma(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def tma_usable(tensor: torch.Tensor) -> bool:
    """TMA tiles of `tensor` can be used where it lives (a CPU tensor: the interpreter)."""
    if not host_descriptors():
        return False
    if tensor.device.type == "cuda":
        return _device_has_tma(tensor.device.index if tensor.device.index is not None else torch.cuda.current_device())
    return tensor.device.type == "cpu"


def tile_descriptor(matrix: torch.Tensor, box: list[int]):
    """A host tensor descriptor of a 2-D view `matrix` read and written in `box`-shaped tiles (the kernels index its
    rows: a pool [S, ..., R, C] seen as [S ... R, C]). Made at each launch; a CUDA graph keeps the one of its capture
    (the pools never move)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor.from_tensor(matrix, box)
