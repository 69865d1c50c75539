"""W4A8 few-row linear: per-token INT8 activations times group-128 asymmetric INT4 weights with
integer group scales (Marlin's arithmetic), also the INT4 LM head (padded vocabulary).

``y[m, n] = fp32(sum_g s16[n, g] * sum_{k in g} xq[m, k] * (q[n, k] - z[n, g])) *
fp32(xs[m] * gfactor)``, rounded to bf16. The inner sums are int32 tensor-core dots, the outer sum
int64: every tile and split choice gives the same integers, so the contract is ``exact`` against
``reference.w4a8_linear`` (and hence batch-invariant).

The activations come either quantized (``xq`` int8, ``xs`` fp32, e.g. from
``quant.rms_norm_quantize``) or as bf16 rows quantized in the GEMM prologue with
``quant.quantize_rows``' arithmetic (each program quantizes its 16 rows: worth it for M <= 16).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

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


# Named launch shapes (any choice gives the same integers). The benchmark times all of them;
# DEFAULT is the one measured fastest on the H200.
CANDIDATES = {
    "n32_p264": lambda k, n: {"BLOCK_N": 32, "SPLIT_K": _split(k, n, 32, 264), "num_warps": 4,
                              "num_stages": 4},
    "n64_p264": lambda k, n: {"BLOCK_N": 64, "SPLIT_K": _split(k, n, 64, 264), "num_warps": 4,
                              "num_stages": 4},
    "n64_p528_w8": lambda k, n: {"BLOCK_N": 64, "SPLIT_K": _split(k, n, 64, 528),
                                 "num_warps": 8, "num_stages": 3},
    "n128_p264_w8": lambda k, n: {"BLOCK_N": 128, "SPLIT_K": _split(k, n, 128, 264),
                                  "num_warps": 8, "num_stages": 3},
}  # fmt: skip
DEFAULT = "n128_p264_w8"


def launch_config(k: int, n: int) -> dict:
    return CANDIDATES[DEFAULT](k, n)


@triton.jit
def _w4a8_kernel(
    X, XQ, XS, QW, Z, S16, G, Y, P, m, n_out, k, stride_x, stride_xq, stride_y,
    PROLOGUE: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    pid_m, pid_n, pid_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = pid_m * 16 + tl.arange(0, 16)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < m, cols < n_out
    half = tl.arange(0, 64)
    groups = k // 128
    g_per = tl.cdiv(groups, SPLIT_K)
    g0 = pid_s * g_per
    g1 = tl.minimum(g0 + g_per, groups)
    if PROLOGUE:
        amax = tl.zeros((16,), dtype=tl.float32)
        for kk in range(0, k, 128):
            kx = kk + tl.arange(0, 128)
            xa = tl.load(
                X + rows[:, None] * stride_x + kx[None, :], mask=row_ok[:, None], other=0.0
            )
            amax = tl.maximum(amax, tl.max(tl.abs(to_f32(xa)), axis=1))
        amax = tl.maximum(amax, 7.888609052210118e-31)
        inv = tl.div_rn(tl.full(amax.shape, 127.0, tl.float32), amax)
        xs = tl.div_rn(amax, 127.0)
    else:
        xs = tl.load(XS + rows, mask=row_ok, other=0.0)
    total = tl.zeros((16, BLOCK_N), dtype=tl.int64)
    for g in range(g0, g1):
        ke = g * 128 + 2 * half
        if PROLOGUE:
            xp = X + rows[:, None] * stride_x + ke[None, :]
            ve = to_f32(tl.load(xp, mask=row_ok[:, None], other=0.0)) * inv[:, None]
            vo = to_f32(tl.load(xp + 1, mask=row_ok[:, None], other=0.0)) * inv[:, None]
            xe = rne_small(tl.minimum(tl.maximum(ve, -127.0), 127.0)).to(tl.int8)
            xo = rne_small(tl.minimum(tl.maximum(vo, -127.0), 127.0)).to(tl.int8)
        else:
            xp = XQ + rows[:, None] * stride_xq + ke[None, :]
            xe = tl.load(xp, mask=row_ok[:, None], other=0)
            xo = tl.load(xp + 1, mask=row_ok[:, None], other=0)
        wb = tl.load(QW + cols[:, None] * (k // 2) + (g * 64 + half)[None, :], mask=col_ok[:, None],
                     other=0)  # fmt: skip
        z = tl.load(Z + cols * groups + g, mask=col_ok, other=0).to(tl.int8)
        we = (wb & 15).to(tl.int8) - z[:, None]
        wo = (wb >> 4).to(tl.int8) - z[:, None]
        acc = tl.dot(xe, tl.trans(we), out_dtype=tl.int32)
        acc = tl.dot(xo, tl.trans(wo), acc, out_dtype=tl.int32)
        s = tl.load(S16 + cols * groups + g, mask=col_ok, other=0).to(tl.int64)
        total += acc.to(tl.int64) * s[None, :]
    mask = row_ok[:, None] & col_ok[None, :]
    if SPLIT_K > 1:
        tl.store(P + pid_s * m * n_out + rows[:, None] * n_out + cols[None, :], total, mask=mask)
        if PROLOGUE:  # every split writes the same scales
            tl.store(XS + rows, xs, mask=row_ok)
    else:
        tscale = xs * tl.load(G)
        y = total.to(tl.float32) * tscale[:, None]
        tl.store(Y + rows[:, None] * stride_y + cols[None, :], cast_rne(y, tl.bfloat16), mask=mask)


@triton.jit
def _w4a8_reduce_kernel(P, XS, G, Y, m, n_out, stride_y, SPLIT_K: tl.constexpr,
                        BLOCK_N: tl.constexpr):  # fmt: skip
    rows = tl.program_id(0) * 16 + tl.arange(0, 16)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < m)[:, None] & (cols < n_out)[None, :]
    base = P + rows[:, None] * n_out + cols[None, :]
    total = tl.load(base, mask=mask, other=0)
    for s in tl.static_range(1, SPLIT_K):
        total += tl.load(base + s * m * n_out, mask=mask, other=0)
    tscale = tl.load(XS + rows, mask=rows < m, other=0.0) * tl.load(G)
    y = total.to(tl.float32) * tscale[:, None]
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
    if prologue and split > 1:
        xs = torch.empty(m, dtype=torch.float32, device=dev)
    _w4a8_kernel[grid](
        x if prologue else xq, xq if xq is not None else x, xs if xs is not None else out,
        weight.qweight, weight.zeros, weight.s16, weight.gfactor, out, part,
        m, n, weight.in_features, x.stride(0) if prologue else 0,
        xq.stride(0) if xq is not None else 0, out.stride(0),
        PROLOGUE=prologue, SPLIT_K=split, enable_fp_fusion=False, **cfg,
    )  # fmt: skip
    if split > 1:
        _w4a8_reduce_kernel[grid[:2]](
            part, xs, weight.gfactor, out, m, n, out.stride(0), SPLIT_K=split, BLOCK_N=bn,
            num_warps=4,
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
