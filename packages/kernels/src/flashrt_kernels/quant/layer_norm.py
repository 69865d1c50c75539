"""LayerNorm over the last dimension, and LayerNorm straight to INT8 / FP8 rows.

``y = round(((x - mean) * rstd) * w + b)`` with mean and variance (biased) in fp32, ``rstd =
1 / sqrt(var + eps)``, the affine step in fp32 and one rounding to the dtype.

Contracts: ``layer_norm`` is ``faithful`` against ``reference.layer_norm`` (the fp32 sums are
reduced in another order: |y - y_ref| <= 2 ulp(dtype) * |y_ref| + 2**-14 * (|w| + |b|));
``layer_norm_quantize`` is ``exact`` against ``layer_norm`` followed by ``quantize_rows`` (one
kernel computes both; its sums are pairwise trees, so its launch shape, one row a program when
quantizing, moves no bit).

A row is held as ``norm.rms_norm`` holds it: two power-of-two column segments (11008 = 8192 +
2816 of 4096, 1152 = 1024 + 128), each sum the pairwise tree of the first plus that of the
second, so a width that is not a power of two is not padded to the next one.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashrt_kernels.backends import resolve_backend, triton_interpreter_active
from flashrt_kernels.checks import check_float, check_out, check_tensor
from flashrt_kernels.norm.rms_norm import column_split
from flashrt_kernels.quant import reference
from flashrt_kernels.quant.device import quantize_tile_amax, row_scale
from flashrt_kernels.quant.rows import (
    _alloc_or_check,
    _check_rows,
    _codes_view,
    _producer_config,
    _row_config,
)
from flashrt_kernels.triton_helpers import cast_rne, pairwise_row_sum, rounded_f32, to_f32

IMPLEMENTED = ("triton", "reference")


@triton.jit
def _load_segment(X, rows, row_ok, cols, col_ok, stride_x):
    mask = row_ok[:, None] & col_ok[None, :]
    return to_f32(tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0))


@triton.jit
def _affine(W, B, d, rstd, cols, col_ok):
    """``(d * rstd) * w + b`` in fp32; zero in masked columns (d, w and b are zero there)."""
    w = to_f32(tl.load(W + cols, mask=col_ok, other=0.0))
    b = to_f32(tl.load(B + cols, mask=col_ok, other=0.0))
    return (d * rstd[:, None]) * w[None, :] + b[None, :]


@triton.jit
def _store_segment(Y, Q, rows, row_ok, cols, col_ok, stride_y, stride_q, y, amax,
                   QUANTIZE: tl.constexpr, FP8: tl.constexpr, NATIVE: tl.constexpr):  # fmt: skip
    mask = row_ok[:, None] & col_ok[None, :]
    if QUANTIZE:
        q, _ = quantize_tile_amax(y, amax, FP8, NATIVE)
        tl.store(Q + rows[:, None] * stride_q + cols[None, :], q, mask=mask)
    else:
        tl.store(Y + rows[:, None] * stride_y + cols[None, :], cast_rne(y, Y.dtype.element_ty),
                 mask=mask)  # fmt: skip


@triton.jit
def _layer_norm_kernel(
    X, W, B, Y, Q, S, n_rows, n_cols, stride_x, stride_y, stride_q, eps,
    QUANTIZE: tl.constexpr, FP8: tl.constexpr, NATIVE: tl.constexpr,
    BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr, ROWS: tl.constexpr,
):  # fmt: skip
    # Two power-of-two column segments, [0, BLOCK_A) full and [BLOCK_A, BLOCK_A + BLOCK_B)
    # masked to n_cols (BLOCK_B may be 0), as norm.rms_norm holds a row.
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    row_ok = rows < n_rows
    cols_a = tl.arange(0, BLOCK_A)
    ok_a = cols_a < BLOCK_A
    xa = _load_segment(X, rows, row_ok, cols_a, ok_a, stride_x)
    total = pairwise_row_sum(xa)
    cols_b, ok_b, xb = cols_a, ok_a, xa
    if BLOCK_B > 0:
        cols_b = BLOCK_A + tl.arange(0, BLOCK_B)
        ok_b = cols_b < n_cols
        xb = _load_segment(X, rows, row_ok, cols_b, ok_b, stride_x)
        total += pairwise_row_sum(xb)
    mean = total / n_cols
    da = xa - mean[:, None]
    var = pairwise_row_sum(da * da)
    db = da
    if BLOCK_B > 0:
        db = tl.where(ok_b[None, :], xb - mean[:, None], 0.0)
        var += pairwise_row_sum(db * db)
    rstd = 1.0 / tl.sqrt(var / n_cols + eps)
    ya = _affine(W, B, da, rstd, cols_a, ok_a)
    yb = ya
    if BLOCK_B > 0:
        yb = _affine(W, B, db, rstd, cols_b, ok_b)
    amax = tl.zeros([ROWS], tl.float32)
    if QUANTIZE:  # the quantizer takes the rounded output; masked columns hold 0
        ya = rounded_f32(ya, X.dtype.element_ty, NATIVE)
        amax = tl.max(tl.abs(ya), axis=1)
        if BLOCK_B > 0:
            yb = rounded_f32(yb, X.dtype.element_ty, NATIVE)
            amax = tl.maximum(amax, tl.max(tl.abs(yb), axis=1))
        scale, _ = row_scale(amax, FP8)
        tl.store(S + rows, scale, mask=row_ok)
    _store_segment(Y, Q, rows, row_ok, cols_a, ok_a, stride_y, stride_q, ya, amax, QUANTIZE, FP8,
                   NATIVE)  # fmt: skip
    if BLOCK_B > 0:
        _store_segment(Y, Q, rows, row_ok, cols_b, ok_b, stride_y, stride_q, yb, amax, QUANTIZE,
                       FP8, NATIVE)  # fmt: skip


def _validate(op, x, weight, bias, eps):
    _check_rows(op, "x", x, dtypes=(torch.bfloat16, torch.float16))
    k = x.shape[1]
    for name, t in (("weight", weight), ("bias", bias)):
        check_tensor(op, name, t, dtypes=(x.dtype,), shape=[k], device=x.device, contiguous=True)
    check_float(op, "eps", eps, positive=True)


def _launch(x, weight, bias, eps, y, q, s, fmt, quantize, config=None):
    """``config`` = (BLOCK_A, BLOCK_B, ROWS, num_warps) overrides the launch (the tests and the
    tuning script use it; with the same segments, no bit depends on ROWS or num_warps)."""
    n, k = x.shape
    if n == 0:
        return
    block_a, block_b = column_split(k)
    _, rows, warps = _row_config(block_a + block_b)
    if quantize:  # the sums are pairwise trees: the launch shape moves no bit
        rows, warps = _producer_config(block_a + block_b)
    if config is not None:
        block_a, block_b, rows, warps = config
    _layer_norm_kernel[(triton.cdiv(n, rows),)](
        x, weight, bias, y if y is not None else x, q if q is not None else x,
        s if s is not None else x, n, k, x.stride(0), y.stride(0) if y is not None else 0,
        q.stride(0) if q is not None else 0, float(eps),
        QUANTIZE=quantize, FP8=fmt == "fp8",
        NATIVE=x.device.type == "cuda" and not triton_interpreter_active(),
        BLOCK_A=block_a, BLOCK_B=block_b, ROWS=rows, num_warps=warps, enable_fp_fusion=False,
    )  # fmt: skip


def layer_norm(x, weight, bias, eps: float = 1e-6, *, out=None, backend: str = "auto"):
    """LayerNorm of [rows, K] bf16 / fp16 rows with weight and bias."""
    op = "layer_norm"
    _validate(op, x, weight, bias, eps)
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    check_out(op, "out", out, shape=x.shape, dtype=x.dtype, device=x.device)
    if resolve_backend(op, backend, x.device, IMPLEMENTED) == "reference":
        out.copy_(reference.layer_norm(x, weight, bias, eps))
    else:
        _launch(x, weight, bias, eps, out, None, None, "int8", False)
    return out


def layer_norm_quantize(x, weight, bias, eps: float = 1e-6, fmt: str = "fp8", *, out=None,
                        backend: str = "auto"):  # fmt: skip
    """LayerNorm straight to quantized rows: (codes [rows, K], scales fp32 [rows])."""
    op = "layer_norm_quantize"
    _validate(op, x, weight, bias, eps)
    q, s = _alloc_or_check(op, fmt, x.shape[0], x.shape[1], x.device, out)
    if resolve_backend(op, backend, x.device, IMPLEMENTED) == "reference":
        rq, rs = reference.quantize_rows(reference.layer_norm(x, weight, bias, eps), fmt)
        q.copy_(rq)
        s.copy_(rs)
    else:
        _launch(x, weight, bias, eps, None, _codes_view(q), s, fmt, True)
    return q, s
