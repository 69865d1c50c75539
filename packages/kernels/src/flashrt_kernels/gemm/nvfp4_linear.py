"""NVFP4 W4A4 GEMM for GPUs without FP4 tensor cores (Hopper): both operands arrive as e2m1 codes
with UE4M3 block scales (``quant.quantize_rows_nvfp4`` / ``reference.nvfp4_quantize``). Each weight
tile is dequantized in registers to bf16 (exactly: an e2m1 value times an e4m3 scale has at most 6
significant bits; on the GPU by the PTX byte-table lookups of ``quant.fp4_tiles``) and is the left
operand of a bf16 tensor-core dot with fp32 accumulation (the product is computed transposed, so
the few activation rows of a decode step are the dot's narrow side). Within a K block the tiles
take the codes in a fixed permuted order (both operands alike), so a lane's bytes are contiguous.
Up to 64 rows the activation tiles are dequantized in the loop too, and K is split where the tiles
alone would leave SMs idle (fp32 partials summed in split order); above 64 rows the activations
are dequantized once, to bf16, by a small kernel before the loop. The row alphas multiply in the
epilogue. It saves weight memory and bandwidth, not arithmetic.

``y[m, n] = round(alpha_a[m] * alpha_w[n] * sum_k (e2m1 * sf)_a[m, k] (e2m1 * sf)_w[n, k])``.
Contract: ``faithful`` against ``reference.nvfp4_linear`` (float64): |y - y_ref| <= 2**-8 |y_ref|
+ K * 2**-22 * sum_k |a_k w_k| alpha_a alpha_w (fp32 accumulation in tensor-core order).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashrt_kernels import arrival
from flashrt_kernels.arrival import arrived_last
from flashrt_kernels.backends import resolve_backend, sm_count, triton_interpreter_active
from flashrt_kernels.checks import check_tensor
from flashrt_kernels.quant import reference as qref
from flashrt_kernels.quant.fp4_tiles import dequant_tile
from flashrt_kernels.triton_helpers import cast_rne, grouped_tile, to_f32

OP = "nvfp4_linear"
IMPLEMENTED = ("triton", "reference")


@triton.jit
def _dequant_tile(C, SF, rows, row_ok, k0, stride_c, stride_sf, BLOCK_K: tl.constexpr,
                  UPCAST: tl.constexpr):  # fmt: skip
    """Rows ``rows`` of an NVFP4 operand (UE4M3 scales per 16) as a [rows, BLOCK_K] tile in
    ``fp4_tiles.tile_order``, the same for both operands of the dot and for the activation
    pre-pass, so the sum is over the same terms."""
    return dequant_tile(C, SF, rows, row_ok, k0, stride_c, stride_sf, BLOCK_K, 16, False, UPCAST)


@triton.jit
def _nvfp4_dequant_rows_kernel(C, SF, OUT, m, stride_c, stride_sf, stride_o,
                               BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
                               UPCAST: tl.constexpr):  # fmt: skip
    """codes * block scales -> bf16 (exact), no alpha: the activations of a large-M product."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    k0 = tl.program_id(1) * BLOCK_K
    v = _dequant_tile(C, SF, rows, rows < m, k0, stride_c, stride_sf, BLOCK_K, UPCAST)
    tl.store(OUT + rows[:, None] * stride_o + (k0 + tl.arange(0, BLOCK_K))[None, :],
             v.to(tl.bfloat16), mask=(rows < m)[:, None])  # fmt: skip


