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
def grouped_tile(pid, m, n, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(row tile, column tile) of program ``pid`` in grouped order: GROUP_M row tiles walk the
    column tiles together, so the programs running at once share their operands in the L2."""
    tiles_m, tiles_n = tl.cdiv(m, BLOCK_M), tl.cdiv(n, BLOCK_N)
    width = GROUP_M * tiles_n
    first_m = (pid // width) * GROUP_M
    size_m = tl.minimum(tiles_m - first_m, GROUP_M)
    return first_m + (pid % width) % size_m, (pid % width) // size_m


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
def rounded_f32(x, dtype: tl.constexpr, NATIVE: tl.constexpr):
    """fp32 ``x`` rounded to ``dtype`` (round to nearest even), as fp32 values. ``NATIVE`` (on
    the GPU) uses its conversion, ``cvt.rn``: the same values in two instructions, where
    ``cast_rne``'s integer rounding takes about six (only a NaN's payload may differ, and the
    value stays a NaN); without it, ``cast_rne``, which the interpreter needs."""
    if NATIVE:
        return x.to(dtype).to(tl.float32)
    else:
        return to_f32(cast_rne(x, dtype))


@triton.jit
def negate_f32(x):
    """-x for fp32 ``x`` by flipping the sign bit: ``-(+0.0)`` is ``-0.0`` (Triton's unary minus
    has lowered to ``0 - x`` on some versions, which gives ``+0.0``)."""
    return (x.to(tl.uint32, bitcast=True) ^ 0x80000000).to(tl.float32, bitcast=True)


@triton.jit
def pairwise_row_sum(x):
    """Sum over axis 1 of a [ROWS, BLOCK] fp32 tile (BLOCK a power of two, at most 2**17) as a
    pairwise tree: adjacent pairs, then pairs of pairs. Every level adds exactly two operands, so
    the result's bits depend only on the values, never on the register layout the compiler picks
    for the tile (``tl.sum``'s order does: two kernels that load the same row with different
    vector widths -- say one storing bf16 and one int8 -- can round the same sum differently).
    Launch with ``enable_fp_fusion=False`` where ``x`` is a product that is not exact in fp32: the
    compiler may otherwise fuse it into a first-level add as an FMA, in a layout-dependent way."""
    for _ in tl.static_range(17):
        if x.shape[1] > 1:
            x = tl.sum(tl.reshape(x, [x.shape[0], x.shape[1] // 2, 2]), axis=2)
    return tl.reshape(x, [x.shape[0]])
