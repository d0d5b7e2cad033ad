"""GDN chunked prefill through fla-core (GPU, bf16 / fp16 models) against the reference, and when the runtime
takes it. fla is an optional dependency (the `bench` extra): the GPU comparison needs it installed."""

from __future__ import annotations

import sys

import pytest
import torch

from specdec.backend import gdn_chunk_prefill
from verify_kernels.gdn import fla_available, gdn_chunk_prefill_fla, gdn_chunk_prefill_ref


def test_runtime_takes_fla_for_half_precision_triton_layers_only(monkeypatch):
    import verify_kernels.gdn as gdn

    monkeypatch.setattr(gdn, "fla_available", lambda: True)
    assert gdn_chunk_prefill("triton", torch.bfloat16) is gdn_chunk_prefill_fla
    assert gdn_chunk_prefill("triton", torch.float16) is gdn_chunk_prefill_fla
    assert gdn_chunk_prefill("triton", torch.float32) is gdn_chunk_prefill_ref  # fp32 models stay exact
    assert gdn_chunk_prefill("reference", torch.bfloat16) is gdn_chunk_prefill_ref
    monkeypatch.setattr(gdn, "fla_available", lambda: False)
    assert gdn_chunk_prefill("triton", torch.bfloat16) is gdn_chunk_prefill_ref


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
