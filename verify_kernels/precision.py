"""fp32 products on the tensor cores at fp32-level error, by hand: Triton's input_precision="tf32x3" splits each fp32
operand into a TF32 high part and a remainder, rounding each to nearest with cvt.rna, which sm_90 has no instruction
for (its SASS: an add, a mask, an infinity test and a select, twice an element). The tensor cores' TF32 product
truncates its inputs instead, so a split by mask, hi = x with its 13 low mantissa bits cleared (exact in TF32) and
lo = x - hi (exact in fp32, truncated to its 10 high bits by the product), costs two instructions an element and
keeps the error of the three-product sum at fp32 level (~2^-21 relative: lo's truncation and the dropped lo.lo).
Finite operands only: an infinite x splits into inf and NaN.

An operand that holds bf16 or fp16 values (a model's activations, loaded from a bf16 / fp16 tensor) is exact in TF32
(8 or 11 significant bits of TF32's 11): its remainder is zero, so one or two of the three products are zero.
add_product_exact skips them (the operands' exactness as constexprs: exact_in_tf32 of the tensors they come from):
two products where one operand is exact, one where both are; the sum is the three-product sum's, bit for bit (the
products skipped add zeros, in the same order).
"""

import torch
import triton
import triton.language as tl

EXACT_DTYPES = (torch.bfloat16, torch.float16)  # their values are exact in TF32


def exact_in_tf32(*tensors: torch.Tensor) -> bool:
    """Every tensor's values are exact in TF32: its dtype is bf16 or fp16 (the kernels load them as fp32)."""
    return all(t.dtype in EXACT_DTYPES for t in tensors)


@triton.jit
def tf32_split(x):
    """fp32 x -> (hi, lo), hi + lo = x, hi exact in TF32."""
    hi = (x.to(tl.uint32, bitcast=True) & 0xFFFFE000).to(tl.float32, bitcast=True)
    return hi, x - hi


@triton.jit
def dot_tf32x3(a, b, acc):
    """acc + a . b ([M, C] . [C, N], fp32) as three TF32 products of the split operands, the small ones first."""
    a_hi, a_lo = tf32_split(a)
    b_hi, b_lo = tf32_split(b)
    acc = tl.dot(a_lo, b_hi, acc, input_precision="tf32")
    acc = tl.dot(a_hi, b_lo, acc, input_precision="tf32")
    return tl.dot(a_hi, b_hi, acc, input_precision="tf32")


@triton.jit
def add_product(acc, a, b, PRECISION: tl.constexpr):
    """acc + a . b at PRECISION: one of tl.dot's ("ieee", "tf32x3", ...), each as acc + tl.dot(...), or
    "tf32x3-split", dot_tf32x3 accumulating into acc."""
    if PRECISION == "tf32x3-split":
        out = dot_tf32x3(a, b, acc)
    else:
        out = acc + tl.dot(a, b, input_precision=PRECISION)
    return out


@triton.jit
def add_product_exact(acc, a, b, PRECISION: tl.constexpr, A_EXACT: tl.constexpr, B_EXACT: tl.constexpr):
    """add_product where A_EXACT / B_EXACT say an operand's values are exact in TF32 (exact_in_tf32): with the split
    by mask, its remainder's products (zeros) are skipped; every other precision as add_product."""
    if PRECISION == "tf32x3-split" and A_EXACT and B_EXACT:
        out = tl.dot(a, b, acc, input_precision="tf32")
    elif PRECISION == "tf32x3-split" and B_EXACT:
        a_hi, a_lo = tf32_split(a)
        out = tl.dot(a_hi, b, tl.dot(a_lo, b, acc, input_precision="tf32"), input_precision="tf32")
    elif PRECISION == "tf32x3-split" and A_EXACT:
        b_hi, b_lo = tf32_split(b)
        out = tl.dot(a, b_hi, tl.dot(a, b_lo, acc, input_precision="tf32"), input_precision="tf32")
    else:
        out = add_product(acc, a, b, PRECISION)
    return out
