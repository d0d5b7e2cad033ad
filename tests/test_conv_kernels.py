"""The tree-aware causal conv1d Triton kernels (verify_kernels/conv/tree_conv.py) against their torch references
(verify_kernels/conv/naive.py): outputs of chains and random trees over committed histories, and the conv pool
after a commit. Without a GPU the kernels run in Triton's interpreter (tests/conftest.py) on few channels; the `gpu`
case uses Nemotron-3-Nano's conv width.

Outputs are NaN-poisoned (torch.empty returns NaN here); unowned pool slots and padding nodes' inputs hold NaN."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.reference_checks import NAN, PADDING_PARENT, TreeBatch, pad_nodes, tree_batches
from verify_kernels.conv import (
    causal_conv1d_tree,
    causal_conv1d_tree_ref,
    conv_commit,
    conv_commit_ref,
    conv_decode,
    conv_decode_ref,
    conv_window_sources,
    tree_conv,
    tree_conv_windows_ref,
)

# every output a kernel allocates starts as NaN: an element it forgets to write fails (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("nan_empty")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}




def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype
    assert torch.isfinite(actual).all(), "non-finite values in the output"
    tol = TOL[actual.dtype]
    torch.testing.assert_close(actual.float(), expected.float(), atol=tol, rtol=tol)


def conv_pool(gen: torch.Generator, B: int, D: int, W: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """conv_pool [B + 2, W - 1, D] with random histories at shuffled request slots (the last row's is zeros: a
    fresh request) and NaN in the spare slots; req_slots [B]."""
    req_slots = torch.randperm(B + 2, generator=gen)[:B]
    pool = torch.full((B + 2, W - 1, D), NAN)
    pool[req_slots] = torch.randn(B, W - 1, D, generator=gen)
    pool[req_slots[-1]] = 0.0
    return pool.to(DEVICE, dtype), req_slots.to(DEVICE)


def conv_layer(gen, D, W, with_bias, dtype=torch.float32):
    """weight [D, W] and bias [D] or None."""
    weight = torch.randn(D, W, generator=gen).to(DEVICE, dtype)
    bias = torch.randn(D, generator=gen).to(DEVICE, dtype) if with_bias else None
    return weight, bias


def trees(gen: torch.Generator, kind: str, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """parents [3, T] and num_nodes [3]: three chains or random trees with T, T // 2 (ragged: garbage parents at
    padding) and 0 nodes."""
    num_nodes = [T, T // 2, 0]
    rows = []
    for n in num_nodes:
        if kind == "chain":
            parents = list(range(-1, n - 1))
        else:
            parents = [int(torch.randint(-1, j, (1,), generator=gen)) for j in range(n)]
        rows.append(parents + [PADDING_PARENT] * (T - n))
    return torch.tensor(rows, device=DEVICE), torch.tensor(num_nodes, device=DEVICE)


# (width, tree, nodes, channels, bias, activation)
CONVS = {
    "W4-chain-T1": (4, "chain", 1, 37, True, "silu"),
    "W4-chain-T17-D200": (4, "chain", 17, 200, True, "silu"),
    "W4-tree-T33-no-bias": (4, "tree", 33, 37, False, "silu"),
    "W4-tree-T64-linear": (4, "tree", 64, 20, True, None),
    "W3-tree-T17-no-bias-linear": (3, "tree", 17, 37, False, None),
    "W2-tree-T3": (2, "tree", 3, 130, True, "silu"),
}


@pytest.fixture(params=["per-node", "per-row"])
def tree_conv_grid(request, monkeypatch):
    """The tree conv as a program per (row, node, channel block), or per (row, channel block) for all the row's
    nodes (tree_conv.ROWS, with small channel blocks so that rows span several): each set here, whatever the
    default."""
    monkeypatch.setattr(tree_conv, "ROWS", request.param == "per-row")
    if request.param == "per-row":
        monkeypatch.setattr(tree_conv, "ROWS_BLOCK_D", 32)
    return request.param


@pytest.mark.parametrize("case", CONVS.values(), ids=CONVS.keys())
def test_tree_conv_matches_reference(case, tree_conv_grid):
    W, kind, T, D, with_bias, activation = case
    gen = torch.Generator().manual_seed(T + W)
    parents, num_nodes = trees(gen, kind, T)
    pool, req_slots = conv_pool(gen, 3, D, W, torch.float32)
    weight, bias = conv_layer(gen, D, W, with_bias)
    x = pad_nodes(torch.randn(3, T, D, generator=gen), num_nodes.cpu()).to(DEVICE)
    y = causal_conv1d_tree(x, parents, num_nodes, pool, req_slots, weight, bias, activation)
    assert_close(y, causal_conv1d_tree_ref(x, parents, num_nodes, pool, req_slots, weight, bias, activation))


def test_tree_conv_of_strided_inputs_with_shared_sources(tree_conv_grid):
    """Either grid on x as the model has it (a channel split of a wider projection: strided rows and nodes) and
    window sources computed once for the step (StepContext.window_sources)."""
    gen = torch.Generator().manual_seed(1)
    T, D, W = 9, 40, 4
    parents, num_nodes = trees(gen, "tree", T)
    pool, req_slots = conv_pool(gen, 3, D, W, torch.float32)
    weight, bias = conv_layer(gen, D, W, True)
    x = torch.randn(3, T, 3 * D, generator=gen).to(DEVICE)[..., D : 2 * D]
    sources = conv_window_sources(parents, num_nodes, W)
    y = causal_conv1d_tree(x, parents, num_nodes, pool, req_slots, weight, bias, "silu", sources=sources)
    assert_close(y, causal_conv1d_tree_ref(x, parents, num_nodes, pool, req_slots, weight, bias, "silu"))


def test_tree_conv_of_strided_inputs_without_sources(tree_conv_grid):
    """Either grid on x as the model has it (strided rows and nodes), the windows walked in the kernel."""
    gen = torch.Generator().manual_seed(3)
    T, D, W = 5, 40, 4
    parents, num_nodes = trees(gen, "tree", T)
    pool, req_slots = conv_pool(gen, 3, D, W, torch.float32)
    weight, bias = conv_layer(gen, D, W, True)
    x = torch.randn(3, T, 3 * D, generator=gen).to(DEVICE)[..., D : 2 * D]
    y = causal_conv1d_tree(x, parents, num_nodes, pool, req_slots, weight, bias, "silu")
    assert_close(y, causal_conv1d_tree_ref(x, parents, num_nodes, pool, req_slots, weight, bias, "silu"))


def test_tree_conv_of_bf16_inputs_matches_reference(tree_conv_grid):
    """bf16 inputs, conv history and weights (the model dtype); fp32 inside, bf16 out."""
    gen = torch.Generator().manual_seed(2)
    T, D, W = 17, 37, 4
    parents, num_nodes = trees(gen, "tree", T)
    pool, req_slots = conv_pool(gen, 3, D, W, torch.bfloat16)
    weight, bias = conv_layer(gen, D, W, True, torch.bfloat16)
    x = pad_nodes(torch.randn(3, T, D, generator=gen), num_nodes.cpu()).to(DEVICE, torch.bfloat16)
    y = causal_conv1d_tree(x, parents, num_nodes, pool, req_slots, weight, bias, "silu")
    assert_close(y, causal_conv1d_tree_ref(x, parents, num_nodes, pool, req_slots, weight, bias, "silu"))


@settings(max_examples=10, deadline=None)
@given(batch=tree_batches(max_rows=3, max_nodes=10), W=st.sampled_from([2, 3, 4]), with_bias=st.booleans(),
       with_sources=st.booleans())
def test_tree_conv_of_random_trees_matches_reference(batch: TreeBatch, W, with_bias, with_sources):
    gen = torch.Generator().manual_seed(batch.seed)
    B, T, D = len(batch.rows), batch.num_tokens, 24
    parents, num_nodes = (t.to(DEVICE) for t in batch.tensors())
    pool, req_slots = conv_pool(gen, B, D, W, torch.float32)
    weight, bias = conv_layer(gen, D, W, with_bias)
    x = pad_nodes(torch.randn(B, T, D, generator=gen), num_nodes.cpu()).to(DEVICE)
    sources = conv_window_sources(parents, num_nodes, W) if with_sources else None
    y = causal_conv1d_tree(x, parents, num_nodes, pool, req_slots, weight, bias, "silu", sources=sources)
    assert_close(y, causal_conv1d_tree_ref(x, parents, num_nodes, pool, req_slots, weight, bias, "silu"))


def test_window_sources_of_a_hand_made_tree():
    #  history (h-3, h-2, h-1) ── 0 ── 1 ── 3
    #                              └─── 2
    sources = conv_window_sources(torch.tensor([[-1, 0, 0, 1, 7]]), torch.tensor([4]), 4)
    assert sources[0, :4].tolist() == [[-3, -2, -1], [-2, -1, 0], [-2, -1, 0], [-1, 0, 1]]
    # as the reference gathers them
    pool = torch.tensor([[[1.0], [2.0], [3.0]]])  # [R = 1, W - 1 = 3, D = 1]
    x = torch.tensor([[10.0, 11.0, 12.0, 13.0]])[..., None]
    windows = tree_conv_windows_ref(x, torch.tensor([[-1, 0, 0, 1]]), torch.tensor([4]), pool, torch.tensor([0]))
    history_or_node = torch.where(sources[0, :4] < 0, pool[0, :, 0][(3 + sources[0, :4]).clamp(0, 2)],
                                  x[0, sources[0, :4].clamp(min=0), 0])
    assert torch.equal(history_or_node, windows[0, :, 0, :3])


# per row, accepted root path of a chain of 8 nodes: nothing, fewer than W - 1, W - 1 (W = 4), longer than W - 1
PATHS = [[], [0], [0, 1, 2], [0, 1, 2, 3, 4, 5], [0, 1]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("W", [2, 3, 4], ids=lambda w: f"W{w}")
def test_conv_commit_matches_reference(W, dtype):
    """Every kind of path in one batch; the spare slots stay NaN."""
    gen = torch.Generator().manual_seed(W)
    B, T, D = len(PATHS), 8, 150
    pool, req_slots = conv_pool(gen, B, D, W, dtype)
    x = torch.randn(B, T, 2 * D, generator=gen).to(DEVICE, dtype)[..., :D]    # strided, as the model's split
    accepted = torch.full((B, T), -1)
    for b, path in enumerate(PATHS):
        accepted[b, : len(path)] = torch.tensor(path, dtype=torch.long)
    accepted, num_accepted = accepted.to(DEVICE), torch.tensor([len(p) for p in PATHS], device=DEVICE)
    ours, ref = pool.clone(), pool.clone()
    conv_commit(x, accepted, num_accepted, ours, req_slots)
    conv_commit_ref(x, accepted, num_accepted, ref, req_slots)
    torch.testing.assert_close(ours, ref, atol=0, rtol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("W", [2, 3, 4], ids=lambda w: f"W{w}")
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no-bias"])
def test_conv_decode_is_the_tree_conv_then_the_commit(W, dtype, with_bias):
    """Plain decoding's one kernel against its reference (the tree conv of one node, then its commit): outputs, a
    padding row's zeros (its input NaN, its window untouched), the updated windows; the spare slots stay NaN."""
    gen = torch.Generator().manual_seed(10 + W)
    B, D = 4, 300
    pool, req_slots = conv_pool(gen, B, D, W, dtype)
    weight, bias = conv_layer(gen, D, W, with_bias, dtype)
    x = torch.randn(B, 1, 2 * D, generator=gen).to(DEVICE, dtype)[..., :D]    # strided, as the model's split
    num_nodes = torch.tensor([1, 1, 0, 1], device=DEVICE)
    x[2] = NAN                                                                 # a padding row's input
    ours, ref = pool.clone(), pool.clone()
    y = conv_decode(x, num_nodes, ours, req_slots, weight, bias, "silu")
    expected = conv_decode_ref(x, num_nodes, ref, req_slots, weight, bias, "silu")
    assert_close(y, expected)
    assert (y[2] == 0).all()
    torch.testing.assert_close(ours, ref, atol=0, rtol=0, equal_nan=True)
    assert torch.equal(ours[req_slots[2]], pool[req_slots[2]])
    with pytest.raises(ValueError, match="one node per row"):
        conv_decode(x.expand(B, 2, D), num_nodes, ours, req_slots, weight)


