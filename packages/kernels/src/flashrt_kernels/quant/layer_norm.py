"""LayerNorm over the last dimension, and LayerNorm straight to INT8 / FP8 rows.

``y = round(((x - mean) * rstd) * w + b)`` with mean and variance (biased) in fp32, ``rstd =
1 / sqrt(var + eps)``, the affine step in fp32 and one rounding to the dtype.

Contracts: ``layer_norm`` is ``faithful`` against ``reference.layer_norm`` (the fp32 sums are
reduced in another order: |y - y_ref| <= 2 ulp(dtype) * |y_ref| + 2**-14 * (|w| + |b|));
``layer_norm_quantize`` is ``exact`` against ``layer_norm`` followed by ``quantize_rows`` (one
kernel computes both; its sums are pairwise trees, so its launch shape, one row a program when
quantizing, moves no bit).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashrt_kernels.backends import resolve_backend, triton_interpreter_active
from flashrt_kernels.checks import check_float, check_out, check_tensor
from flashrt_kernels.quant import reference
from flashrt_kernels.quant.device import quantize_tile
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
def _layer_norm_kernel(
    X, W, B, Y, Q, S, n_rows, n_cols, stride_x, stride_y, stride_q, eps,
    QUANTIZE: tl.constexpr, FP8: tl.constexpr, NATIVE: tl.constexpr,
    BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
):  # fmt: skip
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < n_cols
    mask = (rows < n_rows)[:, None] & col_ok[None, :]
    x = to_f32(tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0))
    mean = pairwise_row_sum(x) / n_cols
    d = tl.where(mask, x - mean[:, None], 0.0)
    var = pairwise_row_sum(d * d) / n_cols
    rstd = 1.0 / tl.sqrt(var + eps)
    w = to_f32(tl.load(W + cols, mask=col_ok, other=0.0))
    b = to_f32(tl.load(B + cols, mask=col_ok, other=0.0))
    y = (d * rstd[:, None]) * w[None, :] + b[None, :]
    if QUANTIZE:
        q, scale = quantize_tile(rounded_f32(y, X.dtype.element_ty, NATIVE), mask, FP8, NATIVE)
        tl.store(Q + rows[:, None] * stride_q + cols[None, :], q, mask=mask)
        tl.store(S + rows, scale, mask=rows < n_rows)
    else:
        y = cast_rne(y, X.dtype.element_ty)
        tl.store(Y + rows[:, None] * stride_y + cols[None, :], y, mask=mask)


def _validate(op, x, weight, bias, eps):
    _check_rows(op, "x", x, dtypes=(torch.bfloat16, torch.float16))
    k = x.shape[1]
    for name, t in (("weight", weight), ("bias", bias)):
        check_tensor(op, name, t, dtypes=(x.dtype,), shape=[k], device=x.device, contiguous=True)
    check_float(op, "eps", eps, positive=True)


def _launch(x, weight, bias, eps, y, q, s, fmt, quantize):
    n, k = x.shape
    if n == 0:
        return
    block_n, rows, warps = _row_config(k)
    if quantize:  # the sums are pairwise trees: the launch shape moves no bit
        rows, warps = _producer_config(block_n)
    _layer_norm_kernel[(triton.cdiv(n, rows),)](
        x, weight, bias, y if y is not None else x, q if q is not None else x,
        s if s is not None else x, n, k, x.stride(0), y.stride(0) if y is not None else 0,
        q.stride(0) if q is not None else 0, float(eps),
        QUANTIZE=quantize, FP8=fmt == "fp8",
        NATIVE=x.device.type == "cuda" and not triton_interpreter_active(),
        BLOCK_N=block_n, ROWS=rows, num_warps=warps, enable_fp_fusion=False,
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
