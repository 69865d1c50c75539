"""Torch specification of the quant family: formats and row quantizers.

Row quantizers (per row of a [rows, K] tensor, from the values in their own dtype, in fp32):
- ``amax = max(max_k |x_k|, 2**-100)`` (the floor keeps the reciprocal finite; a zero row gets codes
  0 and scale 2**-100 / QMAX);
- ``scale = amax / QMAX`` and ``inv = QMAX / amax`` (fp32, correctly rounded divisions);
- INT8 (QMAX 127): ``q = clamp(round_half_even(x * inv), -127, 127)``;
- FP8 e4m3 (QMAX 448): ``q = float8_e4m3fn(clamp(x * inv, -448, 448))`` (round to nearest even).

Dequantization is ``q * scale``. Weights use the same quantizers per output row.

Group INT4 (asymmetric uint4, ParoQuant / AWQ semantics, groups of G along K, per output row n):
``scale = (max - min) / 15`` (a group of equal values gets scale 1), ``zero = clamp(-round(min /
scale), 0, 15)``, ``q = clamp(round(w / scale) + zero, 0, 15)``, value ``(q - zero) * scale``.
Our packed layout: ``qweight`` uint8 [N, K/2], low nibble = even k; ``zeros`` uint8 [N, K/G];
``scales`` fp32 [N, K/G].
"""

from __future__ import annotations

import torch

AMAX_FLOOR = 2.0**-100
QMAX = {"int8": 127.0, "fp8": 448.0}
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _div(a, b) -> torch.Tensor:
    """Correctly rounded fp32 division (torch turns ``scalar / tensor`` into a reciprocal times
    the scalar, and may do the same for a scalar divisor)."""
    ref = a if isinstance(a, torch.Tensor) else b
    a = a if isinstance(a, torch.Tensor) else torch.full_like(ref, a)
    b = b if isinstance(b, torch.Tensor) else torch.full_like(ref, b)
    return torch.div(a, b)


def row_absmax(x: torch.Tensor) -> torch.Tensor:
    """fp32 [rows] absmax with the floor, of a [rows, K] tensor."""
    return x.float().abs().amax(dim=-1).clamp_min(AMAX_FLOOR)


def quantize_rows(x: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes [rows, K] int8 or float8_e4m3fn, scales fp32 [rows])."""
    qmax = QMAX[fmt]
    amax = row_absmax(x)
    scale = _div(amax, qmax)
    inv = _div(qmax, amax)
    v = x.float() * inv[:, None]
    if fmt == "int8":
        q = v.round().clamp(-127, 127).to(torch.int8)
    else:
        q = v.clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return q, scale


def dequantize_rows(q: torch.Tensor, scale: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    return (q.float() * scale.float()[:, None]).to(dtype)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU of a [rows, 2I] gate|up tensor: fp32 silu(gate) * up, rounded to the dtype."""
    i = gate_up.shape[-1] // 2
    g, u = gate_up[..., :i].float(), gate_up[..., i:].float()
    return (g / (1.0 + torch.exp(-g)) * u).to(gate_up.dtype)


def layer_norm(x, weight, bias, eps) -> torch.Tensor:
    """LayerNorm: fp32 mean and biased variance, ``((x - mean) * rstd) * w + b`` in fp32, one
    rounding to the dtype."""
    xf = x.float()
    mean = xf.mean(-1, keepdim=True)
    d = xf - mean
    rstd = torch.rsqrt((d * d).mean(-1, keepdim=True) + eps)
    return ((d * rstd) * weight.float() + bias.float()).to(x.dtype)


def rms_norm_quantize(x, weight, eps, residual, fmt):
    """RMSNorm (norm.reference order) then ``quantize_rows``: (codes, scales, new residual)."""
    from flashrt_kernels.norm import reference as norm_ref

    y, r = norm_ref.rms_norm(x, weight, eps, residual)
    q, s = quantize_rows(y, fmt)
    return q, s, r


# ---- group INT4 ----------------------------------------------------------------------------------


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K] codes in 0..15 -> uint8 [N, K/2], low nibble = even k."""
    c = codes.to(torch.uint8)
    return c[:, 0::2] | (c[:, 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    lo, hi = packed & 15, packed >> 4
    return torch.stack((lo, hi), dim=-1).reshape(packed.shape[0], -1)


def quantize_int4_groups(w: torch.Tensor, group: int = 128):
    """[N, K] float -> (codes uint8 [N, K], scales fp32 [N, K/group], zeros uint8 [N, K/group])."""
    n, k = w.shape
    wg = w.float().reshape(n, k // group, group)
    lo, hi = wg.amin(-1), wg.amax(-1)
    scale = (hi - lo) / 15.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    zero = (-(lo / scale).round()).clamp(0, 15)
    q = ((wg / scale[..., None]).round() + zero[..., None]).clamp(0, 15)
    return q.reshape(n, k).to(torch.uint8), scale, zero.to(torch.uint8)


def dequantize_int4_groups(codes, scales, zeros, dtype=torch.float32) -> torch.Tensor:
    n, k = codes.shape
    g = k // scales.shape[1]
    c = codes.float().reshape(n, -1, g)
    return ((c - zeros.float()[..., None]) * scales.float()[..., None]).reshape(n, k).to(dtype)


def w4a8_integer_scales(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Marlin W4A8 integer group scales: s16 = round(s / max(s) * 4096) (int16) and the global
    factor max(s) / 4096 (fp32 [1]) that the token scale absorbs."""
    smax = scales.float().amax().reshape(1)
    s16 = (scales.float() / smax * 4096.0).round().to(torch.int16)
    return s16, smax / 4096.0


