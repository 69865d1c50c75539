"""NVFP4 rows: e2m1 codes (two per byte, low nibble first), one UE4M3 scale per 16 elements, one
fp32 alpha per row (``reference.nvfp4_quantize(x, per_row=True)``), the layout
``gemm.nvfp4_linear`` reads.

Ops:
- ``quantize_rows_nvfp4(x)``: ``exact`` against that reference (codes, block scales and alphas bit
  for bit): every division is correctly rounded (``tl.div_rn``), the e4m3 scale is built from the
  fp32 bits under the interpreter and by the native conversion on the GPU, and the code of each
  quotient ``x * g / sf`` is found by comparing ``x * g`` with the thresholds times ``sf`` (exact,
  ``device.e2m1_code_of_quotient``), with no division;
- ``rms_norm_quantize_nvfp4(x, weight, eps, residual=)``: ``norm.rms_norm`` then
  ``quantize_rows_nvfp4`` in one kernel, ``exact`` against the two kernels: the RMSNorm is
  ``quant.rows.rms_norm_quantize``'s (``norm.rms_norm``'s helpers and column segments, its sums
  pairwise trees, so the normalized rows are its bits whatever the launch shape) and the
  quantizer is the device function ``_nvfp4_tile`` that ``quantize_rows_nvfp4`` runs too (max,
  products, correctly rounded divisions and exact compares only: no reduction order or fused
  multiply-add can move a bit).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashrt_kernels.backends import maxnreg_kwargs, resolve_backend, triton_interpreter_active
from flashrt_kernels.checks import check_out, check_tensor
from flashrt_kernels.norm.rms_norm import launch_config as norm_launch_config
from flashrt_kernels.quant import reference
from flashrt_kernels.quant.device import e2m1_code_of_quotient, fp32_to_e4m3_bits
from flashrt_kernels.quant.rows import check_norm_inputs, normed_rows
from flashrt_kernels.triton_helpers import to_f32

OP = "quantize_rows_nvfp4"
IMPLEMENTED = ("triton", "reference")
MAX_COLS = 32768
WIDE_MAXNREG = 96  # register cap of the rows wider than 8192 columns (producer_launch)


@triton.jit
def _nvfp4_tile(Q, SF, rows, row_ok, col0, v, g, n_cols, stride_q, stride_sf,
                NATIVE: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    """Stores the codes and UE4M3 block scales of the fp32 [ROWS, BLOCK] tile ``v`` (columns
    ``col0 + [0, BLOCK)``, ``col0`` a multiple of 16, lanes past ``n_cols`` zero), given the rows'
    ``g = 2688 / amax`` [ROWS]."""
    vb = tl.reshape(v, (ROWS, BLOCK // 16, 16))
    amax16 = tl.max(tl.abs(vb), axis=2)
    sfv = tl.minimum(tl.div_rn(g[:, None] * amax16, 6.0), 448.0)
    if NATIVE:
        sf8 = sfv.to(tl.float8e4nv)
    else:
        sf8 = fp32_to_e4m3_bits(sfv).to(tl.float8e4nv, bitcast=True)
    sff = sf8.to(tl.float32)
    blocks = col0 // 16 + tl.arange(0, BLOCK // 16)
    tl.store(SF + rows[:, None] * stride_sf + blocks[None, :], sf8.to(tl.uint8, bitcast=True),
             mask=row_ok[:, None] & (blocks < n_cols // 16)[None, :])  # fmt: skip
    # code = e2m1(fl(y / sf)) and its sign, y = fl(x * g), without dividing (device.py). The sign
    # is the quotient's: none where it rounds to zero (|y| <= sf * 2**-150, compared scaled by
    # 2**126); a zero or NaN scale divides by 1 in the reference, so there it is y's.
    y = vb * g[:, None, None]
    s0 = tl.where(sff > 0, sff, 0.0) * -5.960464477539063e-08
    neg = y * 8.507059173023462e37 < s0[:, :, None]
    # the four bits go straight to their nibble of a little-endian word of 8 codes (low first)
    nib = (4 * (tl.arange(0, 16) % 8)).to(tl.uint32)[None, None, :]
    word = e2m1_code_of_quotient(tl.abs(y), tl.where(sff > 0, sff, float("inf"))[:, :, None], nib)
    word |= tl.where(neg, 8 << nib, 0)
    word = tl.reshape(word, (ROWS, BLOCK))
    lo, hi = tl.split(tl.reshape(word, (ROWS, BLOCK // 2, 2)))  # neighbours' disjoint bits
    lo, hi = tl.split(tl.reshape(lo | hi, (ROWS, BLOCK // 4, 2)))  # OR-ed: pairs, quads, words
    lo, hi = tl.split(tl.reshape(lo | hi, (ROWS, BLOCK // 8, 2)))
    word = lo | hi
    w_idx = col0 // 8 + tl.arange(0, BLOCK // 8)
    tl.store(Q.to(tl.pointer_type(tl.uint32)) + rows[:, None] * (stride_q // 4) + w_idx[None, :],
             word, mask=row_ok[:, None] & (w_idx < n_cols // 8)[None, :])  # fmt: skip


@triton.jit
def _row_scale(amax):
    """g = 448 * 6 / max(amax, 2**-100) per row."""
    return tl.div_rn(2688.0, tl.maximum(amax, 7.888609052210118e-31))


@triton.jit
def _nvfp4_rows_kernel(X, Q, SF, A, n_cols, stride_x, stride_q, stride_sf,
                       NATIVE: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    rows = tl.program_id(0).to(tl.int64) + tl.arange(0, 1)
    row_ok = rows >= 0
    cols = tl.arange(0, BLOCK)
    x = to_f32(tl.load(X + rows[:, None] * stride_x + cols[None, :],
                       mask=(cols < n_cols)[None, :], other=0.0))  # fmt: skip
    g = _row_scale(tl.max(tl.abs(x), axis=1))
    _nvfp4_tile(Q, SF, rows, row_ok, 0, x, g, n_cols, stride_q, stride_sf, NATIVE, 1, BLOCK)
    tl.store(A + rows, tl.div_rn(1.0, g))


@triton.jit
def _rms_norm_nvfp4_kernel(
    X, W, R, RO, Q, SF, A, n_rows, n_cols, stride_x, stride_r, stride_ro, stride_q, stride_sf, eps,
    HAS_RESIDUAL: tl.constexpr, NATIVE: tl.constexpr,
    BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr, ROWS: tl.constexpr,
):  # fmt: skip
    # The RMSNorm is norm.rms_norm's (quant.rows.normed_rows, its launch shape); segment B starts
    # at a power of two >= 16, so no 16-block straddles the segments.
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    row_ok = rows < n_rows
    ya, yb, amax, _, _ = normed_rows(X, W, R, RO, rows, row_ok, n_cols, stride_x, stride_r,
                                     stride_ro, eps, HAS_RESIDUAL, BLOCK_A, BLOCK_B,
                                     NATIVE)  # fmt: skip
    g = _row_scale(amax)
    _nvfp4_tile(Q, SF, rows, row_ok, 0, ya, g, n_cols, stride_q, stride_sf, NATIVE, ROWS, BLOCK_A)
    if BLOCK_B > 0:
        _nvfp4_tile(Q, SF, rows, row_ok, BLOCK_A, yb, g, n_cols, stride_q, stride_sf, NATIVE,
                    ROWS, BLOCK_B)  # fmt: skip
    tl.store(A + rows, tl.div_rn(1.0, g), mask=row_ok)


def producer_launch(width: int) -> tuple[int, int, int | None]:
    """(ROWS, num_warps, maxnreg) of the RMSNorm -> NVFP4 producer over ``width`` padded
    columns: 16-32 elements a thread, one row a program from 512 columns up, 4 or 8 rows on one
    warp below. (The RMSNorm's sums are pairwise trees over norm.rms_norm's column segments, so
    the launch shape moves no bit.) Two-row tiles and some four-row ones (768 columns on 4 warps)
    compile to code that spills the quantizer's registers, 20-100x the instructions (Triton
    3.6-3.9, sm_90), so none is used. Rows wider than 8192 columns run on 8 warps capped at 96
    registers a thread: uncapped, Triton 3.6 gave them more than 128, so one program held an SM
    (12.5% occupancy; 0.33 of the floor at 11008 columns, 0.51 capped, on an H100)."""
    if width > 8192:
        return 1, 8, WIDE_MAXNREG
    if width >= 512:
        return 1, max(1, min(16, 1 << (max(width // 1024, 1).bit_length() - 1))), None
    return min(8, 1 << ((1024 // width).bit_length() - 1)), 1, None


def _native(dev: torch.device) -> bool:
    return dev.type == "cuda" and not triton_interpreter_active()


def _check_cols(op: str, k: int) -> None:
    if k % 16 or not 16 <= k <= MAX_COLS:
        raise ValueError(f"{op}: x's K must be a multiple of 16 in [16, {MAX_COLS}], got {k}")


def _alloc_or_check(op, m, k, dev, out):
    if out is None:
        return (torch.empty(m, k // 2, dtype=torch.uint8, device=dev),
                torch.empty(m, k // 16, dtype=torch.float8_e4m3fn, device=dev),
                torch.empty(m, dtype=torch.float32, device=dev))  # fmt: skip
    q, sf, alpha = out
    check_out(op, "out[0] (codes)", q, shape=(m, k // 2), dtype=torch.uint8, device=dev)
    check_out(op, "out[1] (block scales)", sf, shape=(m, k // 16), dtype=torch.float8_e4m3fn,
              device=dev)  # fmt: skip
    check_out(op, "out[2] (alpha)", alpha, shape=(m,), dtype=torch.float32, device=dev)
    if q.data_ptr() % 4:
        raise ValueError(f"{op}: out[0] (codes) must start 4-byte aligned (the codes are stored "
                         "as 32-bit words); got a view at an odd offset")  # fmt: skip
    return q, sf, alpha


def _copy_outputs(outs, ref) -> None:
    for o, r in zip(outs, ref, strict=True):
        o.copy_(r)


def quantize_rows_nvfp4(x: torch.Tensor, *, out=None, backend: str = "auto"):
    """[rows, K] (K a multiple of 16) -> (codes uint8 [rows, K/2], block scales float8_e4m3fn
    [rows, K/16], alpha fp32 [rows]); value = e2m1 * scale * alpha."""
    check_tensor(OP, "x", x, dtypes=(torch.bfloat16, torch.float16, torch.float32), ndim=2,
                 last_dim_contiguous=True)  # fmt: skip
    m, k = x.shape
    _check_cols(OP, k)
    dev = x.device
    q, sf, alpha = _alloc_or_check(OP, m, k, dev, out)
    if resolve_backend(OP, backend, dev, IMPLEMENTED) == "reference":
        _copy_outputs((q, sf, alpha), reference.nvfp4_quantize(x, per_row=True))
    elif m:
        block = triton.next_power_of_2(k)
        _nvfp4_rows_kernel[(m,)](
            x, q, sf.view(torch.uint8), alpha, k, x.stride(0), q.stride(0), sf.stride(0),
            NATIVE=_native(dev), BLOCK=block, num_warps=max(1, min(16, block // 1024)),
            enable_fp_fusion=False,
        )  # fmt: skip
    return q, sf, alpha


def rms_norm_quantize_nvfp4(x, weight, eps: float = 1e-6, *, residual=None, out=None,
                            residual_out=None, backend: str = "auto"):  # fmt: skip
    """RMSNorm (+ residual) of bf16 / fp16 [rows, K] rows (K a multiple of 16) straight to NVFP4
    rows: returns (codes, block scales, alpha) as ``quantize_rows_nvfp4`` or, with a residual,
    (codes, block scales, alpha, new_residual). ``residual_out`` may be ``residual`` itself."""
    op = "rms_norm_quantize_nvfp4"
    residual_out = check_norm_inputs(op, x, weight, eps, residual, residual_out)
    m, k = x.shape
    _check_cols(op, k)
    dev = x.device
    q, sf, alpha = _alloc_or_check(op, m, k, dev, out)
    if resolve_backend(op, backend, dev, IMPLEMENTED) == "reference":
        *ref, new_res = reference.rms_norm_quantize_nvfp4(x, weight, eps, residual)
        if residual is not None:
            residual_out.copy_(new_res)
        _copy_outputs((q, sf, alpha), ref)
    elif m:
        block_a, block_b, _, _ = norm_launch_config(k)
        rows, warps, maxnreg = producer_launch(block_a + block_b)
        cap = maxnreg_kwargs(maxnreg)
        has_res = residual is not None
        _rms_norm_nvfp4_kernel[(triton.cdiv(m, rows),)](
            x, weight, residual if has_res else x, residual_out if has_res else x, q,
            sf.view(torch.uint8), alpha, m, k, x.stride(0),
            residual.stride(0) if has_res else 0, residual_out.stride(0) if has_res else 0,
            q.stride(0), sf.stride(0), float(eps), HAS_RESIDUAL=has_res, NATIVE=_native(dev),
            BLOCK_A=block_a, BLOCK_B=block_b, ROWS=rows, num_warps=warps, enable_fp_fusion=False,
            **cap,
        )  # fmt: skip
    return (q, sf, alpha) if residual is None else (q, sf, alpha, residual_out)


# torch.library registration (functional forms with fake implementations).
def _fake_nvfp4(x):
    m, k = x.shape
    return (x.new_empty(m, k // 2, dtype=torch.uint8),
            x.new_empty(m, k // 16, dtype=torch.float8_e4m3fn),
            x.new_empty(m, dtype=torch.float32))  # fmt: skip


@torch.library.custom_op("flashrt::quantize_rows_nvfp4", mutates_args=())
def _nvfp4_op(x: torch.Tensor, backend: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return quantize_rows_nvfp4(x, backend=backend)


@_nvfp4_op.register_fake
def _(x, backend):
    return _fake_nvfp4(x)


@torch.library.custom_op("flashrt::rms_norm_quantize_nvfp4", mutates_args=())
def _rms_norm_nvfp4_op(
    x: torch.Tensor, weight: torch.Tensor, eps: float, backend: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return rms_norm_quantize_nvfp4(x, weight, eps, backend=backend)


@_rms_norm_nvfp4_op.register_fake
def _(x, weight, eps, backend):
    return _fake_nvfp4(x)


@torch.library.custom_op("flashrt::add_rms_norm_quantize_nvfp4", mutates_args=())
def _add_rms_norm_nvfp4_op(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, backend: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return rms_norm_quantize_nvfp4(x, weight, eps, residual=residual, backend=backend)


@_add_rms_norm_nvfp4_op.register_fake
def _(x, residual, weight, eps, backend):
    return (*_fake_nvfp4(x), torch.empty_like(x, memory_format=torch.contiguous_format))
