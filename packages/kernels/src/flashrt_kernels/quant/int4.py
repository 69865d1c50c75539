"""Group INT4 weight format (asymmetric uint4, zero points) and converters from AWQ / GPTQ tensors.

Host-side torch code, run once when weights load. Contract: ``exact`` (pure integer repacking; the
round trips ``to_awq(from_awq(t)) == t`` and ``from_gptq`` of ``to_gptq`` hold bit for bit).

Our layout (``Int4Weight``): ``qweight`` uint8 [N_pad, K/2] (low nibble = even k, so a row of K
codes is K/2 contiguous bytes: 16-byte loads along K), ``zeros`` uint8 [N_pad, K/G], ``scales``
fp32 [N_pad, K/G]; for the W4A8 integer path also ``s16`` int16 [N_pad, K/G] and ``gfactor`` fp32
[1]. ``out_features`` <= N_pad: rows past it are zero padding (LM heads pad the vocabulary to a
multiple of the GEMM's column tile so every weight load is unmasked and aligned).

AWQ: ``qweight`` int32 [K, N/8] and ``qzeros`` int32 [K/G, N/8], nibble i (bits 4i..4i+3) of packed
column c holds column 8c + AWQ_ORDER[i]; ``scales`` fp16 [K/G, N].
GPTQ: ``qweight`` int32 [K/8, N], nibble j of packed row r holds row 8r + j; ``qzeros`` int32
[K/G, N/8], nibble j of packed column c holds column 8c + j, stored minus one in the v1 format
(AutoGPTQ's checkpoints); ``scales`` fp16 [K/G, N]. Activation reordering (``g_idx``) is not
supported.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flashrt_kernels.quant import reference as ref

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)


@dataclass
class Int4Weight:
    qweight: torch.Tensor  # uint8 [N_pad, K/2]
    zeros: torch.Tensor  # uint8 [N_pad, K/G]
    scales: torch.Tensor  # fp32 [N_pad, K/G]
    out_features: int
    s16: torch.Tensor | None = None  # int16 [N_pad, K/G] (W4A8)
    gfactor: torch.Tensor | None = None  # fp32 [1] (W4A8)

    @property
    def in_features(self) -> int:
        return self.qweight.shape[1] * 2

    @property
    def group(self) -> int:
        return self.in_features // self.zeros.shape[1]

    def codes(self) -> torch.Tensor:
        return ref.unpack_int4(self.qweight)

    def dequantize(self, dtype=torch.float32) -> torch.Tensor:
        w = ref.dequantize_int4_groups(self.codes(), self.scales, self.zeros, dtype)
        return w[: self.out_features]

    def to(self, device) -> Int4Weight:
        mv = lambda t: None if t is None else t.to(device)  # noqa: E731
        return Int4Weight(
            mv(self.qweight), mv(self.zeros), mv(self.scales), self.out_features,
            mv(self.s16), mv(self.gfactor),
        )  # fmt: skip


def make_int4_weight(codes, scales, zeros, pad_to: int = 1) -> Int4Weight:
    """From codes uint8 [N, K], scales [N, G], zeros [N, G]; pads N up to a multiple of ``pad_to``
    with zero rows and adds the W4A8 integer scales."""
    n = codes.shape[0]
    n_pad = -(-n // pad_to) * pad_to
    if n_pad != n:
        extra = n_pad - n
        codes = torch.cat([codes, codes.new_zeros(extra, codes.shape[1])])
        scales = torch.cat([scales, scales.new_zeros(extra, scales.shape[1])])
        zeros = torch.cat([zeros, zeros.new_zeros(extra, zeros.shape[1])])
    scales = scales.float().contiguous()
    s16, gfactor = ref.w4a8_integer_scales(scales)
    return Int4Weight(
        ref.pack_int4(codes).contiguous(), zeros.to(torch.uint8).contiguous(), scales, n,
        s16.contiguous(), gfactor,
    )  # fmt: skip


def quantize_int4(w: torch.Tensor, group: int = 128, pad_to: int = 1) -> Int4Weight:
    """Quantize a float [N, K] weight (``reference.quantize_int4_groups``) into our layout."""
    if w.dim() != 2 or w.shape[1] % group:
        raise ValueError(f"quantize_int4: w must be [N, K] with K a multiple of {group}")
    codes, scales, zeros = ref.quantize_int4_groups(w, group)
    return make_int4_weight(codes, scales, zeros, pad_to)


def _unpack_nibbles_last(packed: torch.Tensor) -> torch.Tensor:
    """int32 [..., C] -> uint8 [..., C, 8]: nibble i of each word at index i."""
    p = packed.to(torch.int32)[..., None]
    return ((p >> _SHIFTS.to(p.device)) & 15).to(torch.uint8)


def _pack_nibbles_last(nibbles: torch.Tensor) -> torch.Tensor:
    """uint8 [..., C, 8] -> int32 [..., C] (nibble i into bits 4i)."""
    v = nibbles.to(torch.int64) << _SHIFTS.to(nibbles.device).long()
    word = v.sum(-1)
    return torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)


def _awq_columns(packed: torch.Tensor) -> torch.Tensor:
    """AWQ-packed int32 [R, N/8] -> uint8 [R, N] in natural column order."""
    nib = _unpack_nibbles_last(packed)  # [R, N/8, 8]; nibble i is column AWQ_ORDER[i]
    out = torch.empty_like(nib)
    out[..., list(AWQ_ORDER)] = nib
    return out.reshape(packed.shape[0], -1)


def _awq_pack_columns(cols: torch.Tensor) -> torch.Tensor:
    nib = cols.reshape(cols.shape[0], -1, 8)[..., list(AWQ_ORDER)]
    return _pack_nibbles_last(nib)


def from_awq(qweight, qzeros, scales, pad_to: int = 1) -> Int4Weight:
    codes = _awq_columns(qweight).t().contiguous()  # [N, K]
    zeros = _awq_columns(qzeros).t().contiguous()  # [N, G]
    return make_int4_weight(codes, scales.float().t(), zeros, pad_to)


def to_awq(w: Int4Weight, scale_dtype=torch.float16):
    n = w.out_features
    if n % 8:
        raise ValueError(f"to_awq: out_features must be a multiple of 8, got {n}")
    codes, zeros = w.codes()[:n], w.zeros[:n]
    return (
        _awq_pack_columns(codes.t().contiguous()),
        _awq_pack_columns(zeros.t().contiguous()),
        w.scales[:n].t().contiguous().to(scale_dtype),
    )


def from_gptq(qweight, qzeros, scales, pad_to: int = 1, v1_zeros: bool = True) -> Int4Weight:
    kp, n = qweight.shape
    codes = _unpack_nibbles_last(qweight.t())  # [N, K/8, 8]: nibble j is row 8r + j
    codes = codes.reshape(n, kp * 8)
    zeros = _unpack_nibbles_last(qzeros).reshape(qzeros.shape[0], -1)  # [G, N]
    if v1_zeros:
        zeros = (zeros.int() + 1).clamp(0, 15).to(torch.uint8)
    return make_int4_weight(codes, scales.float().t(), zeros.t().contiguous(), pad_to)


def to_gptq(w: Int4Weight, scale_dtype=torch.float16, v1_zeros: bool = True):
    n = w.out_features
    codes, zeros = w.codes()[:n], w.zeros[:n].t()
    if v1_zeros:
        zeros = zeros.int() - 1
        if (zeros < 0).any():
            raise ValueError("to_gptq: a zero point of 0 cannot be stored in the v1 format")
        zeros = zeros.to(torch.uint8)
    qweight = _pack_nibbles_last(codes.reshape(n, -1, 8)).t().contiguous()
    qzeros = _pack_nibbles_last(zeros.contiguous().reshape(zeros.shape[0], -1, 8))
    return qweight, qzeros, w.scales[:n].t().contiguous().to(scale_dtype)
