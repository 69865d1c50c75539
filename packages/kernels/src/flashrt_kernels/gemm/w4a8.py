"""W4A8 few-row linear: per-token INT8 activations times group-128 asymmetric INT4 weights with
integer group scales (Marlin's arithmetic), also the INT4 LM head (padded vocabulary).

``y[m, n] = fp32(sum_g s16[n, g] * sum_{k in g} xq[m, k] * (q[n, k] - z[n, g])) *
fp32(xs[m] * gfactor)``, rounded to bf16. Every step below is integer arithmetic with no rounding
and no overflow, so any tile or split choice gives the same integers: the contract is ``exact``
against ``reference.w4a8_linear`` (and hence batch-invariant).

The nibbles are never unpacked one by one: on a weight byte ``b`` (low nibble ``q0``, even k; high
nibble ``q1``, odd k) the kernel forms two int8 operands with one bitwise op per four bytes,
``b & 15 = q0`` and ``(b & 0xF0) ^ 0x80 = 16 q1 - 128``, and the zero point enters as two more
int8 dots against the constant columns ``-z`` (even k) and ``8 - z`` (odd k). With ``xe`` / ``xo``
the even / odd activations of a group (int32 tensor-core dots)::

    lo = xe.(q0 - z) + 8 sum(xo) - z sum(xo)        (three dots into one accumulator)
    hi = xo.(16 q1 - 128) = 16 xo.q1 - 128 sum(xo)
    16 lo + hi = 16 (xe.(q0 - z) + xo.(q1 - z)) = 16 * group dot

so ``sum_g s16 * (16 lo + hi)`` (int64) is 16 times the reference's group sum, and a shift by 4
gives it back exactly. Bounds: a group dot is below 2**18, ``16 lo + hi`` below 2**22, times s16
(< 2**13) below 2**35, summed over at most 2**14 groups below 2**49.

The activations come either quantized (``xq`` int8, ``xs`` fp32, e.g. from
``quant.rms_norm_quantize``) or as bf16 rows quantized in the GEMM prologue with
``quant.quantize_rows``' arithmetic (each program quantizes its 16 rows: worth it for M <= 16).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashrt_kernels import arrival
from flashrt_kernels.arrival import arrived_last
from flashrt_kernels.backends import resolve_backend
from flashrt_kernels.checks import check_out, check_tensor
from flashrt_kernels.gemm import reference
from flashrt_kernels.quant import reference as qref
from flashrt_kernels.quant.device import rne_small
from flashrt_kernels.quant.int4 import Int4Weight
from flashrt_kernels.triton_helpers import cast_rne, to_f32

OP = "w4a8_linear"
GROUP = 128
IMPLEMENTED = ("triton", "reference")


def _split(k: int, n: int, block_n: int, programs: int) -> int:
    return max(1, min(k // 512, triton.cdiv(programs, triton.cdiv(n, block_n))))


def _shape(block_n: int, programs: int, warps: int, stages: int):
    return lambda k, n: {"BLOCK_N": block_n, "SPLIT_K": _split(k, n, block_n, programs),
                         "num_warps": warps, "num_stages": stages}  # fmt: skip


# Named launch shapes (any choice gives the same integers). The benchmark times all of them;
# DEFAULT is the one measured fastest on the H200.
CANDIDATES = {
    "n64_p264_w4": _shape(64, 264, 4, 4),
    "n128_p264_w4": _shape(128, 264, 4, 4),
    "n128_p264_w8": _shape(128, 264, 8, 3),
    "n256_p264_w8": _shape(256, 264, 8, 3),
    # 32 columns: 2x the splits of n64 (H100, 2026-12-07: 0.92x its time at M = 16 on 4096 ->
    # 6144 and 2048 -> 2560, 1.08x on 11008 -> 2048)
    "n32_p264_w4": _shape(32, 264, 4, 4),
}
DEFAULT = "n64_p264_w4"


def launch_config(k: int, n: int) -> dict:
    return CANDIDATES[DEFAULT](k, n)


@triton.jit
def _quantize_group(X, rows, row_ok, kk, stride_x, inv):
    """The prologue's INT8 codes of one 128-wide group of bf16 rows (quantize_rows' arithmetic)."""
    xa = tl.load(X + rows[:, None] * stride_x + (kk + tl.arange(0, 128))[None, :],
                 mask=row_ok[:, None], other=0.0)  # fmt: skip
    v = tl.minimum(tl.maximum(to_f32(xa) * inv[:, None], -127.0), 127.0)
    return rne_small(v).to(tl.int8)


@triton.jit
def _w4a8_kernel(
    X, XQ, XS, QW, Z, S16, G, Y, P, T, m, n_out, n_pad, k, split, stride_x, stride_xq,
    stride_w, stride_y, PROLOGUE: tl.constexpr, PARTIAL: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    pid_m, pid_n, pid_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = pid_m * 16 + tl.arange(0, 16)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, w_ok = rows < m, cols < n_pad
    groups = k // 128
    g_per = tl.cdiv(groups, split)
    g0 = pid_s * g_per
    g1 = tl.minimum(g0 + g_per, groups)
    if PROLOGUE:
        amax_cols = tl.zeros((16, 128), dtype=tl.float32)
        for kk in range(0, k, 128):
            xa = tl.load(X + rows[:, None] * stride_x + (kk + tl.arange(0, 128))[None, :],
                         mask=row_ok[:, None], other=0.0)  # fmt: skip
            amax_cols = tl.maximum(amax_cols, tl.abs(to_f32(xa)))
        amax = tl.maximum(tl.max(amax_cols, axis=1), 7.888609052210118e-31)
        inv = tl.div_rn(tl.full(amax.shape, 127.0, tl.float32), amax)
        xs = tl.div_rn(amax, 127.0)
    else:
        xs = tl.load(XS + rows, mask=row_ok, other=0.0)
    total = tl.zeros((16, BLOCK_N), dtype=tl.int64)
    for g in range(g0, g1):
        if PROLOGUE:
            xg = _quantize_group(X, rows, row_ok, g * 128, stride_x, inv)
        else:
            xg = tl.load(XQ + rows[:, None] * stride_xq + (g * 128 + tl.arange(0, 128))[None, :],
                         mask=row_ok[:, None], other=0)  # fmt: skip
        xe, xo = tl.split(tl.reshape(xg, (16, 64, 2)))
        wb = tl.load(QW + cols[:, None] * stride_w + (g * 64 + tl.arange(0, 64))[None, :],
                     mask=w_ok[:, None], other=0)  # fmt: skip
        z = tl.load(Z + cols * groups + g, mask=w_ok, other=0).to(tl.int8)
        s = tl.load(S16 + cols * groups + g, mask=w_ok, other=0).to(tl.int64)
        lo = (wb & 15).to(tl.int8, bitcast=True)
        hi = ((wb & 0xF0) ^ 0x80).to(tl.int8, bitcast=True)
        acc = tl.dot(xe, tl.broadcast_to(-z[None, :], (64, BLOCK_N)), out_dtype=tl.int32)
        acc = tl.dot(xo, tl.broadcast_to(8 - z[None, :], (64, BLOCK_N)), acc, out_dtype=tl.int32)
        acc = tl.dot(xe, tl.trans(lo), acc, out_dtype=tl.int32)
        acc_hi = tl.dot(xo, tl.trans(hi), out_dtype=tl.int32)
        total += (acc * 16 + acc_hi).to(tl.int64) * s[None, :]
    mask = row_ok[:, None] & (cols < n_out)[None, :]
    tscale = xs * tl.load(G)
    if PARTIAL:  # int64 partials [split, m, n]; the last split to arrive adds them in split order
        base = P + rows[:, None] * n_out + cols[None, :]
        tl.store(base + pid_s * m * n_out, total, mask=mask)
        if arrived_last(T, pid_m * tl.num_programs(1) + pid_n, split):
            total = tl.load(base, mask=mask, other=0, cache_modifier=".cg")
            for sp in range(1, split):
                total += tl.load(base + sp * m * n_out, mask=mask, other=0, cache_modifier=".cg")
            _store_rows(total, tscale, Y, rows, cols, mask, stride_y)
    else:
        _store_rows(total, tscale, Y, rows, cols, mask, stride_y)


@triton.jit
def _store_rows(total16, tscale, Y, rows, cols, mask, stride_y):
    """bf16 of fp32(total) * fp32(xs * gfactor), ``total16`` being 16 times the group sum."""
    y = (total16 >> 4).to(tl.float32) * tscale[:, None]
    tl.store(Y + rows[:, None] * stride_y + cols[None, :], cast_rne(y, tl.bfloat16), mask=mask)


def _validate(x, xq, xs, w, out):
    if not isinstance(w, Int4Weight) or w.s16 is None:
        raise TypeError(f"{OP}: weight must be an Int4Weight with W4A8 integer scales (s16)")
    if w.group != GROUP:
        raise ValueError(f"{OP}: weight group must be {GROUP}, got {w.group}")
    k = w.in_features
    if x is not None:
        check_tensor(OP, "x", x, dtypes=(torch.bfloat16,), ndim=2, last_dim_contiguous=True)
        m, dev = x.shape[0], x.device
        if x.shape[1] != k:
            raise ValueError(f"{OP}: x must have K = {k} columns, got {x.shape[1]}")
    else:
        check_tensor(OP, "xq", xq, dtypes=(torch.int8,), ndim=2, last_dim_contiguous=True)
        m, dev = xq.shape[0], xq.device
        if xq.shape[1] != k:
            raise ValueError(f"{OP}: xq must have K = {k} columns, got {xq.shape[1]}")
        check_tensor(OP, "xs", xs, dtypes=(torch.float32,), shape=[m], device=dev, contiguous=True)
    for name in ("qweight", "zeros", "s16", "gfactor"):
        check_tensor(OP, f"weight.{name}", getattr(w, name), device=dev, contiguous=True)
    if out is not None:
        check_out(OP, "out", out, shape=(m, w.out_features), dtype=torch.bfloat16, device=dev)
    return m, dev


def w4a8_linear(x=None, weight: Int4Weight = None, *, xq=None, xs=None, out=None,
                backend: str = "auto", config=None):  # fmt: skip
    """W4A8 ``[M, K] -> bf16 [M, out_features]``: pass bf16 ``x`` (quantized in the prologue) or
    ``xq`` int8 [M, K] with ``xs`` fp32 [M]. The INT4 LM head is this op with a vocabulary-padded
    ``Int4Weight`` (``int4.make_int4_weight(..., pad_to=BLOCK_N)``)."""
    if (x is None) == (xq is None):
        raise ValueError(f"{OP}: pass exactly one of x (bf16) or xq (int8, with xs)")
    m, dev = _validate(x, xq, xs, weight, out)
    n = weight.out_features
    if out is None:
        out = torch.empty(m, n, dtype=torch.bfloat16, device=dev)
    if resolve_backend(OP, backend, dev, IMPLEMENTED) == "reference":
        if x is not None:
            xq, xs = qref.quantize_rows(x, "int8")
        codes = weight.codes()[:n]
        out.copy_(reference.w4a8_linear(xq, xs, codes, weight.zeros[:n], weight.s16[:n],
                                        weight.gfactor))  # fmt: skip
        return out
    if m == 0:
        return out
    cfg = dict(config or launch_config(weight.in_features, n))
    split, bn = cfg.pop("SPLIT_K"), cfg["BLOCK_N"]
    grid = (triton.cdiv(m, 16), triton.cdiv(n, bn), split)
    prologue = x is not None
    part = torch.empty(split, m, n, dtype=torch.int64, device=dev) if split > 1 else out
    ticket = arrival.tickets(dev, grid[0] * grid[1]) if split > 1 else out
    _w4a8_kernel[grid](
        x if prologue else xq, xq if xq is not None else x, xs if xs is not None else out,
        weight.qweight, weight.zeros, weight.s16, weight.gfactor, out, part, ticket,
        m, n, weight.qweight.shape[0], weight.in_features, split, x.stride(0) if prologue else 0,
        xq.stride(0) if xq is not None else 0, weight.qweight.stride(0), out.stride(0),
        PROLOGUE=prologue, PARTIAL=split > 1, enable_fp_fusion=False, **cfg,
    )  # fmt: skip
    return out


@torch.library.custom_op("flashrt::w4a8_linear", mutates_args=())
def _w4a8_op(xq: torch.Tensor, xs: torch.Tensor, qweight: torch.Tensor, zeros: torch.Tensor,
             scales: torch.Tensor, s16: torch.Tensor, gfactor: torch.Tensor, out_features: int,
             backend: str) -> torch.Tensor:  # fmt: skip
    w = Int4Weight(qweight, zeros, scales, out_features, s16, gfactor)
    return w4a8_linear(xq=xq, xs=xs, weight=w, backend=backend)


@_w4a8_op.register_fake
def _(xq, xs, qweight, zeros, scales, s16, gfactor, out_features, backend):
    return xq.new_empty(xq.shape[0], out_features, dtype=torch.bfloat16)