def test_bad_arguments_raise():
    x, pool, slots = torch.zeros(1, 1, 8, device=DEVICE), torch.zeros(1, 3, 8, device=DEVICE), torch.zeros(
        1, dtype=torch.long, device=DEVICE)
    parents, num_nodes = torch.full((1, 1), -1, device=DEVICE), torch.ones(1, dtype=torch.long, device=DEVICE)
    weight = torch.zeros(8, 4, device=DEVICE)
    with pytest.raises(ValueError, match="activation"):
        causal_conv1d_tree(x, parents, num_nodes, pool, slots, weight, activation="gelu")
    with pytest.raises(ValueError, match="W in"):
        causal_conv1d_tree(x, parents, num_nodes, torch.zeros(1, 4, 8, device=DEVICE), slots, weight)
    with pytest.raises(ValueError, match="weight"):
        causal_conv1d_tree(x, parents, num_nodes, pool, slots, weight[:, :3].contiguous())
    with pytest.raises(ValueError, match="unit stride"):
        causal_conv1d_tree(torch.zeros(1, 1, 16, device=DEVICE)[..., ::2], parents, num_nodes, pool, slots, weight)


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE == "cpu", reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_nemotron_nano_conv_matches_reference(dtype):
    """conv_dim 6144 (64 heads x 64 + 2 x 8 groups x 128), W = 4, 64-node trees, then a commit."""
    gen = torch.Generator().manual_seed(3)
    T, D, W = 64, 6144, 4
    parents, num_nodes = trees(gen, "tree", T)
    pool, req_slots = conv_pool(gen, 3, D, W, dtype)
    weight, bias = conv_layer(gen, D, W, True, dtype)
    x = pad_nodes(torch.randn(3, T, D, generator=gen), num_nodes.cpu()).to(DEVICE, dtype)
    y = causal_conv1d_tree(x, parents, num_nodes, pool, req_slots, weight, bias, "silu")
    assert_close(y, causal_conv1d_tree_ref(x, parents, num_nodes, pool, req_slots, weight, bias, "silu"))
    accepted = torch.arange(T, device=DEVICE).expand(3, T).contiguous()
    num_accepted = torch.tensor([5, 1, 0], device=DEVICE)
    ours, ref = pool.clone(), pool.clone()
    conv_commit(x.nan_to_num(), accepted, num_accepted, ours, req_slots)
    conv_commit_ref(x.nan_to_num(), accepted, num_accepted, ref, req_slots)
    torch.testing.assert_close(ours, ref, atol=0, rtol=0, equal_nan=True)


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE == "cpu", reason="needs a CUDA device")
def test_qwen35_decode_conv_matches_reference():
    """Qwen3.5-9B's 8192 conv channels, W = 4, bf16, batch 256 with padding rows: plain decoding's one kernel."""
    gen = torch.Generator().manual_seed(4)
    B, D, W = 256, 8192, 4
    pool, req_slots = conv_pool(gen, B, D, W, torch.bfloat16)
    weight, _ = conv_layer(gen, D, W, False, torch.bfloat16)
    x = torch.randn(B, 1, D, generator=gen).to(DEVICE, torch.bfloat16)
    num_nodes = (torch.arange(B) % 7 != 3).long().to(DEVICE)
    ours, ref = pool.clone(), pool.clone()
    y = conv_decode(x, num_nodes, ours, req_slots, weight, None, "silu")
    assert_close(y, conv_decode_ref(x, num_nodes, ref, req_slots, weight, None, "silu"))
    torch.testing.assert_close(ours, ref, atol=0, rtol=0, equal_nan=True)
