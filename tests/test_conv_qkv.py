"""The Gated DeltaNet's conv with its q / k / v split fused in (verify_kernels/conv/conv_qkv.py) against the two ops'
references in turn (causal_conv1d_tree_ref / conv_decode_ref, then gdn_qkv_ref), fused (conv_qkv.FUSED, a sweep
candidate) and not (the two kernels). Without a GPU the kernels run in Triton's interpreter (tests/conftest.py).
Outputs are NaN-poisoned (torch.empty returns NaN here): an element the kernel forgets fails."""

import pytest
import torch

from tests.reference_checks import pad_nodes
from tests.test_conv_kernels import DEVICE, conv_layer, conv_pool, trees
from verify_kernels.conv import (
    GateInputs,
    QKVHeads,
    causal_conv1d_tree,
    causal_conv1d_tree_qkv,
    causal_conv1d_tree_qkv_ref,
    conv_decode_qkv,
    conv_decode_qkv_ref,
    conv_qkv,
    conv_window_sources,
    tree_conv,
)

pytestmark = pytest.mark.usefixtures("nan_empty")

HEADS = QKVHeads(H=2, K=16, HV=4, V=8)  # 96 channels: q 0-31, k 32-63, v 64-95
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


@pytest.fixture(params=["fused-32", "fused-16", "two-ops"])
def form(request, monkeypatch):
    """Fused with channel blocks of two key heads or of one (tree_conv.ROWS_BLOCK_D, decode_conv's BLOCK_D through
    conv_qkv), or the two kernels in turn."""
    monkeypatch.setattr(conv_qkv, "FUSED", request.param != "two-ops")
    block = 16 if request.param == "fused-16" else 32
    monkeypatch.setattr(tree_conv, "ROWS_BLOCK_D", block)
    monkeypatch.setattr(conv_qkv, "DECODE_BLOCK_D", block)
    return request.param


