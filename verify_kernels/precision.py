"""fp32 products on the tensor cores at fp32-level error, by hand: Triton's input_precision="tf32x3" splits each fp32
operand into a TF32 high part and a remainder, rounding each to nearest with cvt.rna, which sm_90 has no instruction
for (its SASS: an add, a mask, an infinity test and a select, twice an element). The tensor cores' TF32 product
truncates its inputs instead, so a split by mask, hi = x with its 13 low mantissa bits cleared (exact in TF32) and
lo = x - hi (exact in fp32, truncated to its 10 high bits by the product), costs two instructions an element and
keeps the error of the three-product sum at fp32 level (~2^-21 relative: lo's truncation and the dropped lo.lo).
Finite operands only: an infinite x splits into inf and NaN.
"""

import triton
import triton.language as tl


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
