"""GDN and Mamba2 chunked prefill through fla-core (GPU, bf16 / fp16 models) against the references, and when the
runtime takes them. fla is an optional dependency (the `bench` extra): the GPU comparison needs it installed."""

from __future__ import annotations

import sys

import pytest
import torch

from specdec.backend import chunk_prefill
from verify_kernels.fla_support import fla_available
from verify_kernels.gdn import gdn_chunk_prefill_fla, gdn_chunk_prefill_ref
from verify_kernels.mamba2 import mamba2_chunk_prefill_fla, mamba2_chunk_prefill_ref


def test_runtime_takes_fla_for_half_precision_triton_layers_only(monkeypatch):
    import verify_kernels.fla_support as fla_support

    monkeypatch.setattr(fla_support, "fla_available", lambda: True)
    assert chunk_prefill("gdn", "triton", torch.bfloat16) is gdn_chunk_prefill_fla
    assert chunk_prefill("gdn", "triton", torch.float16) is gdn_chunk_prefill_fla
    assert chunk_prefill("gdn", "triton", torch.float32) is gdn_chunk_prefill_ref  # fp32 models stay exact
    assert chunk_prefill("gdn", "reference", torch.bfloat16) is gdn_chunk_prefill_ref
    for dtype in (torch.bfloat16, torch.float16):  # (multiplying in the model's dtype)
        mamba2 = chunk_prefill("mamba2", "triton", dtype)
        assert (mamba2.func, mamba2.keywords) == (mamba2_chunk_prefill_fla, {"dtype": dtype})
    assert chunk_prefill("mamba2", "triton", torch.float32) is mamba2_chunk_prefill_ref
    assert chunk_prefill("mamba2", "reference", torch.float16) is mamba2_chunk_prefill_ref
    monkeypatch.setattr(fla_support, "fla_available", lambda: False)
    assert chunk_prefill("gdn", "triton", torch.bfloat16) is gdn_chunk_prefill_ref
    assert chunk_prefill("mamba2", "triton", torch.bfloat16) is mamba2_chunk_prefill_ref


def test_tests_hide_fla():
    assert not fla_available()  # tests/conftest.py: transformers' Qwen3.5 must not pick fla up


@pytest.fixture
def fla(monkeypatch):
    """fla itself, which tests/conftest.py hides from transformers (restored after the test)."""
    monkeypatch.delitem(sys.modules, "fla", raising=False)
    if not fla_available():
        pytest.skip("fla-core is not installed (pip install '.[bench]')")
    return __import__("fla")


CASES = {"T1-hv1": (1, 2, 2, False), "T63-hv2-state": (63, 2, 4, True), "T200-hv2-state": (200, 4, 8, True)}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="fla's kernels need a GPU")
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_fla_chunk_prefill_matches_reference(fla, case):
    T, H, HV, with_state = case
    gen = torch.Generator().manual_seed(T)
    B, K, V = 2, 128, 128
    q = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1) * K**-0.5
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    v = torch.randn(B, T, HV, V, generator=gen)
    g = -torch.rand(B, T, HV, generator=gen)
    beta = torch.rand(B, T, HV, generator=gen)
    state = torch.randn(B, HV, K, V, generator=gen) if with_state else None
    o_ref, final_ref = gdn_chunk_prefill_ref(q, k, v, g, beta, state)
    cuda = [x.cuda() for x in (q, k, v, g, beta)]
    o, final = gdn_chunk_prefill_fla(*cuda, None if state is None else state.cuda())
    for ours, expected in ((o.cpu(), o_ref), (final.cpu(), final_ref)):
        assert torch.isfinite(ours).all()
        assert (ours - expected).norm() / expected.norm() < 5e-3  # TF32 products inside fla


# (T, heads NH, groups NG, initial state, padded tail): Nemotron-3-Nano's head dim 64 and state 128
MAMBA2_CASES = {"T1": (1, 2, 1, False, 0), "T63-state": (63, 4, 2, True, 0), "T200-state-padded": (200, 8, 2, True, 37)}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="fla's kernels need a GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", MAMBA2_CASES.values(), ids=MAMBA2_CASES.keys())
def test_fla_mamba2_chunk_prefill_matches_reference(fla, case, dtype):
    T, NH, NG, with_state, padded = case
    gen = torch.Generator().manual_seed(T + NH)
    B, P, N = 2, 64, 128
    x = torch.randn(B, T, NH, P, generator=gen)
    dt = torch.nn.functional.softplus(torch.randn(B, T, NH, generator=gen) - 1.0)
    dt[1, T - padded:] = 0.0  # right padding of a ragged row: its state must end as at its last real token
    A, D = -torch.rand(NH, generator=gen) * 4.0, torch.randn(NH, generator=gen)
    Bm, C = (torch.randn(B, T, NG, N, generator=gen).to(dtype) for _ in range(2))  # (the model's dtype)
    state = torch.randn(B, NH, P, N, generator=gen) if with_state else None
    y_ref, final_ref = mamba2_chunk_prefill_ref(x, dt, A, Bm, C, D, state)
    cuda = [t.cuda() for t in (x, dt, A, Bm, C, D)]
    y, final = mamba2_chunk_prefill_fla(*cuda, None if state is None else state.cuda(), dtype=dtype)
    assert y.dtype == final.dtype == torch.float32
    for ours, expected in ((y.cpu(), y_ref), (final.cpu(), final_ref)):
        assert torch.isfinite(ours).all()
        assert (ours - expected).norm() / expected.norm() < 1e-2  # dt x rounded to the half dtype, half products
