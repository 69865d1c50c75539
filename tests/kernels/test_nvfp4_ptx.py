"""The PTX that decodes FP4 on the GPU (``quant.fp4_tiles.E2M1_BF16_ASM``, for NVFP4 and MXFP4
tiles, and ``E2M1_E4M3_ASM``, MXFP4 rows as e4m3 with their scales folded), run by a small
emulator of the instructions it uses (semantics from the PTX ISA), against the e2m1 table and the
block scales: the interpreter cannot run inline PTX, so this is how CI checks it."""

import random
import re
import struct

import torch

from flashrt_kernels.quant.fp4_tiles import E2M1_BF16_ASM, E2M1_E4M3_ASM
from flashrt_kernels.quant.reference import e2m1_decode

M32 = 0xFFFFFFFF


def _prmt(a: int, b: int, c: int) -> int:
    """prmt.b32 d, a, b, c (generic mode): byte i of d is byte (c >> 4i) & 7 of {b, a}, or that
    byte's sign bit replicated when bit 3 of the selector is set."""
    src, d = a | (b << 32), 0
    for i in range(4):
        sel = (c >> (4 * i)) & 0xF
        byte = (src >> (8 * (sel & 7))) & 0xFF
        if sel & 8:
            byte = 0xFF if byte & 0x80 else 0
        d |= byte << (8 * i)
    return d


def _lop3(a: int, b: int, c: int, lut: int) -> int:
    d = 0
    for bit in range(32):
        idx = (((a >> bit) & 1) << 2) | (((b >> bit) & 1) << 1) | ((c >> bit) & 1)
        d |= ((lut >> idx) & 1) << bit
    return d


def _bf16(h: int) -> float:
    return struct.unpack("<f", struct.pack("<I", h << 16))[0]


def _to_bf16(x: float) -> int:
    return int(torch.tensor([x], dtype=torch.float32).to(torch.bfloat16).view(torch.int16)) & 0xFFFF


def _mul_bf16x2(a: int, b: int) -> int:
    lo = _to_bf16(_bf16(a & 0xFFFF) * _bf16(b & 0xFFFF))
    hi = _to_bf16(_bf16(a >> 16) * _bf16(b >> 16))
    return lo | (hi << 16)


def _run(asm: str, operands: dict[str, int]) -> dict[str, int]:
    regs = dict(operands)

    def val(tok: str) -> int:
        tok = tok.strip()
        return int(tok, 0) & M32 if tok[0].isdigit() else regs[tok]

    for line in asm.splitlines():
        line = line.strip().rstrip(";")
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        op, rest = line.split(None, 1)
        args = [a.strip() for a in rest.split(",")]
        d, srcs = args[0], [val(a) for a in args[1:]]
        if op == "and.b32":
            regs[d] = srcs[0] & srcs[1]
        elif op == "shr.b32":
            regs[d] = srcs[0] >> srcs[1]
        elif op == "shl.b32":
            regs[d] = (srcs[0] << srcs[1]) & M32
        elif op == "mov.b32":
            regs[d] = srcs[0]
        elif op == "prmt.b32":
            regs[d] = _prmt(*srcs)
        elif op == "lop3.b32":
            regs[d] = _lop3(*srcs)
        elif op == "bfe.s32":  # signed bit-field extract: bits [pos, pos + len), sign-extended
            pos, n = srcs[1], srcs[2]
            f = (srcs[0] >> pos) & ((1 << n) - 1)
            regs[d] = (f - (1 << n) if f >> (n - 1) else f) & M32
        elif op == "mad.lo.s32":
            regs[d] = (srcs[0] * srcs[1] + srcs[2]) & M32
        elif op == "mul.rn.bf16x2":
            regs[d] = _mul_bf16x2(*srcs)
        else:
            raise AssertionError(
                f"the emulator does not know {op!r}: extend it with the ISA's rule"
            )
    return regs


def _check_decoding(scales: list[float]) -> None:
    asm = E2M1_BF16_ASM.value
    assert set(re.findall(r"\$\d", asm)) == {f"${i}" for i in range(7)}
    rng = random.Random(0)
    words = [rng.getrandbits(32) for _ in range(3000)] + [b * 0x01010101 for b in range(256)]
    for r in words:
        sj = [rng.choice(scales) for _ in range(4)]  # byte j's scale
        pair = [_to_bf16(s) for s in sj]
        out = _run(asm, {"$4": r, "$5": pair[0] | pair[1] << 16, "$6": pair[2] | pair[3] << 16})
        # $j: byte j's (low nibble, high nibble) values, one bf16 pair
        even = [out[f"${j}"] & 0xFFFF for j in range(4)]
        odd = [out[f"${j}"] >> 16 for j in range(4)]
        for j in range(4):
            byte = (r >> (8 * j)) & 0xFF
            s = sj[j]
            codes = torch.tensor([byte & 15, byte >> 4], dtype=torch.uint8)
            # (exact, or past fp32's range: inf, as the GPU's fp32 and bf16 products)
            want = (e2m1_decode(codes).double() * s).float().tolist()
            assert [_bf16(even[j]), _bf16(odd[j])] == want, (hex(r), j, s)
            # a negative code carries the sign bit (so -0 stays -0, as the table's zero)
            assert even[j] >> 15 == (byte >> 3) & 1 and odd[j] >> 15 == byte >> 7


def test_e2m1_ptx_gives_the_codes_times_their_scales():
    _check_decoding([0.001953125, 0.0625, 1.0, 1.125, 3.5, 240.0, 448.0])  # e4m3: 2**-9 .. 448


def test_e2m1_ptx_with_ue8m0_scales():
    """MXFP4's scales, 2 ** (byte - 127) as the bf16 ``byte << 7``, down to the subnormal products
    of byte 1 (0.5 * 2**-126) and up to byte 254."""
    for byte in (1, 2, 27, 100, 127, 128, 200, 254):
        assert _bf16(byte << 7) == 2.0 ** (byte - 127)
    _check_decoding([2.0 ** (b - 127) for b in (1, 2, 27, 100, 127, 128, 200, 254)])


def _e4m3(code: int) -> float:
    return float(torch.tensor([code], dtype=torch.uint8).view(torch.float8_e4m3fn).float())


def test_e2m1_e4m3_ptx_gives_the_codes_times_two_to_the_t():
    """Eight codes of a word and t in -5..6 -> the e4m3 codes of code * 2**t, codes 0-3 in $0 and
    4-7 in $1 (code 2n, 2n + 1: byte n's low and high nibbles), the sign carried (-0 stays -0)."""
    asm = E2M1_E4M3_ASM.value
    assert set(re.findall(r"\$\d", asm)) == {f"${i}" for i in range(4)}
    rng = random.Random(1)
    words = [rng.getrandbits(32) for _ in range(300)] + [b * 0x01010101 for b in range(256)]
    for r in words:
        for t in range(-5, 7):
            # t rides in the low byte of its register, as the tile's int8 t packed four a register
            out = _run(asm, {"$2": r, "$3": (t & 0xFF) * 0x01010101})
            for n in range(8):
                code = (r >> (4 * n)) & 15
                reg, at = (out["$0"], n) if n < 4 else (out["$1"], n - 4)
                got = (reg >> (8 * at)) & 0xFF
                want = float(e2m1_decode(torch.tensor([code], dtype=torch.uint8))) * 2.0**t
                assert _e4m3(got) == want, (hex(r), t, n)
                assert got >> 7 == code >> 3, "the sign bit"
