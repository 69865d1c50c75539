"""NVFP4 W4A4 GEMM for GPUs without FP4 tensor cores (Hopper): both operands arrive as e2m1 codes
with UE4M3 block scales (``quant.quantize_rows_nvfp4`` / ``reference.nvfp4_quantize``); each tile is
dequantized in registers to bf16 (exactly: an e2m1 value times an e4m3 scale has at most 6
significant bits) before a bf16 tensor-core dot with fp32 accumulation; the row alphas multiply
in the epilogue. It saves weight memory and bandwidth, not arithmetic.

``y[m, n] = round(alpha_a[m] * alpha_w[n] * sum_k (e2m1 * sf)_a[m, k] (e2m1 * sf)_w[n, k])``.
Contract: ``faithful`` against ``reference.nvfp4_linear`` (float64): |y - y_ref| <= 2**-8 |y_ref|
+ K * 2**-22 * sum_k |a_k w_k| alpha_a alpha_w (fp32 accumulation in tensor-core order).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashrt_kernels.backends import resolve_backend, triton_interpreter_active
from flashrt_kernels.checks import check_tensor
from flashrt_kernels.quant import reference as qref
from flashrt_kernels.triton_helpers import cast_rne

OP = "nvfp4_linear"
IMPLEMENTED = ("triton", "reference")


@triton.jit
def _e2m1_value(nib):
    """Value of a 4-bit e2m1 code (sign in bit 3), as fp32."""
    c = (nib & 7).to(tl.float32)
    v = tl.where(c < 4.0, 0.5 * c, tl.where(c < 6.0, c - 2.0, 2.0 * (c - 4.0)))
    return tl.where((nib & 8) != 0, -v, v)


@triton.jit
def _dequant_tile(C, SF, rows, row_ok, k0, k, stride_c, stride_sf, BLOCK_K: tl.constexpr,
                  UPCAST: tl.constexpr):  # fmt: skip
    """(even-k, odd-k) halves of a [rows, BLOCK_K] tile, e2m1 * block scale, exact in bf16."""
    half = tl.arange(0, BLOCK_K // 2)
    mask = row_ok[:, None] & ((k0 + 2 * half) < k)[None, :]
    byte = tl.load(C + rows[:, None] * stride_c + (k0 // 2 + half)[None, :], mask=mask,
                   other=0).to(tl.int32)  # fmt: skip
    sf = tl.load(SF + rows[:, None] * stride_sf + ((k0 + 2 * half) // 16)[None, :], mask=mask,
                 other=0.0).to(tl.float32)  # fmt: skip
    even = _e2m1_value(byte & 15) * sf
    odd = _e2m1_value(byte >> 4) * sf
    if UPCAST:
        return even, odd
    return even.to(tl.bfloat16), odd.to(tl.bfloat16)


@triton.jit
def _nvfp4_linear_kernel(
    AC, ASF, AA, WC, WSF, WA, Y, m, n, k, stride_ac, stride_asf, stride_wc, stride_wsf, stride_y,
    A_PER_ROW: tl.constexpr, W_PER_ROW: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < m, cols < n
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, k, BLOCK_K):
        ae, ao = _dequant_tile(AC, ASF, rows, row_ok, k0, k, stride_ac, stride_asf, BLOCK_K, UPCAST)
        we, wo = _dequant_tile(WC, WSF, cols, col_ok, k0, k, stride_wc, stride_wsf, BLOCK_K, UPCAST)
        acc = tl.dot(ae, tl.trans(we), acc)
        acc = tl.dot(ao, tl.trans(wo), acc)
    aa = tl.load(AA + rows, mask=row_ok, other=0.0) if A_PER_ROW else tl.load(AA + rows * 0)
    wa = tl.load(WA + cols, mask=col_ok, other=0.0) if W_PER_ROW else tl.load(WA + cols * 0)
    y = acc * aa[:, None] * wa[None, :]
    tl.store(Y + rows[:, None] * stride_y + cols[None, :], cast_rne(y, tl.bfloat16),
             mask=row_ok[:, None] & col_ok[None, :])  # fmt: skip


def _check_operand(name, c, sf, alpha, k=None):
    check_tensor(OP, f"{name}_codes", c, dtypes=(torch.uint8,), ndim=2, contiguous=True)
    rows, kk = c.shape[0], 2 * c.shape[1]
    if k is not None and kk != k:
        raise ValueError(f"{OP}: {name}_codes must hold K = {k} codes per row, got {kk}")
    check_tensor(OP, f"{name}_scales", sf, dtypes=(torch.float8_e4m3fn,), shape=[rows, kk // 16],
                 device=c.device, contiguous=True)  # fmt: skip
    check_tensor(OP, f"{name}_alpha", alpha, dtypes=(torch.float32,), ndim=1, device=c.device,
                 contiguous=True)  # fmt: skip
    if alpha.numel() not in (1, rows):
        raise ValueError(f"{OP}: {name}_alpha must have 1 or {rows} entries, got {alpha.numel()}")
    return rows, kk


def nvfp4_linear(a_codes, a_scales, a_alpha, w_codes, w_scales, w_alpha, *, out=None,
                 backend: str = "auto", config=None):  # fmt: skip
    """NVFP4 activations [M, K] times NVFP4 weights [N, K] -> bf16 [M, N]."""
    m, k = _check_operand("a", a_codes, a_scales, a_alpha)
    n, _ = _check_operand("w", w_codes, w_scales, w_alpha, k)
    if k % 64:
        raise ValueError(f"{OP}: K must be a multiple of 64, got {k}")
    dev = a_codes.device
    if w_codes.device != dev:
        raise ValueError(f"{OP}: w_codes must be on {dev} (like a_codes), got {w_codes.device}")
    if out is None:
        out = torch.empty(m, n, dtype=torch.bfloat16, device=dev)
    check_tensor(OP, "out", out, dtypes=(torch.bfloat16,), shape=[m, n], device=dev,
                 last_dim_contiguous=True)  # fmt: skip
    if resolve_backend(OP, backend, dev, IMPLEMENTED) == "reference":
        out.copy_(reference_nvfp4_linear(a_codes, a_scales, a_alpha, w_codes, w_scales, w_alpha))
        return out
    if m == 0 or n == 0:
        return out
    cfg = dict(config or {"BLOCK_M": 64 if m > 16 else 16, "BLOCK_N": 128, "BLOCK_K": 128,
                          "num_warps": 4, "num_stages": 3})  # fmt: skip
    grid = (triton.cdiv(m, cfg["BLOCK_M"]), triton.cdiv(n, cfg["BLOCK_N"]))
    _nvfp4_linear_kernel[grid](
        a_codes, a_scales, a_alpha, w_codes,
        w_scales, w_alpha, out, m, n, k, a_codes.stride(0), a_scales.stride(0),
        w_codes.stride(0), w_scales.stride(0), out.stride(0),
        A_PER_ROW=a_alpha.numel() == m and m > 1, W_PER_ROW=w_alpha.numel() == n and n > 1,
        UPCAST=triton_interpreter_active() or dev.type == "cpu", **cfg,
    )  # fmt: skip
    return out


def reference_nvfp4_linear(a_codes, a_scales, a_alpha, w_codes, w_scales, w_alpha):
    """float64 product of the dequantized operands, alphas applied, one rounding to bf16."""
    a = qref.nvfp4_dequantize(a_codes, a_scales, torch.ones(1, device=a_codes.device),
                              torch.float64)  # fmt: skip
    w = qref.nvfp4_dequantize(w_codes, w_scales, torch.ones(1, device=w_codes.device),
                              torch.float64)  # fmt: skip
    y = (a @ w.t()) * a_alpha.double().reshape(-1, 1) * w_alpha.double().reshape(1, -1)
    return y.to(torch.bfloat16)
