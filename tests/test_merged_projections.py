"""Projections of one input merged into one GEMM after loading (specdec/models/merged.py): the Gated DeltaNet's four
z / b / a projections, attention's k / v and the gated MLPs' gate / up, on a tiny Qwen3.5 (dense and MoE) saved and
loaded through the real loader."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from specdec.models import load_model
from specdec.models.attention import GatedAttention
from specdec.models.gated_deltanet import GatedDeltaNet
from specdec.models.layers import GatedMLP
from specdec.models.merged import merge_linears, merged_outputs
from tests.tiny_models import qwen35_text_config, save_tiny


@pytest.fixture(scope="module", params=[False, True], ids=["dense", "moe"])
def model(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp("merged")
    save_tiny(qwen35_text_config(moe=request.param), directory, seed=5)
    return load_model(directory, device="cpu")


def test_loaded_projections_are_views_of_one_weight(model):
    gdn = [m for m in model.modules() if isinstance(m, GatedDeltaNet)]
    mlps = [m for m in model.modules() if isinstance(m, GatedMLP)]
    assert gdn and mlps  # (the MoE model's shared experts are gated MLPs)
    for layer in gdn:
        parts = layer.gate_projections()
        assert layer.in_proj_zba.shape == (sum(p.out_features for p in parts), parts[0].in_features)
        assert all(p.weight.untyped_storage().data_ptr() == layer.in_proj_zba.untyped_storage().data_ptr()
                   for p in parts)
    attention = [m for m in model.modules() if isinstance(m, GatedAttention)]
    assert attention and all(layer.kv is not None and layer.k_proj.weight.data_ptr() == layer.kv.data_ptr()
                             for layer in attention)
    for mlp in mlps:
        assert mlp.gate_up is not None and mlp.up_proj.weight.data_ptr() == (
            mlp.gate_up.data_ptr() + mlp.gate_proj.out_features * mlp.gate_up.stride(0) * mlp.gate_up.element_size())
    # the parameters keep the checkpoint's names, each stored once
    names = {name for name, _ in model.named_parameters()}
    assert any(name.endswith("linear_attn.in_proj_b.weight") for name in names)
    assert not any(name.endswith((".gate_up", ".in_proj_zba", ".kv")) for name in names)


def test_one_gemm_gives_each_projection(model, monkeypatch):
    layer = next(m for m in model.modules() if isinstance(m, GatedDeltaNet))
    x = torch.randn(3, 5, layer.in_proj_z.in_features, generator=torch.Generator().manual_seed(1))
    separate = [p(x) for p in layer.gate_projections()]
    calls = []
    linear = F.linear
    monkeypatch.setattr(F, "linear", lambda *args: calls.append(args[1].shape) or linear(*args))
    merged = merged_outputs(x, layer.in_proj_zba, layer.gate_projections())
    assert calls == [layer.in_proj_zba.shape], "one GEMM on the merged weight"
    for got, want in zip(merged, separate, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_weights_moved_after_the_merge_fall_back_to_one_gemm_each():
    linears = [nn.Linear(8, 4, bias=False), nn.Linear(8, 2, bias=False)]
    merged = merge_linears(linears)
    x = torch.randn(3, 8)
    want = [linear(x) for linear in linears]
    linears[1].weight = nn.Parameter(linears[1].weight.detach().clone() * 2)  # (no longer its view)
    got = merged_outputs(x, merged, linears)
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], 2 * want[1])


def test_merge_leaves_biased_projections_and_waits_for_real_weights():
    biased = [nn.Linear(8, 4), nn.Linear(8, 2)]
    weight = biased[0].weight
    assert merge_linears(biased) is None and biased[0].weight is weight
    with torch.device("meta"):
        on_meta = [nn.Linear(8, 4, bias=False), nn.Linear(8, 2, bias=False)]
    assert merge_linears(on_meta) is None and on_meta[0].weight.is_meta


def test_nemotron_attention_runs_one_qkv_gemm(tmp_path):
    from specdec.models.attention import PlainAttention
    from tests.tiny_models import nemotron_h_config

    save_tiny(nemotron_h_config(), tmp_path, seed=6)
    model = load_model(tmp_path, device="cpu")
    attention = [m for m in model.modules() if isinstance(m, PlainAttention)]
    assert attention and all(layer.qkv is not None and layer.v_proj.weight.untyped_storage().data_ptr()
                             == layer.qkv.untyped_storage().data_ptr() for layer in attention)


def test_weights_being_trained_get_their_gradients():
    linears = [nn.Linear(8, 4, bias=False), nn.Linear(8, 2, bias=False)]  # (requires_grad, as built)
    merged = merge_linears(linears)
    sum(out.sum() for out in merged_outputs(torch.randn(3, 8), merged, linears)).backward()
    assert all(linear.weight.grad is not None for linear in linears)