def assert_outputs(ours, theirs, tol):
    assert len(ours) == len(theirs)
    for a, e, name in zip(ours, theirs, ("q", "k", "v", "g", "beta")[:len(ours)], strict=True):
        assert a.shape == e.shape and a.dtype == e.dtype, name
        assert torch.isfinite(a).all(), f"{name}: non-finite values"
        torch.testing.assert_close(a.float(), e.float(), atol=tol, rtol=tol, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize(("kind", "dtype", "qk_dtype", "qk_storage"),
                         [("chain", torch.float32, None, None), ("tree", torch.bfloat16, torch.bfloat16, None),
                          ("tree", torch.bfloat16, torch.bfloat16, torch.float32)],
                         ids=["chain-fp32", "tree-bf16", "tree-bf16-keys-in-fp32"])
def test_tree_conv_qkv_matches_the_two_references(form, kind, dtype, qk_dtype, qk_storage):
    """Strided inputs (a split of a wider projection), ragged rows (NaN inputs at padding nodes, a row of none),
    window sources computed once for the step; q and k rounded to qk_dtype and stored in qk_storage."""
    gen = torch.Generator().manual_seed(5)
    T, D, W = 5, HEADS.channels, 4
    parents, num_nodes = trees(gen, kind, T)
    pool, req_slots = conv_pool(gen, 3, D, W, dtype)
    weight, _ = conv_layer(gen, D, W, False, dtype)
    x = pad_nodes(torch.randn(3, T, 2 * D, generator=gen), num_nodes.cpu()).to(DEVICE, dtype)[..., D:]
    sources = conv_window_sources(parents, num_nodes, W)
    args = (x, parents, num_nodes, pool, req_slots, weight, None, "silu")
    ours = causal_conv1d_tree_qkv(*args, sources, HEADS, 0.25, qk_dtype=qk_dtype, qk_storage=qk_storage)
    theirs = causal_conv1d_tree_qkv_ref(*args, None, HEADS, 0.25, qk_dtype=qk_dtype, qk_storage=qk_storage)
    assert ours[0].shape == (3, T, HEADS.H, HEADS.K) and ours[2].shape == (3, T, HEADS.HV, HEADS.V)
    assert_outputs(ours, theirs, TOL[qk_dtype or torch.float32])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_conv_qkv_matches_the_two_references_and_shifts_the_window(form, dtype):
    """One node a row (the last a padding row: zeros out, its window untouched), the window shifted in place."""
    gen = torch.Generator().manual_seed(6)
    D, W = HEADS.channels, 4
    pool, req_slots = conv_pool(gen, 3, D, W, dtype)
    weight, bias = conv_layer(gen, D, W, True, dtype)
    x = torch.randn(3, 1, D, generator=gen).to(DEVICE, dtype)
    num_nodes = torch.tensor([1, 1, 0], device=DEVICE)
    ref_pool = pool.clone()
    ours = conv_decode_qkv(x, num_nodes, pool, req_slots, weight, bias, "silu", HEADS, 0.5)
    theirs = conv_decode_qkv_ref(x, num_nodes, ref_pool, req_slots, weight, bias, "silu", HEADS, 0.5)
    assert_outputs(ours, theirs, TOL[torch.float32] if dtype == torch.float32 else 1e-2)
    torch.testing.assert_close(pool, ref_pool, rtol=0, atol=0, equal_nan=True)


def gate_inputs(gen, lead, dtype):
    """a and b as strided splits of one wider projection output [*lead, 2 HV + 3] (the merged z / b / a GEMM's),
    a few of a + dt_bias past softplus' threshold of 20, and A_log, dt_bias [HV]."""
    HV = HEADS.HV
    wide = torch.randn(*lead, 2 * HV + 3, generator=gen) * 3
    wide[..., HV] = 25.0  # a of head 0 past the threshold
    wide = wide.to(DEVICE, dtype)
    A_log = torch.randn(HV, generator=gen).to(DEVICE)
    dt_bias = torch.randn(HV, generator=gen).to(DEVICE)
    return GateInputs(wide[..., 3 + HV:], wide[..., HV:2 * HV], A_log, dt_bias)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tree_conv_qkv_stores_the_gates_of_every_node(form, dtype):
    """With GateInputs the op also returns gdn_gates' g and beta [B, T, HV] fp32, padding nodes included, from the
    fused kernel (one launch) or from the gates' own kernel (two-ops), as gdn_gates_ref computes them."""
    gen = torch.Generator().manual_seed(15)
    T, D, W = 5, HEADS.channels, 4
    parents, num_nodes = trees(gen, "tree", T)
    pool, req_slots = conv_pool(gen, 3, D, W, dtype)
    weight, _ = conv_layer(gen, D, W, False, dtype)
    x = pad_nodes(torch.randn(3, T, D, generator=gen), num_nodes.cpu()).to(DEVICE, dtype)
    gates = gate_inputs(gen, (3, T), dtype)
    args = (x, parents, num_nodes, pool, req_slots, weight, None, "silu")
    ours = causal_conv1d_tree_qkv(*args, conv_window_sources(parents, num_nodes, W), HEADS, 0.25, gates=gates)
    theirs = causal_conv1d_tree_qkv_ref(*args, None, HEADS, 0.25, gates=gates)
    assert len(ours) == 5 and ours[3].shape == ours[4].shape == (3, T, HEADS.HV)
    assert ours[3].dtype == ours[4].dtype == torch.float32 and ours[3].is_contiguous()
    assert_outputs(ours, theirs, TOL[torch.float32] if dtype == torch.float32 else 1e-2)
    with pytest.raises(ValueError, match=r"the gates' a \(3, 4, 4\) must be \[3, 5, HV\]"):
        causal_conv1d_tree_qkv(*args, None, HEADS, 0.25, gates=gate_inputs(gen, (3, T - 1), dtype))


@pytest.mark.parametrize("T", [40, 57])
def test_a_prompt_longer_than_a_node_block_matches_the_references(T):
    """A prefill's rows (a prompt of T > tree_conv.ROWS_MAX_NODES tokens, a ragged row of T // 2, an empty one) are
    cut into node blocks of a program each, gates included; fused, bf16, sources from the parents walk."""
    gen = torch.Generator().manual_seed(T)
    D, W = HEADS.channels, 4
    parents, num_nodes = trees(gen, "chain", T)
    pool, req_slots = conv_pool(gen, 3, D, W, torch.bfloat16)
    weight, bias = conv_layer(gen, D, W, True, torch.bfloat16)
    x = pad_nodes(torch.randn(3, T, D, generator=gen), num_nodes.cpu()).to(DEVICE, torch.bfloat16)
    gates = gate_inputs(gen, (3, T), torch.bfloat16)
    args = (x, parents, num_nodes, pool, req_slots, weight, bias, "silu")
    ours = causal_conv1d_tree_qkv(*args, None, HEADS, 0.25, gates=gates)
    theirs = causal_conv1d_tree_qkv_ref(*args, None, HEADS, 0.25, gates=gates)
    assert T > tree_conv.ROWS_MAX_NODES
    assert_outputs(ours, theirs, 1e-2)


def test_prompt_lengths_share_the_compiled_kernels(monkeypatch):
    """The rows kernels take the nodes per row as a runtime argument: prompts of 40 and 57 tokens launch them with
    the same compile-time arguments (as a constexpr, each new prompt length compiled them anew on a GPU: seconds of
    a request's prefill), and only the node block, at most ROWS_MAX_NODES, follows the step's width."""
    launches = {}

    class Recorder:
        def __init__(self, name, kernel):
            self.name, self.kernel = name, kernel

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launches.setdefault(self.name, []).append(kwargs)
                return self.kernel[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(conv_qkv, "conv_tree_qkv_kernel", Recorder("qkv", conv_qkv.conv_tree_qkv_kernel))
    monkeypatch.setattr(tree_conv, "causal_conv1d_tree_rows_kernel",
                        Recorder("conv", tree_conv.causal_conv1d_tree_rows_kernel))
    gen = torch.Generator().manual_seed(3)
    D, W = HEADS.channels, 4
    for T in (40, 57, 5):
        parents, num_nodes = trees(gen, "chain", T)
        pool, req_slots = conv_pool(gen, 3, D, W, torch.float32)
        weight, _ = conv_layer(gen, D, W, False)
        x = pad_nodes(torch.randn(3, T, D, generator=gen), num_nodes.cpu()).to(DEVICE)
        causal_conv1d_tree_qkv(x, parents, num_nodes, pool, req_slots, weight, None, "silu", None, HEADS, 0.25)
        causal_conv1d_tree(x, parents, num_nodes, pool, req_slots, weight, None, "silu")
    assert set(launches) == {"qkv", "conv"}
    for name, calls in launches.items():
        assert len(calls) == 3, name
        assert calls[0] == calls[1], name  # 40 and 57 tokens: the same compiled kernel
        assert calls[0]["BT"] == tree_conv.ROWS_MAX_NODES and calls[2]["BT"] == 8, name
        assert "T" not in calls[0], name


def test_decode_conv_qkv_stores_the_gates(form):
    """One node a row, the last a padding row (its gates computed all the same), bf16 projections."""
    gen = torch.Generator().manual_seed(16)
    D, W = HEADS.channels, 4
    pool, req_slots = conv_pool(gen, 3, D, W, torch.bfloat16)
    weight, bias = conv_layer(gen, D, W, True, torch.bfloat16)
    x = torch.randn(3, 1, D, generator=gen).to(DEVICE, torch.bfloat16)
    num_nodes = torch.tensor([1, 1, 0], device=DEVICE)
    gates = gate_inputs(gen, (3, 1), torch.bfloat16)
    ref_pool = pool.clone()
    ours = conv_decode_qkv(x, num_nodes, pool, req_slots, weight, bias, "silu", HEADS, 0.5, gates=gates)
    theirs = conv_decode_qkv_ref(x, num_nodes, ref_pool, req_slots, weight, bias, "silu", HEADS, 0.5, gates=gates)
    assert_outputs(ours, theirs, 1e-2)
    torch.testing.assert_close(ours[3], theirs[3], rtol=1e-6, atol=1e-6)  # the gates themselves in fp32
    torch.testing.assert_close(pool, ref_pool, rtol=0, atol=0, equal_nan=True)


def test_heads_that_no_channel_block_holds_take_the_two_ops(monkeypatch):
    """Three key heads (48 channels of q) do not split into blocks of 32: the fused launch is not taken, and the
    result is the two ops'."""
    monkeypatch.setattr(conv_qkv, "FUSED", True)
    monkeypatch.setattr(tree_conv, "ROWS_BLOCK_D", 32)
    heads = QKVHeads(H=3, K=16, HV=2, V=16)
    assert conv_qkv.fused_block(heads, 32) is None and conv_qkv.fused_block(HEADS, 32) == 32
    gen = torch.Generator().manual_seed(7)
    T, D, W = 4, heads.channels, 4
    parents, num_nodes = trees(gen, "chain", T)
    pool, req_slots = conv_pool(gen, 3, D, W, torch.float32)
    weight, bias = conv_layer(gen, D, W, True)
    x = pad_nodes(torch.randn(3, T, D, generator=gen), num_nodes.cpu()).to(DEVICE)
    args = (x, parents, num_nodes, pool, req_slots, weight, bias, "silu", None, heads, 1.0)
    assert_outputs(causal_conv1d_tree_qkv(*args), causal_conv1d_tree_qkv_ref(*args), 1e-5)
    with pytest.raises(ValueError, match="the conv has 128 channels, the heads"):
        causal_conv1d_tree_qkv(*args[:9], HEADS, 1.0)


def test_fused_values_are_the_two_kernels_values(monkeypatch):
    """bf16 inputs, q and k kept in fp32: the fused kernel rounds the conv output to bf16 before the split, as the
    two ops do by storing it, so the two forms agree to fp32 rounding (unrounded they would differ by ~1e-3)."""
    gen = torch.Generator().manual_seed(8)
    T, D, W = 5, HEADS.channels, 4
    parents, num_nodes = trees(gen, "tree", T)
    pool, req_slots = conv_pool(gen, 3, D, W, torch.bfloat16)
    weight, bias = conv_layer(gen, D, W, True, torch.bfloat16)
    x = pad_nodes(torch.randn(3, T, D, generator=gen), num_nodes.cpu()).to(DEVICE, torch.bfloat16)
    args = (x, parents, num_nodes, pool, req_slots, weight, bias, "silu", None, HEADS, 0.25)
    monkeypatch.setattr(tree_conv, "ROWS_BLOCK_D", 32)
    two_ops = causal_conv1d_tree_qkv(*args)
    monkeypatch.setattr(conv_qkv, "FUSED", True)
    assert_outputs(causal_conv1d_tree_qkv(*args), two_ops, 1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE == "cpu", reason="needs a CUDA device")
@pytest.mark.parametrize("fused", [False, True], ids=["two-ops", "fused"])
def test_qwen35_conv_qkv_matches_the_two_references(fused, monkeypatch):
    """Qwen3.5-9B's heads (16 key heads of 128, 32 value heads of 128: 8192 channels), bf16, at the launchers' own
    channel blocks: 5-node chains (ragged rows) and plain decoding's one node a row at batch 256 (padding rows)."""
    monkeypatch.setattr(conv_qkv, "FUSED", fused)
    heads = QKVHeads(16, 128, 32, 128)
    gen = torch.Generator().manual_seed(9)
    D, W = heads.channels, 4
    parents, num_nodes = trees(gen, "chain", 5)
    pool, req_slots = conv_pool(gen, 3, D, W, torch.bfloat16)
    weight, _ = conv_layer(gen, D, W, False, torch.bfloat16)
    x = pad_nodes(torch.randn(3, 5, D, generator=gen), num_nodes.cpu()).to(DEVICE, torch.bfloat16)
    args = (x, parents, num_nodes, pool, req_slots, weight, None, "silu")
    split = dict(heads=heads, q_scale=128**-0.5, qk_dtype=torch.bfloat16)
    assert_outputs(causal_conv1d_tree_qkv(*args, conv_window_sources(parents, num_nodes, W), **split),
                   causal_conv1d_tree_qkv_ref(*args, None, **split), 1e-2)
    B = 256
    pool, req_slots = conv_pool(gen, B, D, W, torch.bfloat16)
    x = torch.randn(B, 1, D, generator=gen).to(DEVICE, torch.bfloat16)
    one = (torch.arange(B) % 7 != 3).long().to(DEVICE)
    ours, ref = pool.clone(), pool.clone()
    assert_outputs(conv_decode_qkv(x, one, ours, req_slots, weight, None, "silu", **split, qk_storage=torch.float32),
                   conv_decode_qkv_ref(x, one, ref, req_slots, weight, None, "silu", **split,
                                       qk_storage=torch.float32), 1e-2)
    torch.testing.assert_close(ours, ref, rtol=0, atol=0, equal_nan=True)
