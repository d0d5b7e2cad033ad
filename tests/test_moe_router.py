"""The sigmoid router's Triton kernel (verify_kernels/moe/router.py) against its torch reference (naive.py), in
Triton's interpreter without a GPU, TF32 products truncating as on the GPU (tests/conftest.py's tf32_products); and
the reference's group limits, which the kernel leaves to it."""

import pytest
import torch

from verify_kernels.moe import sigmoid_router_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

CASES = {
    # rows, hidden, experts, top-k, x dtype, weight dtype
    "nemotron-nano-experts-bf16-rows": (5, 200, 128, 6, torch.bfloat16, torch.float32),
    "bf16-weights-two-blocks": (17, 96, 128, 6, torch.bfloat16, torch.bfloat16),
    "fp32-rows": (37, 64, 16, 3, torch.float32, torch.float32),
    "experts-not-a-power-of-two": (9, 48, 24, 5, torch.bfloat16, torch.float32),
}


def inputs(rows: int, hidden: int, experts: int, x_dtype, w_dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, hidden, generator=gen).to(x_dtype).to(DEVICE)
    weight = (torch.randn(experts, hidden, generator=gen) * 0.1).to(w_dtype).to(DEVICE)
    bias = (torch.randn(experts, generator=gen) * 0.05).to(DEVICE)
    return x, weight, bias


