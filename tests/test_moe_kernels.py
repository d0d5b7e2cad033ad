"""The grouped (per-row-expert) linear kernel against its torch reference, and the block layout it runs on.

Without a GPU the kernel runs in Triton's interpreter (tests/conftest.py); outputs are NaN-poisoned."""

from __future__ import annotations

import pytest
import torch

from verify_kernels.moe import expert_blocks, grouped_linear, grouped_linear_ref

pytestmark = pytest.mark.usefixtures("nan_empty")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

CASES = {
    # rows R, experts E, out N, in K, how rows pick experts
    "one-row": (1, 4, 24, 40, "random"),
    "decode-7": (7, 9, 64, 16, "random"),
    "one-expert-many-blocks": (37, 4, 24, 40, "one"),
    "idle-experts": (33, 9, 130, 72, "two"),
    "ragged-100": (100, 6, 48, 130, "random"),
}


def routing(rows: int, experts: int, how: str, gen: torch.Generator) -> torch.Tensor:
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
    expert = routing(rows, experts, how, gen)
    y = grouped_linear(x.to(DEVICE), weight.to(DEVICE), expert.to(DEVICE)).cpu()
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(y.float(), grouped_linear_ref(x, weight, expert).float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_blocks_hold_every_row_once_under_its_expert(case):
    rows, experts, _, _, how = case
    expert = routing(rows, experts, how, torch.Generator().manual_seed(1))
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
