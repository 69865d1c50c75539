"""Small Triton device functions shared by kernels of every family."""

import triton
import triton.language as tl


@triton.jit
def cast_rne(x, dtype: tl.constexpr):
    """Cast fp32 ``x`` to ``dtype`` with round-to-nearest-even.

    For bfloat16 the rounding is done on the integer bits and the top half is the result: the
    GPU's own conversion rounds the same way, but Triton's CPU interpreter truncates (and flushes
    subnormals), and the kernels must give the same bits in both places. NaN gives the quiet NaN 0x7FC0 (as torch).
    """
    if dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) & 0xFFFF0000
        # A NaN must stay a NaN: the GPU's canonical NaN (0x7FFFFFFF) would carry into the sign
        # bit above and come out as -0.0.
        bits = tl.where(x != x, 0x7FC00000, bits)
        return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return x.to(dtype)


@triton.jit
def to_f32(x):
    """Exact upcast to fp32. bfloat16 goes through its bits (the interpreter mis-converts bfloat16
    subnormals; on the GPU both ways give the same value)."""
    if x.dtype == tl.bfloat16:
        bits = x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16
        return bits.to(tl.float32, bitcast=True)
    else:
        return x.to(tl.float32)


@triton.jit
def negate_f32(x):
    """-x for fp32 ``x`` by flipping the sign bit: ``-(+0.0)`` is ``-0.0`` (Triton's unary minus
    has lowered to ``0 - x`` on some versions, which gives ``+0.0``)."""
    return (x.to(tl.uint32, bitcast=True) ^ 0x80000000).to(tl.float32, bitcast=True)