@triton.jit
def _nvfp4_linear_kernel(
    A, ASF, AA, WC, WSF, WA, Y, WS, T, m, n, k, k_split, splits, stride_a, stride_asf, stride_wc,
    stride_wsf, stride_y, A_CODES: tl.constexpr, A_PER_ROW: tl.constexpr, W_PER_ROW: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SPLIT: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """Y^T tile [BLOCK_N, BLOCK_M] = W tile (dequantized in registers, the dot's left operand)
    times A tile^T; A is NVFP4 codes dequantized here too (A_CODES) or already bf16. With SPLIT,
    program (tile, s) sums K from s * k_split to (s + 1) * k_split into fp32 workspace WS[s], and
    the tile's last program to arrive adds them in split order (``flashrt_kernels.arrival``)."""
    pid_m, pid_n = grouped_tile(tl.program_id(0), m, n, BLOCK_M, BLOCK_N, GROUP_M)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < m, cols < n
    dot_dtype: tl.constexpr = tl.float32 if UPCAST else tl.bfloat16
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    k_lo = tl.program_id(1) * k_split
    for k0 in range(k_lo, tl.minimum(k, k_lo + k_split), BLOCK_K):
        w = _dequant_tile(WC, WSF, cols, col_ok, k0, stride_wc, stride_wsf, BLOCK_K, UPCAST)
        if A_CODES:
            a = _dequant_tile(A, ASF, rows, row_ok, k0, stride_a, stride_asf, BLOCK_K, UPCAST)
        else:
            a = tl.load(A + rows[:, None] * stride_a + (k0 + tl.arange(0, BLOCK_K))[None, :],
                        mask=row_ok[:, None], other=0.0)  # fmt: skip
            if UPCAST:
                a = to_f32(a)
        acc = tl.dot(w.to(dot_dtype), tl.trans(a.to(dot_dtype)), acc)
    if SPLIT:
        ws = WS + rows[None, :] * n + cols[:, None]
        mask = col_ok[:, None] & row_ok[None, :]
        tl.store(ws + tl.program_id(1) * m * n, acc, mask=mask)
        if arrived_last(T, tl.program_id(0), splits):
            acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            for s in range(0, splits):
                acc += tl.load(ws + s * m * n, mask=mask, other=0.0, cache_modifier=".cg")
            _scale_store(acc, AA, WA, Y, rows, cols, m, n, stride_y, A_PER_ROW, W_PER_ROW)
    else:
        _scale_store(acc, AA, WA, Y, rows, cols, m, n, stride_y, A_PER_ROW, W_PER_ROW)


@triton.jit
def _scale_store(acc, AA, WA, Y, rows, cols, m, n, stride_y, A_PER_ROW: tl.constexpr,
                 W_PER_ROW: tl.constexpr):  # fmt: skip
    """Y[rows, cols] = bf16(acc^T * alpha_a * alpha_w), acc a [cols, rows] fp32 tile."""
    row_ok, col_ok = rows < m, cols < n
    aa = tl.load(AA + rows, mask=row_ok, other=0.0) if A_PER_ROW else tl.load(AA + rows * 0)
    wa = tl.load(WA + cols, mask=col_ok, other=0.0) if W_PER_ROW else tl.load(WA + cols * 0)
    y = acc * wa[:, None] * aa[None, :]
    tl.store(Y + rows[None, :].to(tl.int64) * stride_y + cols[:, None], cast_rne(y, tl.bfloat16),
             mask=col_ok[:, None] & row_ok[None, :])  # fmt: skip


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
    sms = sm_count(dev.index or 0) if dev.type == "cuda" else 132  # (interpreter: CPU tensors)
    cfg = dict(config or nvfp4_launch_config(m, n, k, sms))
    a_codes_in_loop = cfg.pop("A_CODES", m <= 64)
    split = cfg.pop("SPLIT_K", 1)
    upcast = triton_interpreter_active() or dev.type == "cpu"
    a, a_stride = a_codes, a_codes.stride(0)
    if not a_codes_in_loop:
        a = torch.empty(m, k, dtype=torch.bfloat16, device=dev)
        # (in the loop's K order: the same BLOCK_K, so the same k-pair order within a block)
        grid = (triton.cdiv(m, 32), k // cfg["BLOCK_K"])
        _nvfp4_dequant_rows_kernel[grid](a_codes, a_scales, a, m, a_codes.stride(0),
                                         a_scales.stride(0), a.stride(0), BLOCK_R=32,
                                         BLOCK_K=cfg["BLOCK_K"], UPCAST=upcast,
                                         num_warps=4, enable_fp_fusion=True)  # fmt: skip
        a_stride = a.stride(0)
    k_split = triton.cdiv(k // cfg["BLOCK_K"], split) * cfg["BLOCK_K"]
    splits = triton.cdiv(k, k_split)
    if splits > 1 and splits * m * n >= 2**31:
        raise ValueError(f"{OP}: a {splits}-way split of K needs {splits} x {m} x {n} fp32 partials, "
                         "more than 32-bit offsets address; use fewer splits")  # fmt: skip
    ws = torch.empty(splits, m, n, dtype=torch.float32, device=dev) if splits > 1 else out
    tiles = triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"])
    ticket = arrival.tickets(dev, tiles) if splits > 1 else out
    a_per_row, w_per_row = a_alpha.numel() == m and m > 1, w_alpha.numel() == n and n > 1
    _nvfp4_linear_kernel[(tiles, splits)](
        a, a_scales, a_alpha, w_codes, w_scales, w_alpha, out, ws, ticket, m, n, k, k_split,
        splits, a_stride, a_scales.stride(0), w_codes.stride(0), w_scales.stride(0), out.stride(0),
        A_CODES=a_codes_in_loop, A_PER_ROW=a_per_row, W_PER_ROW=w_per_row, SPLIT=splits > 1,
        UPCAST=upcast, **cfg, enable_fp_fusion=True,
    )  # fmt: skip
    return out


def nvfp4_launch_config(m: int, n: int, k: int, sms: int = 132) -> dict:
    """Tile for an [m, k] x [n, k] product on a GPU with ``sms`` multiprocessors, from the H100
    sweep and A/B of 2026-12-05 (``tools/tune_nvfp4.py``; docs/kernels/gemm.md). Up to 64 rows
    the activations are dequantized inside the loop (their tile is small next to the weights'),
    and K is split (fp32 partials, then a sum in split order) until there are two programs an SM,
    counted in 64-column tiles, each split at least 512 deep; up to 16 rows a K step is 256 wide
    where K allows it and the split is at most 4, above 16 a tile is 128 columns wide. Above 64
    rows the activations are dequantized once, to bf16 before the loop, so the loop dequantizes
    only the weight tile; up to 256 rows with 128-wide K steps and 4 stages where K >= 4096.
    K is a multiple of 64."""
    block_k = 128 if k % 128 == 0 else 64
    if m <= 64:
        block_m = 16 if m <= 16 else (32 if m <= 32 else 64)
        tiles, split = triton.cdiv(n, 64), 1
        while tiles * split < 2 * sms and k // block_k >= 4 * split:
            split *= 2
        if m <= 16 and k % 256 == 0 and split <= 4:
            block_k = 256
        block_n = 64 if m <= 16 else 128
        return {"A_CODES": True, "SPLIT_K": split, "BLOCK_M": block_m, "BLOCK_N": block_n,
                "BLOCK_K": block_k, "GROUP_M": 1, "num_warps": 4, "num_stages": 3}  # fmt: skip
    wide_k = m <= 256 and k >= 4096 and block_k == 128
    return {"A_CODES": False, "SPLIT_K": 1, "BLOCK_M": 128, "BLOCK_N": 128,
            "BLOCK_K": 128 if wide_k else 64, "GROUP_M": 8, "num_warps": 8,
            "num_stages": 4 if wide_k else 3}  # fmt: skip


def reference_nvfp4_linear(a_codes, a_scales, a_alpha, w_codes, w_scales, w_alpha):
    """float64 product of the dequantized operands, alphas applied, one rounding to bf16."""
    a = qref.nvfp4_dequantize(a_codes, a_scales, torch.ones(1, device=a_codes.device),
                              torch.float64)  # fmt: skip
    w = qref.nvfp4_dequantize(w_codes, w_scales, torch.ones(1, device=w_codes.device),
                              torch.float64)  # fmt: skip
    y = (a @ w.t()) * a_alpha.double().reshape(-1, 1) * w_alpha.double().reshape(1, -1)
    return y.to(torch.bfloat16)
