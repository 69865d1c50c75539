"""Triton device functions shared by the quantizers and the GEMM epilogues.

Kernels that use ``rne_small`` must be launched with ``enable_fp_fusion=False``: the rounding adds
and subtracts 1.5 * 2**23, and a fused multiply-add would round the product only once.
"""

import triton
import triton.language as tl

# Smallest row absmax the row quantizers divide by: keeps 127 / absmax and 448 / absmax finite.
AMAX_FLOOR = 2.0**-100
RNE_MAGIC = 12582912.0  # 1.5 * 2**23: adding it rounds |v| < 2**22 to an integer (RNE)


@triton.jit
def rne_small(v):
    """Round fp32 ``v`` (|v| < 2**22) to the nearest integer, ties to even (as torch.round)."""
    return (v + 12582912.0) - 12582912.0


@triton.jit
def fp32_to_e4m3_bits(v):
    """Bits (uint8) of float8_e4m3fn nearest to fp32 ``v`` (|v| <= 448), ties to even.

    Integer arithmetic only, so the interpreter and the GPU agree (the interpreter's own fp8
    conversion does not round to nearest even).
    """
    bits = v.to(tl.uint32, bitcast=True)
    sign = (bits >> 24) & 0x80
    mag_bits = bits & 0x7FFFFFFF
    mag = mag_bits.to(tl.float32, bitcast=True)
    # normal e4m3 range: round the fp32 mantissa to 3 bits on the integer bits
    r = (mag_bits + (((mag_bits >> 20) & 1) + 0x7FFFF)) & 0xFFF00000
    exp8 = ((r >> 23) & 0xFF).to(tl.int32) - 120
    normal = ((exp8 << 3) | ((r >> 20) & 7).to(tl.int32)).to(tl.uint32)
    # subnormal range (below 2**-6): multiples of 2**-9, the integer count is the code
    sub = rne_small(mag * 512.0).to(tl.uint32)
    code = tl.where(mag < 0.015625, sub, normal)
    return (code | sign).to(tl.uint8)


@triton.jit
def e2m1_code_of_quotient(a, s, shift):
    """E2M1 magnitude code (0..7) of ``fl(a / s)``, the correctly rounded fp32 quotient, shifted
    left by ``shift`` (uint32, so that a caller can place it in a packed word), for fp32 ``a >= 0``
    (NaN gives 0) and ``s > 0`` an e4m3 value or +inf (code 0): the code that a division followed
    by the RNE thresholds 0.25 0.75 1.25 1.75 2.5 3.5 5 (ties to even: ``>`` at 0.25 1.25 2.5 5,
    ``>=`` at the others) gives, without the division.

    Each threshold t times s is exact in fp32 (t has at most 3 significant bits, s 4), and for
    fp32 ``a``, ``fl(a / s) > t`` iff ``a > t * s`` and ``fl(a / s) >= t`` iff ``a >= t * s``: the
    fp32 neighbours of t * s, divided by s, lie more than half an ulp of t from t (an ulp of
    t * s over s is at least ulp(t) / m with m < 2, and t * s is never a power of two for the
    ``>=`` thresholds), so rounding cannot carry them across. The code is found by a binary search
    on the block's seven products: three compares. ``s`` broadcasts against ``a``."""
    p4 = a >= 1.75 * s
    p2 = a >= tl.where(p4, 3.5 * s, 0.75 * s)
    t1 = tl.where(p4, tl.where(p2, 5.0 * s, 2.5 * s), tl.where(p2, 1.25 * s, 0.25 * s))
    one = tl.full(shift.shape, 1, tl.uint32) << shift
    return tl.where(p4, one << 2, 0) | tl.where(p2, one << 1, 0) | tl.where(a > t1, one, 0)


@triton.jit
def swiglu(gate, up):
    """SiLU(gate) * up in fp32 from fp32 operands (already rounded to the activation dtype)."""
    return gate / (1.0 + tl.exp(-gate)) * up


@triton.jit
def rne_int(s):
    """Round fp32 ``s`` (|s| < 2**22) to the nearest integer, ties to even, as int32: ``s + 1.5 *
    2**23`` lies where the fp32 spacing is 1, so the add rounds and the low mantissa bits are
    the integer. Two instructions. ``s`` must not be a bare product in a kernel compiled with fp
    fusion (the add would become an FMA); the quantizers pass a clamped value."""
    return (s + 12582912.0).to(tl.int32, bitcast=True) - 0x4B400000


@triton.jit
def quantize_tile(v, mask, FP8: tl.constexpr, NATIVE_FP8: tl.constexpr):
    """Per-row quantization of an fp32 [ROWS, BLOCK] tile (masked-out lanes ignored).

    Returns (codes [ROWS, BLOCK]: int8, or uint8 bits of e4m3; scales fp32 [ROWS]) following
    ``reference.quantize_rows``.
    """
    amax = tl.max(tl.where(mask, tl.abs(v), 0.0), axis=1)
    return quantize_tile_amax(v, amax, FP8, NATIVE_FP8)


@triton.jit
def row_scale(amax, FP8: tl.constexpr):
    """(scale, 1 / scale) of rows with absmax ``amax`` (floored at 2**-100): the code range's
    top (448 for e4m3, 127 for int8) maps to the absmax."""
    amax = tl.maximum(amax, 7.888609052210118e-31)  # 2**-100
    top = 448.0 if FP8 else 127.0
    return tl.div_rn(amax, top), tl.div_rn(tl.full(amax.shape, top, tl.float32), amax)


@triton.jit
def quantize_tile_amax(v, amax, FP8: tl.constexpr, NATIVE_FP8: tl.constexpr):
    """``quantize_tile`` given the rows' absmax (before the floor)."""
    scale, inv = row_scale(amax, FP8)
    if FP8:
        s = tl.minimum(tl.maximum(v * inv[:, None], -448.0), 448.0)
        if NATIVE_FP8:
            q = s.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
        else:
            q = fp32_to_e4m3_bits(s)
    else:
        s = tl.minimum(tl.maximum(v * inv[:, None], -127.0), 127.0)
        q = rne_int(s).to(tl.int8)
    return q, scale
