"""Test-session set-up. Without a GPU, Triton kernels run in Triton's CPU interpreter; this must be decided before
any module that defines a kernel is imported, which is why it lives here. The same goes for fla: transformers'
Qwen3.5 picks fla's kernels whenever the package is installed (the `bench` extra), and those crash on the CPU and
compute in TF32 on the GPU, so the oracle would no longer be transformers' fp32 torch path. The tests hide it."""

import os
import sys

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.modules["fla"] = None  # `import fla` raises ImportError and importlib.util.find_spec("fla") is None

# pytest-xdist's workers (pyproject's addopts: -n 2) share the machine's cores: each takes its share of torch's threads,
# and so does each process a test starts (OMP_NUM_THREADS), rather than all of them contending for every core
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _workers > 1:
    _threads = max(1, (os.cpu_count() or 1) // _workers)
    os.environ.setdefault("OMP_NUM_THREADS", str(_threads))
    torch.set_num_threads(_threads)


@pytest.fixture
def nan_empty(monkeypatch):
    """torch.empty / torch.empty_like return NaN (bool: True, integers: their maximum), so an output element that a
    kernel does not write fails the comparison. Kernel test modules opt in with pytestmark."""
    empty, empty_like = torch.empty, torch.empty_like

    def poison(x: torch.Tensor) -> torch.Tensor:
        if x.is_floating_point():
            return x.fill_(float("nan"))
        return x.fill_(True if x.dtype == torch.bool else torch.iinfo(x.dtype).max)

    monkeypatch.setattr(torch, "empty", lambda *args, **kwargs: poison(empty(*args, **kwargs)))
    monkeypatch.setattr(torch, "empty_like", lambda *args, **kwargs: poison(empty_like(*args, **kwargs)))


@pytest.fixture
def tf32_products(monkeypatch):
    """In Triton's interpreter (no GPU), TF32 products truncate their fp32 operands to TF32 as the tensor cores do
    (the low 13 mantissa bits cleared) instead of multiplying in full fp32: a product that takes an fp32 operand for
    exact in TF32 (verify_kernels/precision.py, add_product_exact) then loses its remainder and fails its check. On a
    GPU the tensor cores do it themselves."""
    if torch.cuda.is_available():
        return
    import numpy as np
    from triton._C.libtriton import ir
    from triton.runtime.interpreter import InterpreterBuilder

    create_dot = InterpreterBuilder.create_dot

    def truncated(handle):
        if handle.data.dtype != np.float32:
            return handle
        bits = handle.data.view(np.uint32) & np.uint32(0xFFFFE000)
        return type(handle)(bits.view(np.float32), handle.dtype.scalar)

    def tf32_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if input_precision == ir.INPUT_PRECISION.TF32:
            a, b = truncated(a), truncated(b)
        return create_dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    monkeypatch.setattr(InterpreterBuilder, "create_dot", tf32_dot)
