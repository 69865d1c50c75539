"""FP4 (e2m1) operand tiles decoded in registers for a bf16 tensor-core dot, on GPUs without FP4
tensor cores (Hopper). Two block-scale formats:
- NVFP4: an e4m3 (UE4M3) scale per 16 codes (``GROUP=16``, ``E8M0=False``), the scales' tensor
  of dtype ``float8_e4m3fn``;
- MXFP4: a UE8M0 scale byte per 32 codes (``GROUP=32``, ``E8M0=True``), ``2 ** (byte - 127)``
  (byte 0 reads as 0 and 255 as inf, as an fp32 built from the byte's bits), uint8.

Codes are packed two a byte, the even element in the low nibble, the sign in bit 3. A decoded
value is exact in bf16 (two significant bits times a scale of at most four significant bits, a
power of two for UE8M0; inf past the range, as in fp32), so the tile holds
the codes' values exactly; on the GPU the decoding is the PTX byte-table lookups of
``E2M1_BF16_ASM``, in the interpreter an fp32 table (``_e2m1_scaled``): the same values.

The tile's K order is a fixed permutation of memory's within a ``BLOCK_K`` block (``tile_order``),
chosen so that the dot's register layout gives each lane contiguous bytes: both operands of the
dot must take it (decode both with ``dequant_tile``, or gather the other operand's K with
``tile_order``); the sum is then over the same terms.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Twice the e2m1 magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6} as 4-bit fields, code 0 lowest: 0xC8643210
# as a signed 32-bit constant. An arithmetic shift by 28 sign-extends, and the mask keeps 0xC.
E2M1_TWICE_TABLE = tl.constexpr(0xC8643210 - 2**32)


@triton.jit
def _e2m1_scaled(nib, half_scale):
    """An e2m1 code (int32, sign in bit 3) times its block scale, given as scale / 2: exact in fp32
    and in bf16 (two significant bits times four)."""
    twice = (E2M1_TWICE_TABLE >> ((nib & 7) * 4)) & 15
    mag = twice.to(tl.float32) * half_scale
    return tl.where((nib & 8) != 0, -mag, mag)


# Four bytes (eight codes) -> eight bf16 values times their block scales, in PTX. The magnitude
# (code & 7) indexes two 8-byte tables with ``prmt``: the high bytes of the bf16 values
# {0, .5, 1, 1.5, 2, 3, 4, 6} (00 3F 3F 3F 40 40 40 40) and their low bytes (00 00 80 C0 00 40 80
# C0). ``prmt``'s sign-replicate mode turns each code's sign bit into 0x00 / 0xFF, whose 0x80 goes
# into the high byte; four more ``prmt`` interleave low and high bytes into one (low nibble, high
# nibble) bf16 pair a byte, the two k of a tensor-core operand register, and one bf16x2 multiply a
# pair applies the byte's scale (exact: two significant bits times four).
# $0 .. $3: bytes 0 .. 3's pairs; $4: the four bytes; $5 $6: the four bytes' scales (bf16 pairs).
E2M1_BF16_ASM = tl.constexpr("""
{
.reg .b32 m, mh, rs, alo, ahi, blo, bhi, sa, sb, tl0, tl1, th0, th1, s0, s1, s2, s3;
and.b32 m, $4, 0x77777777;
shr.b32 mh, m, 16;
mov.b32 tl0, 0xC0800000;
mov.b32 tl1, 0xC0804000;
mov.b32 th0, 0x3F3F3F00;
mov.b32 th1, 0x40404040;
prmt.b32 alo, tl0, tl1, m;
prmt.b32 ahi, th0, th1, m;
prmt.b32 blo, tl0, tl1, mh;
prmt.b32 bhi, th0, th1, mh;
shl.b32 rs, $4, 4;
prmt.b32 sa, rs, $4, 0xD9C8;
prmt.b32 sb, rs, $4, 0xFBEA;
lop3.b32 ahi, ahi, sa, 0x80808080, 0xF8;
lop3.b32 bhi, bhi, sb, 0x80808080, 0xF8;
prmt.b32 $0, alo, ahi, 0x5140;
prmt.b32 $1, alo, ahi, 0x7362;
prmt.b32 $2, blo, bhi, 0x5140;
prmt.b32 $3, blo, bhi, 0x7362;
prmt.b32 s0, $5, $5, 0x1010;
prmt.b32 s1, $5, $5, 0x3232;
prmt.b32 s2, $6, $6, 0x1010;
prmt.b32 s3, $6, $6, 0x3232;
mul.rn.bf16x2 $0, $0, s0;
mul.rn.bf16x2 $1, $1, s1;
mul.rn.bf16x2 $2, $2, s2;
mul.rn.bf16x2 $3, $3, s3;
}
""")


@triton.jit
def tile_order(BLOCK_K: tl.constexpr):
    """int32 [BLOCK_K]: the element (offset in the block, in memory's order) at each position of a
    ``dequant_tile`` block. Position ``2 p + w`` is nibble ``w`` of tile byte ``p = 4 i + c``,
    which is memory byte ``c j + i`` (``j = BLOCK_K / 8``)."""
    t = tl.arange(0, BLOCK_K)
    p = t // 2
    return 2 * ((p % 4) * (BLOCK_K // 8) + p // 4) + t % 2


@triton.jit
def _scale_values(sf, UPCAST: tl.constexpr, E8M0: tl.constexpr):
    """Block scales as fp32 halves (UPCAST, for ``_e2m1_scaled``) or as bf16 (for the PTX)."""
    # one return: triton 3.9 type-checks every return of a function, the constexpr-dead ones too
    if E8M0:
        if UPCAST:
            v = (sf.to(tl.uint32) << 23).to(tl.float32, bitcast=True) * 0.5
        else:
            v = (sf.to(tl.int16) << 7).to(tl.bfloat16, bitcast=True)
    elif UPCAST:
        v = sf.to(tl.float32) * 0.5
    else:
        v = sf.to(tl.bfloat16)
    return v


@triton.jit
def dequant_tile(C, SF, rows, row_ok, k0, stride_c, stride_sf, BLOCK_K: tl.constexpr,
                 GROUP: tl.constexpr, E8M0: tl.constexpr, UPCAST: tl.constexpr):  # fmt: skip
    """Rows ``rows`` of an FP4 operand at k0 .. k0 + BLOCK_K (k0 a multiple of ``BLOCK_K`` and of
    ``GROUP``) as a [rows, BLOCK_K] tile in ``tile_order``: bf16 on the GPU, fp32 where PTX cannot
    run (UPCAST, the interpreter); rows not ``row_ok`` read as zeros."""
    r: tl.constexpr = rows.shape[0]
    nb: tl.constexpr = BLOCK_K // 2  # bytes a row
    j: tl.constexpr = nb // 4
    bpg: tl.constexpr = GROUP // 2  # bytes a scale
    # The block's bytes in memory as [4, j]; in the tile, byte (c, i) is k-pair i * 4 + c. The dot's
    # register layout gives a lane the k-pairs of one residue c, so a lane's bytes are contiguous.
    at = (tl.arange(0, 4)[:, None] * j + tl.arange(0, j)[None, :])[None, :, :]
    byte = tl.load(C + rows[:, None, None] * stride_c + k0 // 2 + at, mask=row_ok[:, None, None],
                   other=0)  # fmt: skip
    byte = tl.reshape(tl.permute(byte, (0, 2, 1)), (r, nb))
    # byte (c, i) takes scale (c j + i) // bpg: the [4, per_c] scales of the block, each repeated
    sf_row = SF + rows[:, None] * stride_sf + k0 // GROUP
    zero: tl.constexpr = 0 if E8M0 else 0.0  # (uint8 bytes, or e4m3 values)
    if j >= bpg:
        per_c: tl.constexpr = j // bpg
        sf = tl.load(sf_row + tl.arange(0, 4 * per_c)[None, :], mask=row_ok[:, None], other=zero)
        sf = tl.reshape(sf, (r, 4, per_c))
    else:  # a scale spans several c
        per_c: tl.constexpr = 1
        sf = tl.load(sf_row + ((tl.arange(0, 4) * j) // bpg)[None, :], mask=row_ok[:, None],
                     other=zero)  # fmt: skip
        sf = tl.reshape(sf, (r, 4, 1))
    sf = tl.broadcast_to(sf[:, :, :, None], (r, 4, per_c, j // per_c))
    sf = tl.reshape(tl.permute(tl.reshape(sf, (r, 4, j)), (0, 2, 1)), (r, nb))
    sf = _scale_values(sf, UPCAST, E8M0)
    if UPCAST:
        code = byte.to(tl.int32)
        lo = _e2m1_scaled(code & 15, sf)
        hi = _e2m1_scaled(code >> 4, sf)
    else:
        pair = tl.inline_asm_elementwise(E2M1_BF16_ASM, "=r,=r,=r,=r,r,r,r", [byte, sf],
                                         dtype=tl.int32, is_pure=True, pack=4)  # fmt: skip
        # the pair's halves (the compiler keeps them in the one register the dot reads)
        lo = (pair & 0xFFFF).to(tl.int16).to(tl.bfloat16, bitcast=True)
        hi = (pair >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
    return tl.reshape(tl.join(lo, hi), (r, BLOCK_K))
