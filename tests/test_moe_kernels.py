"""The MoE kernels against their torch references: the fused routed experts (moe_experts, on the block layout of
expert_layout) and the per-row-expert linear map (grouped_linear, the unfused path the benchmark compares with).

Without a GPU the kernels run in Triton's interpreter (tests/conftest.py) at small sizes; outputs and scratch
(h, y, the layout's int32 tables) are NaN- / max-int-poisoned, so a slot the kernels read without writing fails.
The gpu-marked cases run Nemotron-3-Nano's and Qwen3.5-35B-A3B's expert sizes, bitwise run-to-run equality and a
CUDA-graph replay on a new routing."""

from __future__ import annotations

import pytest
import torch

import verify_kernels.moe.routing as routing
from verify_kernels.moe import (
    ExpertsConfig,
    GemmConfig,
    expert_blocks,
    expert_layout,
    grouped_linear,
    grouped_linear_ref,
    moe_experts,
    moe_experts_ref,
)

pytestmark = pytest.mark.usefixtures("nan_empty")
CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def top_experts(tokens: int, experts: int, k: int, how: str, gen: torch.Generator) -> torch.Tensor:
    """[tokens, k] distinct experts a token. random: uniform; few: experts 0 .. k only (the rest idle), one: every
    token the same k experts 0, E - 1, 1, 2, ... (with k = 1: one expert takes every row)."""
    if how == "one":
        return torch.tensor([0, experts - 1, *range(1, k - 1)][:k]).expand(tokens, k).contiguous()
    pool = k + 1 if how == "few" else experts
    return torch.stack([torch.randperm(pool, generator=gen)[:k] for _ in range(tokens)])


def experts_inputs(tokens, experts, k, dim, inner, gated, how, dtype, seed=0, device="cpu", weight_dtype=None):
    """x, first, second, top_index, top_weight; top_weight in weight_dtype (default: dtype)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, dim, generator=gen)
    first = torch.randn(experts, 2 * inner if gated else inner, dim, generator=gen) / dim**0.5
    second = torch.randn(experts, dim, inner, generator=gen) / inner**0.5
    top_index = top_experts(tokens, experts, k, how, gen)
    top_weight = torch.rand(tokens, k, generator=gen)
    x, first, second = (t.to(device=device, dtype=dtype) for t in (x, first, second))
    return x, first, second, top_index.to(device), top_weight.to(device=device, dtype=weight_dtype or dtype)


def check_experts(args, activation, gated, config=None):
    out = moe_experts(*args, activation, gated, config)
    assert out.dtype == args[4].dtype and not out.isnan().any()
    ref = moe_experts_ref(*args, activation, gated).float()
    # an element's error scales with its row's terms, not its own value: the k experts' outputs, each rounded to x's
    # dtype, may cancel to a small sum (H200, Nemotron-3-Nano sizes, 256 tokens: 0.023 off at 0.118 in a row of mean
    # |value| 1.42, under 1.5 bf16 steps of its ~4-sized terms), so the bound is tol (|ref| + the row's mean |ref|)
    tol = TOL[args[0].dtype]
    bound = tol * (ref.abs() + ref.abs().mean(dim=-1, keepdim=True))
    error = (out.float() - ref).abs()
    worst = (error / bound).max().item()
    assert worst <= 1.0, f"{(error > bound).sum().item()} elements past tol (|ref| + row mean |ref|): {worst:.2f}x"


EXPERT_CASES = {
    # tokens, experts, k, D, I, gated, activation, routing
    "decode-1-k1": (1, 4, 1, 40, 24, False, "relu2", "random"),
    "decode-5-k2-gated": (5, 8, 2, 32, 16, True, "silu", "random"),
    "ragged-37-k6": (37, 16, 6, 40, 24, False, "relu2", "random"),
    "ragged-19-k8-gated": (19, 12, 8, 48, 20, True, "silu", "random"),
    "idle-experts-k2": (23, 12, 2, 32, 16, False, "relu2", "few"),
    "one-expert-every-row": (45, 6, 1, 32, 16, True, "silu", "one"),
    "gelu": (9, 4, 2, 24, 16, False, "gelu", "random"),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", EXPERT_CASES.values(), ids=EXPERT_CASES.keys())
def test_moe_experts_match_reference(case, dtype):
    """Plain (Nemotron-H) experts take fp32 routing weights, as its router gives; gated (Qwen3.5) ones x's dtype."""
    tokens, experts, k, dim, inner, gated, activation, how = case
    weight_dtype = dtype if gated else torch.float32
    args = experts_inputs(tokens, experts, k, dim, inner, gated, how, dtype, device=DEVICE, weight_dtype=weight_dtype)
    check_experts(args, activation, gated)


