"""verify_kernels/precision.py, the tf32x3 products from operands split by a mask: the split is exact (hi + lo = x,
hi's 13 low mantissa bits clear) and the three-product sum matches the float64 product. In Triton's interpreter the
TF32 products are exact fp32, so the last check holds the algebra; on a GPU, where they truncate lo, it bounds the
error at fp32 level (the kernels' sweeps check it there too)."""

import pytest
import torch
import triton
import triton.language as tl

from verify_kernels.precision import dot_tf32x3, tf32_split

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@triton.jit
def split_kernel(x, hi, lo, N: tl.constexpr):
    o = tl.arange(0, N)
    b_hi, b_lo = tf32_split(tl.load(x + o))
    tl.store(hi + o, b_hi)
    tl.store(lo + o, b_lo)


@triton.jit
def product_kernel(a, b, c, M: tl.constexpr, C: tl.constexpr, N: tl.constexpr):
    o_m, o_c, o_n = tl.arange(0, M), tl.arange(0, C), tl.arange(0, N)
    b_a = tl.load(a + o_m[:, None] * C + o_c[None, :])
    b_b = tl.load(b + o_c[:, None] * N + o_n[None, :])
    acc = tl.load(c + o_m[:, None] * N + o_n[None, :])
    tl.store(c + o_m[:, None] * N + o_n[None, :], dot_tf32x3(b_a, b_b, acc))


def test_split_is_exact_and_hi_fits_tf32():
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(256, generator=gen, dtype=torch.float64) * 10.0 ** torch.randint(-20, 20, (256,), generator=gen))
    x = x.float().to(DEVICE)
    hi, lo = torch.empty_like(x), torch.empty_like(x)
    split_kernel[(1,)](x, hi, lo, N=256)
    assert torch.equal((hi.double() + lo.double()).float(), x)
    assert torch.equal(hi.view(torch.int32) & 0x1FFF, torch.zeros_like(hi, dtype=torch.int32))
    assert (lo.abs() <= hi.abs() * 2.0 ** -10).all()


@pytest.mark.parametrize("scale", [1.0, 1e-20, 1e20])
def test_three_products_match_float64(scale):
    gen = torch.Generator().manual_seed(1)
    a = (torch.randn(32, 16, generator=gen) * scale).to(DEVICE)
    b = torch.randn(16, 32, generator=gen).to(DEVICE)
    c = (torch.randn(32, 32, generator=gen) * scale).to(DEVICE)
    expected = c.double() + a.double() @ b.double()
    product_kernel[(1,)](a, b, c, M=32, C=16, N=32)
    # fp32-level: within 2^-19 of the magnitudes summed (a TF32 product's lo keeps 10 bits: 2^-21 of each term)
    bound = 2.0 ** -19 * (a.double().abs() @ b.double().abs() + c.double().abs())
    assert ((c.double() - expected).abs() <= bound).all()