def sorted_by_expert(index: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's experts in ascending order and their weights alike (the top-k order is unspecified)."""
    index, order = index.sort(dim=1)
    return index, weight.gather(1, order)


@pytest.mark.parametrize("one_launch", [True, False], ids=["one-launch", "chunks"])
@pytest.mark.parametrize("norm", [True, False], ids=["renormalised", "raw"])
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_router_matches_reference(tf32_products, nan_empty, case, norm, one_launch):
    from verify_kernels.moe import sigmoid_router

    rows, hidden, experts, top_k, x_dtype, w_dtype = case
    x, weight, bias = inputs(rows, hidden, experts, x_dtype, w_dtype)
    index, top_weight = sigmoid_router(x, weight, bias, top_k, norm, 2.5, one_launch=one_launch)
    ref_index, ref_weight = sigmoid_router_ref(x, weight, bias, top_k, 1, 1, norm, 2.5)
    assert index.dtype == torch.int64 and top_weight.dtype == torch.float32
    index, top_weight = sorted_by_expert(index, top_weight)
    ref_index, ref_weight = sorted_by_expert(ref_index, ref_weight)
    assert torch.equal(index, ref_index)
    torch.testing.assert_close(top_weight, ref_weight, atol=1e-6, rtol=1e-5)


def test_router_reads_strided_rows_and_no_rows(tf32_products):
    from verify_kernels.moe import sigmoid_router

    x, weight, bias = inputs(6, 64, 32, torch.bfloat16, torch.float32, seed=1)
    wide = torch.zeros(6, 80, dtype=x.dtype, device=DEVICE)
    wide[:, :64] = x
    assert torch.equal(sigmoid_router(wide[:, :64], weight, bias, 4, True, 1.0)[0],
                       sigmoid_router(x, weight, bias, 4, True, 1.0)[0])
    index, top_weight = sigmoid_router(x[:0], weight, bias, 4, True, 1.0)
    assert index.shape == (0, 4) and top_weight.shape == (0, 4)


def test_router_result_does_not_depend_on_the_launch_or_the_batch(tf32_products):
    """The one-launch and the chunked forms add the same products in the same order: a row's experts and weights
    are the same bit for bit whichever form, and whichever other rows share its batch."""
    from verify_kernels.moe import sigmoid_router

    x, weight, bias = inputs(19, 320, 64, torch.bfloat16, torch.float32, seed=3)
    index, top_weight = sigmoid_router(x, weight, bias, 6, True, 1.0, one_launch=False)
    one_index, one_weight = sigmoid_router(x, weight, bias, 6, True, 1.0, one_launch=True)
    assert torch.equal(one_index, index) and torch.equal(one_weight, top_weight)
    alone_index, alone_weight = sigmoid_router(x[5:8], weight, bias, 6, True, 1.0)
    assert torch.equal(alone_index, index[5:8]) and torch.equal(alone_weight, top_weight[5:8])


@pytest.mark.parametrize("one_launch", [True, False], ids=["one-launch", "chunks"])
def test_router_other_tiles_match_reference(tf32_products, monkeypatch, one_launch):
    """The settings benchmarks/moe_router.py --tiles may choose: 32 rows a program, chunks of three product steps."""
    from verify_kernels.moe import router

    monkeypatch.setattr(router, "BLOCK_M", 32)
    monkeypatch.setattr(router, "CHUNK_D", 3 * router.BLOCK_D)
    x, weight, bias = inputs(37, 200, 48, torch.bfloat16, torch.float32, seed=4)
    index, top_weight = router.sigmoid_router(x, weight, bias, 5, True, 1.5, one_launch=one_launch)
    ref_index, ref_weight = sigmoid_router_ref(x, weight, bias, 5, 1, 1, True, 1.5)
    index, top_weight = sorted_by_expert(index, top_weight)
    ref_index, ref_weight = sorted_by_expert(ref_index, ref_weight)
    assert torch.equal(index, ref_index)
    torch.testing.assert_close(top_weight, ref_weight, atol=1e-6, rtol=1e-5)


def test_router_bad_arguments_raise():
    from verify_kernels.moe import sigmoid_router

    x, weight, bias = inputs(4, 32, 16, torch.float32, torch.float32)
    with pytest.raises(ValueError, match="weight must be contiguous"):
        sigmoid_router(x, weight[:, :16], bias, 2, True, 1.0)
    with pytest.raises(ValueError, match="top_k"):
        sigmoid_router(x, weight, bias, 17, True, 1.0)
    with pytest.raises(ValueError, match="bias"):
        sigmoid_router(x, weight, bias[:8], 2, True, 1.0)
    with pytest.raises(ValueError, match="unit column stride"):
        sigmoid_router(x.t(), weight[:, :4].contiguous(), bias, 2, True, 1.0)


def test_reference_limits_the_choice_to_the_best_groups():
    """Four groups of four experts, two eligible: the chosen experts all lie in the two groups whose two best choices
    sum highest, and without the limit the same rows reach outside them."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(64, 8, generator=gen)
    weight = torch.randn(16, 8, generator=gen)
    bias = torch.zeros(16)
    index, _ = sigmoid_router_ref(x, weight, bias, 4, 4, 2, True, 1.0)
    scores = torch.sigmoid(x @ weight.t()).view(64, 4, 4)
    best_groups = scores.topk(2, dim=-1).values.sum(-1).topk(2, dim=-1).indices  # [64, 2]
    assert ((index // 4)[:, :, None] == best_groups[:, None, :]).any(-1).all()
    free, _ = sigmoid_router_ref(x, weight, bias, 4, 4, 4, True, 1.0)
    assert not ((free // 4)[:, :, None] == best_groups[:, None, :]).any(-1).all()


SOFTMAX_CASES = {
    # rows, experts, top-k, logits dtype
    "qwen3.5-35b-a3b-bf16": (21, 256, 8, torch.bfloat16),
    "fp32-logits": (5, 64, 4, torch.float32),
    "experts-not-a-power-of-two": (17, 60, 3, torch.bfloat16),
}


def distinct_logits(rows: int, experts: int, dtype, seed: int = 0) -> torch.Tensor:
    """Each row a permutation of distinct values exact in bf16 (k / 16): no ties, whose order torch leaves open."""
    gen = torch.Generator().manual_seed(seed)
    values = torch.stack([torch.randperm(experts, generator=gen) for _ in range(rows)]).float()
    return ((values - experts / 2) / 16).to(dtype).to(DEVICE)


@pytest.mark.parametrize("case", SOFTMAX_CASES.values(), ids=SOFTMAX_CASES.keys())
def test_softmax_router_matches_reference(nan_empty, case):
    from verify_kernels.moe import softmax_router, softmax_router_ref

    rows, experts, top_k, dtype = case
    logits = distinct_logits(rows, experts, dtype)
    index, top_weight = softmax_router(logits, top_k, dtype)
    ref_index, ref_weight = softmax_router_ref(logits, top_k, dtype)
    assert index.dtype == torch.int64 and top_weight.dtype == dtype
    index, top_weight = sorted_by_expert(index, top_weight)
    ref_index, ref_weight = sorted_by_expert(ref_index, ref_weight)
    assert torch.equal(index, ref_index)
    tol = 1e-6 if dtype == torch.float32 else 2**-7
    torch.testing.assert_close(top_weight.float(), ref_weight.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize(("block_m", "warps"), [(1, 1), (16, 4)])
def test_softmax_router_other_tiles_match_reference(monkeypatch, block_m, warps):
    """The settings benchmarks/moe_router.py --softmax-tiles may choose."""
    from verify_kernels.moe import router, softmax_router_ref

    monkeypatch.setattr(router, "SOFTMAX_BLOCK_M", block_m)
    monkeypatch.setattr(router, "SOFTMAX_WARPS", warps)
    logits = distinct_logits(19, 96, torch.bfloat16, seed=3)
    index, top_weight = sorted_by_expert(*router.softmax_router(logits, 5, torch.float32))
    ref_index, ref_weight = sorted_by_expert(*softmax_router_ref(logits, 5, torch.float32))
    assert torch.equal(index, ref_index)
    torch.testing.assert_close(top_weight, ref_weight, atol=1e-6, rtol=1e-5)


def test_softmax_router_reads_strided_rows_and_no_rows():
    from verify_kernels.moe import softmax_router

    logits = distinct_logits(6, 32, torch.bfloat16, seed=2)
    wide = torch.zeros(6, 40, dtype=logits.dtype, device=DEVICE)
    wide[:, :32] = logits
    assert torch.equal(softmax_router(wide[:, :32], 4, torch.float32)[0], softmax_router(logits, 4, torch.float32)[0])
    index, top_weight = softmax_router(logits[:0], 4, torch.bfloat16)
    assert index.shape == (0, 4) and top_weight.shape == (0, 4)
    with pytest.raises(ValueError, match="top_k"):
        softmax_router(logits, 33, torch.bfloat16)
    with pytest.raises(ValueError, match="unit column stride"):
        softmax_router(logits.t(), 2, torch.bfloat16)