SMALL_TILES = ExpertsConfig(16, GemmConfig(16, 16, 4, 2), GemmConfig(16, 16, 4, 2))
WIDE_BLOCKS = ExpertsConfig(32, GemmConfig(32, 32, 4, 2), GemmConfig(64, 16, 4, 2))


@pytest.mark.parametrize("config", [SMALL_TILES, WIDE_BLOCKS], ids=["bm16-tiles16", "bm32"])
@pytest.mark.parametrize("gated", [False, True], ids=["plain", "gated"])
def test_tiles_steps_and_chunked_layout(config, gated, monkeypatch):
    """Several column tiles and K steps (D, I multiples of the tiles and not), an expert over several blocks, and
    the two-launch layout (chunks of 16 assignments)."""
    monkeypatch.setattr(routing, "MAX_CHUNK", 16)
    args = experts_inputs(21, 5, 3, 48, 40, gated, "random", torch.bfloat16, seed=5, device=DEVICE)
    check_experts(args, "silu" if gated else "relu2", gated, config)


LAYOUTS = {
    # tokens, experts, k, routing, block_m
    "decode": (1, 128, 6, "random", 16),
    "one-chunk": (16, 9, 3, "random", 16),
    "chunks": (120, 16, 4, "random", 64),
    "idle": (70, 64, 2, "few", 16),
    "one-expert": (50, 7, 1, "one", 16),
}


