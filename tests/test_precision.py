"""verify_kernels/precision.py, the tf32x3 products from operands split by a mask: the split is exact (hi + lo = x,
hi's 13 low mantissa bits clear) and the three-product sum matches the float64 product within fp32-level error, with
TF32 products that truncate their operands as the tensor cores do (tests/conftest.py's tf32_products, in Triton's
interpreter); and the products with an operand exact in TF32 skip its remainder's products and sum to the same."""

import pytest
import torch
import triton
import triton.language as tl

from verify_kernels.precision import add_product_exact, dot_tf32x3, exact_in_tf32, tf32_split

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
def test_three_products_match_float64(tf32_products, scale):
    gen = torch.Generator().manual_seed(1)
    a = (torch.randn(32, 16, generator=gen) * scale).to(DEVICE)
    b = torch.randn(16, 32, generator=gen).to(DEVICE)
    c = (torch.randn(32, 32, generator=gen) * scale).to(DEVICE)
    expected = c.double() + a.double() @ b.double()
    product_kernel[(1,)](a, b, c, M=32, C=16, N=32)
    # fp32-level: within 2^-19 of the magnitudes summed (a TF32 product's lo keeps 10 bits: 2^-21 of each term)
    bound = 2.0 ** -19 * (a.double().abs() @ b.double().abs() + c.double().abs())
    assert ((c.double() - expected).abs() <= bound).all()


@triton.jit
def exact_product_kernel(a, b, c, out, M: tl.constexpr, C: tl.constexpr, N: tl.constexpr, A_EXACT: tl.constexpr,
                         B_EXACT: tl.constexpr):
    o_m, o_c, o_n = tl.arange(0, M), tl.arange(0, C), tl.arange(0, N)
    b_a = tl.load(a + o_m[:, None] * C + o_c[None, :]).to(tl.float32)
    b_b = tl.load(b + o_c[:, None] * N + o_n[None, :]).to(tl.float32)
    acc = tl.load(c + o_m[:, None] * N + o_n[None, :])
    tl.store(out + o_m[:, None] * N + o_n[None, :], add_product_exact(acc, b_a, b_b, "tf32x3-split", A_EXACT, B_EXACT))
    tl.store(c + o_m[:, None] * N + o_n[None, :], dot_tf32x3(b_a, b_b, acc))


@pytest.mark.parametrize(("a_dtype", "b_dtype"), [(torch.bfloat16, torch.float32), (torch.float32, torch.float16),
                                                  (torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32)])
def test_products_with_exact_operands_equal_the_three_products(tf32_products, a_dtype, b_dtype):
    """add_product_exact with the operands' exactness from their dtypes (exact_in_tf32): the products it skips are
    zeros, so the sum is the three-product sum bit for bit (TF32 products truncating as on the GPU)."""
    gen = torch.Generator().manual_seed(2)
    a = torch.randn(32, 16, generator=gen).to(a_dtype).to(DEVICE)
    b = torch.randn(16, 32, generator=gen).to(b_dtype).to(DEVICE)
    c = torch.randn(32, 32, generator=gen).to(DEVICE)
    out = torch.empty_like(c)
    exact_product_kernel[(1,)](a, b, c, out, M=32, C=16, N=32, A_EXACT=exact_in_tf32(a), B_EXACT=exact_in_tf32(b))
    assert torch.equal(out, c)  # (c now holds dot_tf32x3's sum)


def test_an_fp32_operand_taken_for_exact_loses_its_remainder(tf32_products):
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randn(32, 16, generator=gen).to(DEVICE), torch.randn(16, 32, generator=gen).to(DEVICE)
    c, out = torch.zeros(32, 32, device=DEVICE), torch.empty(32, 32, device=DEVICE)
    exact_product_kernel[(1,)](a, b, c, out, M=32, C=16, N=32, A_EXACT=True, B_EXACT=True)
    assert not torch.allclose(out, c, rtol=1e-5, atol=0)  # one TF32 product: ~2^-11 off the three-product sum