def w4a8_linear(xq, xs, codes, zeros, s16, gfactor, out_dtype=torch.bfloat16) -> torch.Tensor:
    """Integer W4A8 reference: per group g the dot of INT8 activations with (q - zero), times
    s16[n, g], summed over groups exactly; then fp32(total) * fp32(xs[m] * gfactor) -> out_dtype.

    The integers are carried in float64, where they are exact (a group dot is below 2**18, times
    s16 below 2**31, summed over at most 2**14 groups below 2**45 < 2**53), so this runs on any
    device (CUDA has no int64 matmul).
    """
    m, k = xq.shape
    n, groups = s16.shape
    g = k // groups
    x = xq.double().reshape(m, groups, g).permute(1, 0, 2)
    w = (codes.double().reshape(n, groups, g) - zeros.double()[..., None]).permute(1, 2, 0)
    per_group = torch.bmm(x, w)  # [groups, m, n]
    total = (per_group * s16.double().t()[:, None, :]).sum(0).to(torch.int64)
    tscale = xs.float() * gfactor.float()
    return (total.float() * tscale[:, None]).to(out_dtype)


# ---- NVFP4 ----------------------------------------------------------------------------------------


def e2m1_encode(a: torch.Tensor) -> torch.Tensor:
    """Magnitude codes 0..7 of scaled |x| (RNE thresholds 0.25 0.75 1.25 1.75 2.5 3.5 5)."""
    c = (a > 0.25).int() + (a >= 0.75).int() + (a > 1.25).int() + (a >= 1.75).int()
    return c + (a > 2.5).int() + (a >= 3.5).int() + (a > 5.0).int()


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    table = torch.tensor(E2M1_VALUES, device=codes.device)
    mag = table[(codes & 7).long()]
    return torch.where((codes & 8) != 0, -mag, mag)


def nvfp4_quantize(x: torch.Tensor, per_row: bool = False):
    """[rows, K] -> (codes uint8 [rows, K/2] low nibble first, block scales float8_e4m3fn
    [rows, K/16], alpha fp32 [rows] or [1]).

    ``g = 448 * 6 / amax`` (amax per tensor or per row, floored), ``sf = e4m3(g * amax16 / 6)``,
    ``code = e2m1(x * g / sf)`` (0 where sf is 0), ``alpha = 1 / g``; value = e2m1 * sf * alpha.
    """
    rows, k = x.shape
    xf = x.float()
    amax = xf.abs().amax(dim=1) if per_row else xf.abs().amax().reshape(1)
    amax = amax.clamp_min(AMAX_FLOOR)
    g = _div(448.0 * 6.0, amax)
    gr = g[:, None] if per_row else g.expand(rows)[:, None]
    blocks = xf.reshape(rows, k // 16, 16)
    amax16 = blocks.abs().amax(-1)
    sf = _div(gr * amax16, 6.0).clamp(max=448.0).to(torch.float8_e4m3fn)
    sff = sf.float()
    scaled = blocks * gr[..., None] / torch.where(sff > 0, sff, torch.ones_like(sff))[..., None]
    mag = e2m1_encode(scaled.abs())
    mag = torch.where(sff[..., None] > 0, mag, torch.zeros_like(mag))
    codes = (mag | ((scaled < 0).int() << 3)).reshape(rows, k).to(torch.uint8)
    return pack_int4(codes), sf, _div(1.0, g)


def nvfp4_dequantize(packed, sf, alpha, dtype=torch.float32) -> torch.Tensor:
    codes = unpack_int4(packed)
    rows, k = codes.shape
    vals = e2m1_decode(codes).reshape(rows, k // 16, 16) * sf.float()[..., None]
    a = alpha.float() if alpha.numel() == rows else alpha.float().expand(rows)
    return (vals.reshape(rows, k) * a[:, None]).to(dtype)


def rms_norm_quantize_nvfp4(x, weight, eps, residual):
    """RMSNorm (norm.reference order) then ``nvfp4_quantize(per_row=True)``: (codes, block
    scales, alpha, new residual)."""
    from flashrt_kernels.norm import reference as norm_ref

    y, r = norm_ref.rms_norm(x, weight, eps, residual)
    return (*nvfp4_quantize(y, per_row=True), r)