@pytest.mark.parametrize("max_chunk", [256, 16], ids=["chunk256", "chunk16"])
@pytest.mark.parametrize("case", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_layout_holds_every_assignment_once_under_its_expert(case, max_chunk, monkeypatch):
    monkeypatch.setattr(routing, "MAX_CHUNK", max_chunk)
    tokens, experts, k, how, bm = case
    top_index = top_experts(tokens, experts, k, how, torch.Generator().manual_seed(1))
    layout = expert_layout(top_index.to(DEVICE), experts, bm)
    rows, owner, filled = (t.cpu() for t in (layout.sorted_rows, layout.block_expert, layout.block_rows))
    assert owner.shape[0] == routing.num_blocks(tokens * k, experts, bm)   # static: sizes only
    expert = top_index.flatten()
    used = owner >= 0
    assert (filled[~used] == 0).all() and (filled[used] >= 1).all() and (filled <= bm).all()
    assert used[:used.sum()].all(), "unused blocks come last"
    assert (owner[used].diff() >= 0).all(), "blocks in expert order"
    slots = torch.cat([rows[b * bm:b * bm + n] for b, n in enumerate(filled.tolist())]).long()
    assert sorted(slots.tolist()) == list(range(tokens * k))
    assert (expert[slots] == owner.repeat_interleave(filled)).all()
    assert slots.tolist() == sorted(slots.tolist(), key=lambda a: (expert[a].item(), a)), "assignment order"


def test_moe_experts_bad_arguments_raise():
    x, first, second, top_index, top_weight = experts_inputs(3, 4, 2, 16, 8, True, "random", torch.float32)
    with pytest.raises(ValueError, match="do not fit"):
        moe_experts(x, first, second, top_index, top_weight, "silu", gated=False)
    with pytest.raises(ValueError, match="share one of"):
        moe_experts(x, first.double(), second, top_index, top_weight, "silu", gated=True)
    with pytest.raises(ValueError, match=r"\[N, k\]"):
        moe_experts(x, first, second, top_index[:2], top_weight, "silu", gated=True)
    with pytest.raises(ValueError, match="unsupported activation"):
        moe_experts(x, first, second, top_index, top_weight, "tanh", gated=True)


# ------------------------------------------------------------------------------------- the per-row-expert linear

CASES = {
    # rows R, experts E, out N, in K, how rows pick experts
    "one-row": (1, 4, 24, 40, "random"),
    "decode-7": (7, 9, 64, 16, "random"),
    "one-expert-many-blocks": (37, 4, 24, 40, "one"),
    "idle-experts": (33, 9, 130, 72, "two"),
    "ragged-100": (100, 6, 48, 130, "random"),
}


def routing_of(rows: int, experts: int, how: str, gen: torch.Generator) -> torch.Tensor:
    if how == "one":
        return torch.full((rows,), experts - 1, dtype=torch.long)
    if how == "two":
        return torch.randint(0, 2, (rows,), generator=gen) * (experts - 1)  # experts 1 .. E-2 get nothing
    return torch.randint(0, experts, (rows,), generator=gen)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_grouped_linear_matches_reference(case, dtype):
    rows, experts, n, k, how = case
    gen = torch.Generator().manual_seed(rows * experts)
    x = torch.randn(rows, k, generator=gen).to(dtype)
    weight = (torch.randn(experts, n, k, generator=gen) / k**0.5).to(dtype)
    expert = routing_of(rows, experts, how, gen)
    y = grouped_linear(x.to(DEVICE), weight.to(DEVICE), expert.to(DEVICE)).cpu()
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(y.float(), grouped_linear_ref(x, weight, expert).float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_blocks_hold_every_row_once_under_its_expert(case):
    rows, experts, _, _, how = case
    expert = routing_of(rows, experts, how, torch.Generator().manual_seed(1))
    blocks = expert_blocks(expert, experts, block_m=4)
    assert blocks.block_expert.shape[0] == -(-rows // 4) + experts          # static: depends on R and E only
    layout = blocks.rows.view(-1, 4)
    real = layout < rows
    assert sorted(layout[real].tolist()) == list(range(rows))
    for block, owner in zip(layout.tolist(), blocks.block_expert.tolist(), strict=True):
        members = [row for row in block if row < rows]
        assert all(expert[row] == owner for row in members)
        assert (owner >= 0) == bool(members), "a block is used iff it holds rows"


def test_bad_arguments_raise():
    x, weight, expert = torch.zeros(3, 8), torch.zeros(2, 4, 8), torch.zeros(3, dtype=torch.long)
    with pytest.raises(ValueError, match="weight"):
        grouped_linear(x, torch.zeros(2, 4, 6), expert)
    with pytest.raises(ValueError, match="share one of"):
        grouped_linear(x, weight.double(), expert)
    with pytest.raises(ValueError, match="expert must be"):
        grouped_linear(x, weight, expert[:2])


# ------------------------------------------------------------------------------------------------- GPU sizes

# experts, k, D, I, gated, activation
MODELS = {
    "nemotron-3-nano": (128, 6, 2688, 1856, False, "relu2"),
    "qwen3.5-35b-a3b": (256, 8, 2048, 512, True, "silu"),
}
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("tokens", [1, 16, 256, 1280, 2048])
@pytest.mark.parametrize("model", MODELS.values(), ids=MODELS.keys())
def test_model_sizes_match_reference_and_repeat_bitwise(model, tokens):
    """bf16 at the models' expert sizes, every launch-parameter regime; a second call gives the same bits."""
    experts, k, dim, inner, gated, activation = model
    args = experts_inputs(tokens, experts, k, dim, inner, gated, "random", torch.bfloat16, seed=tokens,
                          device="cuda")
    check_experts(args, activation, gated)
    assert torch.equal(moe_experts(*args, activation, gated), moe_experts(*args, activation, gated))


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("model", MODELS.values(), ids=MODELS.keys())
def test_a_row_does_not_depend_on_the_other_rows(model):
    """Under one launch configuration a token's output is the same bits whatever else the step routes (so a
    verify step and a decode step of the same configuration agree on it)."""
    experts, k, dim, inner, gated, activation = model
    x, first, second, top_index, top_weight = experts_inputs(64, experts, k, dim, inner, gated, "random",
                                                             torch.bfloat16, seed=2, device="cuda")
    config = ExpertsConfig(16, GemmConfig(64, 128, 4, 4), GemmConfig(64, 128, 4, 4))
    full = moe_experts(x, first, second, top_index, top_weight, activation, gated, config)
    part = moe_experts(x[5:9], first, second, top_index[5:9], top_weight[5:9], activation, gated, config)
    assert torch.equal(full[5:9], part)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("model", MODELS.values(), ids=MODELS.keys())
def test_replays_in_a_cuda_graph_on_a_new_routing(model):
    experts, k, dim, inner, gated, activation = model
    x, first, second, top_index, top_weight = experts_inputs(48, experts, k, dim, inner, gated, "random",
                                                             torch.bfloat16, seed=3, device="cuda")
    moe_experts(x, first, second, top_index, top_weight, activation, gated)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = moe_experts(x, first, second, top_index, top_weight, activation, gated)
    new = experts_inputs(48, experts, k, dim, inner, gated, "few", torch.bfloat16, seed=4, device="cuda")
    for static, value in zip((x, top_index, top_weight), (new[0], new[3], new[4]), strict=True):
        static.copy_(value)
    graph.replay()
    expected = moe_experts_ref(x, first, second, top_index, top_weight, activation, gated)
    torch.testing.assert_close(out.float(), expected.float(), atol=2e-2, rtol=2e-2)
