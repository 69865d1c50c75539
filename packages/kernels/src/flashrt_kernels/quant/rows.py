"""Row quantizers and the producers that write quantized rows straight from the op before them.

Ops (each ``exact`` against ``reference``, and each fused producer bit-identical to its separate
kernels followed by ``quantize_rows``):
- ``quantize_rows(x, fmt)``: per-row INT8 / FP8 e4m3 codes and fp32 scales;
- ``rms_norm_quantize(x, weight, eps, fmt, residual=)``: ``norm.rms_norm`` then ``quantize_rows``
  in one kernel (the RMSNorm arithmetic and column segments are the norm kernel's, so the normalized
  row is bit-identical to ``norm.rms_norm``'s output);
- ``silu_mul(gate_up)``: SwiGLU of a gate|up row (``faithful`` vs ``reference.silu_mul``: the
  exponential may differ by an ulp; output within 2 bf16 ulp);
- ``silu_mul_quantize(gate_up, fmt)``: ``silu_mul`` then ``quantize_rows``, one kernel.

The producers' launch shape (bits-neutral: sums are pairwise trees, maxima exact) is the one
measured fastest on the H200 (2026-12-04 sweep, docs/kernels/gemm.md): about 32 elements a
thread, one row a program from 1024 columns up (``_producer_config``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashrt_kernels.backends import resolve_backend, triton_interpreter_active
from flashrt_kernels.checks import check_choice, check_float, check_out, check_tensor
from flashrt_kernels.norm.rms_norm import column_split
from flashrt_kernels.norm.rms_norm import load_segment as norm_load_segment
from flashrt_kernels.quant import reference
from flashrt_kernels.quant.device import quantize_tile, quantize_tile_amax, swiglu
from flashrt_kernels.triton_helpers import cast_rne, pairwise_row_sum, rounded_f32, to_f32

FORMATS = ("int8", "fp8")
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
CODE_DTYPE = {"int8": torch.int8, "fp8": torch.float8_e4m3fn}
IMPLEMENTED = ("triton", "reference")
MAX_COLS = 32768


@triton.jit
def _store_codes(Q, S, rows, cols, mask, stride_q, v, FP8: tl.constexpr, NATIVE: tl.constexpr):
    q, scale = quantize_tile(v, mask, FP8, NATIVE)
    tl.store(Q + rows[:, None] * stride_q + cols[None, :], q, mask=mask)
    tl.store(S + rows, scale, mask=tl.max(mask.to(tl.int32), axis=1) > 0)


@triton.jit
def _quantize_rows_kernel(
    X, Q, S, n_rows, n_cols, stride_x, stride_q,
    FP8: tl.constexpr, NATIVE: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
):  # fmt: skip
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
    _store_codes(Q, S, rows, cols, mask, stride_q, to_f32(x), FP8, NATIVE)


@triton.jit
def _normed_segment(W, xf, inv, cols, col_ok, DTYPE: tl.constexpr, NATIVE: tl.constexpr):
    """norm.rms_norm's output for one segment, as fp32 values of the rounded dtype (NATIVE: the
    GPU's own rounding, the same values, ``triton_helpers.rounded_f32``)."""
    normed = rounded_f32(xf * inv[:, None], DTYPE, NATIVE)
    w = tl.load(W + cols, mask=col_ok, other=0.0)
    return rounded_f32(normed * to_f32(w)[None, :], DTYPE, NATIVE)


@triton.jit
def normed_rows(X, W, R, RO, rows, row_ok, n_cols, stride_x, stride_r, stride_ro, eps,
                HAS_RESIDUAL: tl.constexpr, BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr,
                NATIVE: tl.constexpr):  # fmt: skip
    """norm.rms_norm's output for ``rows`` (its two column segments, helpers and arithmetic, so
    the bits are its output's), as fp32 values: ``(ya, yb, amax, cols_b, ok_b)`` with ``ya`` the
    columns [0, BLOCK_A) and ``yb`` [BLOCK_A, BLOCK_A + BLOCK_B) (``ya`` again when BLOCK_B is 0),
    both zero outside the live rows and columns, and ``amax`` each row's absolute maximum."""
    cols_a = tl.arange(0, BLOCK_A)
    ok_a = cols_a < BLOCK_A
    xa = norm_load_segment(X, R, RO, rows, row_ok, cols_a, ok_a, stride_x, stride_r, stride_ro,
                           HAS_RESIDUAL)  # fmt: skip
    sum_sq = pairwise_row_sum(xa * xa)
    cols_b, ok_b, xb = cols_a, ok_a, xa
    if BLOCK_B > 0:
        cols_b = BLOCK_A + tl.arange(0, BLOCK_B)
        ok_b = cols_b < n_cols
        xb = norm_load_segment(X, R, RO, rows, row_ok, cols_b, ok_b, stride_x, stride_r,
                               stride_ro, HAS_RESIDUAL)  # fmt: skip
        sum_sq += pairwise_row_sum(xb * xb)
    inv = 1.0 / tl.sqrt(sum_sq / n_cols + eps)
    dt = X.dtype.element_ty
    ya = tl.where(row_ok[:, None], _normed_segment(W, xa, inv, cols_a, ok_a, dt, NATIVE), 0.0)
    amax = tl.max(tl.abs(ya), axis=1)
    yb = ya
    if BLOCK_B > 0:
        mask_b = row_ok[:, None] & ok_b[None, :]
        yb = tl.where(mask_b, _normed_segment(W, xb, inv, cols_b, ok_b, dt, NATIVE), 0.0)
        amax = tl.maximum(amax, tl.max(tl.abs(yb), axis=1))
    return ya, yb, amax, cols_b, ok_b


@triton.jit
def _rms_norm_quantize_kernel(
    X, W, R, RO, Q, S, n_rows, n_cols, stride_x, stride_r, stride_ro, stride_q, eps,
    HAS_RESIDUAL: tl.constexpr, FP8: tl.constexpr, NATIVE: tl.constexpr,
    BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr, ROWS: tl.constexpr,
):  # fmt: skip
    # The RMSNorm is norm.rms_norm's (normed_rows, its segments); then both column segments
    # are quantized together.
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    row_ok = rows < n_rows
    ya, yb, amax, cols_b, ok_b = normed_rows(X, W, R, RO, rows, row_ok, n_cols, stride_x,
                                             stride_r, stride_ro, eps, HAS_RESIDUAL, BLOCK_A,
                                             BLOCK_B, NATIVE)  # fmt: skip
    cols_a = tl.arange(0, BLOCK_A)
    qa, scale = quantize_tile_amax(ya, amax, FP8, NATIVE)
    mask_a = row_ok[:, None] & (cols_a < BLOCK_A)[None, :]
    tl.store(Q + rows[:, None] * stride_q + cols_a[None, :], qa, mask=mask_a)
    if BLOCK_B > 0:
        qb, scale = quantize_tile_amax(yb, amax, FP8, NATIVE)
        tl.store(Q + rows[:, None] * stride_q + cols_b[None, :], qb,
                 mask=row_ok[:, None] & ok_b[None, :])  # fmt: skip
    tl.store(S + rows, scale, mask=row_ok)


@triton.jit
def _silu_mul_kernel(
    GU, Y, Q, S, n_rows, n_cols, stride_gu, stride_y, stride_q,
    QUANTIZE: tl.constexpr, FP8: tl.constexpr, NATIVE: tl.constexpr,
    BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
):  # fmt: skip
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    base = GU + rows[:, None] * stride_gu + cols[None, :]
    g = to_f32(tl.load(base, mask=mask, other=0.0))
    u = to_f32(tl.load(base + n_cols, mask=mask, other=0.0))
    if QUANTIZE:
        h = rounded_f32(swiglu(g, u), GU.dtype.element_ty, NATIVE)
        _store_codes(Q, S, rows, cols, mask, stride_q, h, FP8, NATIVE)
    else:
        h = cast_rne(swiglu(g, u), GU.dtype.element_ty)
        tl.store(Y + rows[:, None] * stride_y + cols[None, :], h, mask=mask)


def _producer_config(width: int) -> tuple[int, int]:
    """(ROWS, num_warps) for a row producer over ``width`` padded columns: about 32 elements a
    thread, one row a program from 1024 columns up (both powers of two)."""

    def pow2_floor(v: int) -> int:
        return 1 << (max(v, 1).bit_length() - 1)

    if width >= 1024:
        return 1, min(16, pow2_floor(width // 1024))
    return pow2_floor(1024 // width), 1


def _row_config(n_cols: int) -> tuple[int, int, int]:
    block_n = triton.next_power_of_2(n_cols)
    rows = max(1, min(16, 4096 // block_n))
    elems = block_n * rows
    return block_n, rows, 4 if elems <= 2048 else (8 if elems <= 8192 else 16)


def _codes_view(q: torch.Tensor) -> torch.Tensor:
    return q.view(torch.uint8) if q.dtype == torch.float8_e4m3fn else q


def _native_fp8(device: torch.device) -> bool:
    return device.type == "cuda" and not triton_interpreter_active()


def _check_rows(op, name, x, dtypes=DTYPES, cols=None):
    check_tensor(op, name, x, dtypes=dtypes, ndim=2, last_dim_contiguous=True)
    if cols is not None and x.shape[1] != cols:
        raise ValueError(f"{op}: {name} must have {cols} columns, got {x.shape[1]}")
    if not 1 <= x.shape[1] <= MAX_COLS:
        raise ValueError(f"{op}: {name} must have 1..{MAX_COLS} columns, got {x.shape[1]}")


def _alloc_or_check(op, fmt, rows, cols, device, out):
    check_choice(op, "fmt", fmt, FORMATS)
    if out is None:
        return (
            torch.empty(rows, cols, dtype=CODE_DTYPE[fmt], device=device),
            torch.empty(rows, dtype=torch.float32, device=device),
        )
    q, s = out
    check_out(op, "out[0] (codes)", q, shape=(rows, cols), dtype=CODE_DTYPE[fmt], device=device)
    check_out(op, "out[1] (scales)", s, shape=(rows,), dtype=torch.float32, device=device)
    return q, s


def quantize_rows(x: torch.Tensor, fmt: str = "int8", *, out=None, backend: str = "auto"):
    """Per-row INT8 / FP8 quantization of a [rows, K] tensor: returns (codes, scales fp32)."""
    op = "quantize_rows"
    _check_rows(op, "x", x)
    q, s = _alloc_or_check(op, fmt, x.shape[0], x.shape[1], x.device, out)
    which = resolve_backend(op, backend, x.device, IMPLEMENTED)
    if which == "reference":
        rq, rs = reference.quantize_rows(x, fmt)
        q.copy_(rq)
        s.copy_(rs)
    elif x.shape[0]:
        block_n, rows, warps = _row_config(x.shape[1])
        _quantize_rows_kernel[(triton.cdiv(x.shape[0], rows),)](
            x, _codes_view(q), s, x.shape[0], x.shape[1], x.stride(0), q.stride(0),
            FP8=fmt == "fp8", NATIVE=_native_fp8(x.device), BLOCK_N=block_n, ROWS=rows,
            num_warps=warps, enable_fp_fusion=False,
        )  # fmt: skip
    return q, s


def check_norm_inputs(op, x, weight, eps, residual, residual_out):
    """Validates the RMSNorm producers' inputs; returns ``residual_out`` (allocated if needed)."""
    _check_rows(op, "x", x, dtypes=(torch.bfloat16, torch.float16))
    n, k = x.shape
    check_tensor(op, "weight", weight, dtypes=(x.dtype,), shape=[k], device=x.device,
                 contiguous=True)  # fmt: skip
    check_float(op, "eps", eps, positive=True)
    if residual is not None:
        check_tensor(op, "residual", residual, dtypes=(x.dtype,), shape=[n, k], device=x.device,
                     last_dim_contiguous=True)  # fmt: skip
        if residual_out is None:
            residual_out = torch.empty_like(x, memory_format=torch.contiguous_format)
        check_out(op, "residual_out", residual_out, shape=(n, k), dtype=x.dtype, device=x.device)
    elif residual_out is not None:
        raise ValueError(f"{op}: residual_out given without residual")
    return residual_out


def rms_norm_quantize(x, weight, eps: float = 1e-6, fmt: str = "int8", *, residual=None,
                      out=None, residual_out=None, backend: str = "auto"):  # fmt: skip
    """RMSNorm (+ residual) straight to quantized rows: returns (codes, scales) or, with a
    residual, (codes, scales, new_residual)."""
    op = "rms_norm_quantize"
    if fmt == "nvfp4":
        raise ValueError(f"{op}: NVFP4 has three outputs (codes, block scales, alphas): use "
                         "quant.rms_norm_quantize_nvfp4")  # fmt: skip
    residual_out = check_norm_inputs(op, x, weight, eps, residual, residual_out)
    n, k = x.shape
    q, s = _alloc_or_check(op, fmt, n, k, x.device, out)
    which = resolve_backend(op, backend, x.device, IMPLEMENTED)
    if which == "reference":
        rq, rs, rr = reference.rms_norm_quantize(x, weight, eps, residual, fmt)
        if residual is not None:
            residual_out.copy_(rr)
        q.copy_(rq)
        s.copy_(rs)
    elif n:
        block_a, block_b = column_split(k)
        rows, warps = _producer_config(block_a + block_b)
        has_res = residual is not None
        _rms_norm_quantize_kernel[(triton.cdiv(n, rows),)](
            x, weight, residual if has_res else x, residual_out if has_res else x,
            _codes_view(q), s, n, k, x.stride(0), residual.stride(0) if has_res else 0,
            residual_out.stride(0) if has_res else 0, q.stride(0), float(eps),
            HAS_RESIDUAL=has_res, FP8=fmt == "fp8", NATIVE=_native_fp8(x.device),
            BLOCK_A=block_a, BLOCK_B=block_b, ROWS=rows, num_warps=warps, enable_fp_fusion=False,
        )  # fmt: skip
    return (q, s) if residual is None else (q, s, residual_out)


def _silu_launch(gu, y, q, s, fmt, quantize):
    n, i = gu.shape[0], gu.shape[1] // 2
    if n == 0:
        return
    block_n, rows, warps = _row_config(i)
    if quantize:
        rows, warps = _producer_config(block_n)
    _silu_mul_kernel[(triton.cdiv(n, rows),)](
        gu, y if y is not None else gu, q if q is not None else gu, s if s is not None else gu,
        n, i, gu.stride(0), y.stride(0) if y is not None else 0,
        q.stride(0) if q is not None else 0,
        QUANTIZE=quantize, FP8=fmt == "fp8", NATIVE=_native_fp8(gu.device),
        BLOCK_N=block_n, ROWS=rows, num_warps=warps, enable_fp_fusion=False,
    )  # fmt: skip


def _check_gate_up(op, gate_up):
    _check_rows(op, "gate_up", gate_up, dtypes=(torch.bfloat16, torch.float16))
    if gate_up.shape[1] % 2:
        raise ValueError(f"{op}: gate_up must have an even number of columns (gate | up)")


def silu_mul(gate_up: torch.Tensor, *, out=None, backend: str = "auto") -> torch.Tensor:
    """SwiGLU of a [rows, 2I] gate|up tensor -> [rows, I] in its dtype."""
    op = "silu_mul"
    _check_gate_up(op, gate_up)
    n, i = gate_up.shape[0], gate_up.shape[1] // 2
    if out is None:
        out = torch.empty(n, i, dtype=gate_up.dtype, device=gate_up.device)
    check_out(op, "out", out, shape=(n, i), dtype=gate_up.dtype, device=gate_up.device)
    if resolve_backend(op, backend, gate_up.device, IMPLEMENTED) == "reference":
        out.copy_(reference.silu_mul(gate_up))
    else:
        _silu_launch(gate_up, out, None, None, "int8", False)
    return out


def silu_mul_quantize(gate_up, fmt: str = "int8", *, out=None, backend: str = "auto"):
    """SwiGLU of a gate|up tensor straight to quantized rows: (codes [rows, I], scales)."""
    op = "silu_mul_quantize"
    _check_gate_up(op, gate_up)
    n, i = gate_up.shape[0], gate_up.shape[1] // 2
    q, s = _alloc_or_check(op, fmt, n, i, gate_up.device, out)
    if resolve_backend(op, backend, gate_up.device, IMPLEMENTED) == "reference":
        rq, rs = reference.quantize_rows(reference.silu_mul(gate_up), fmt)
        q.copy_(rq)
        s.copy_(rs)
    else:
        _silu_launch(gate_up, None, _codes_view(q), s, fmt, True)
    return q, s


# torch.library registration (functional forms with fake implementations).
def _fake_codes(x, fmt, cols):
    return (x.new_empty(x.shape[0], cols, dtype=CODE_DTYPE[fmt]),
            x.new_empty(x.shape[0], dtype=torch.float32))  # fmt: skip


@torch.library.custom_op("flashrt::quantize_rows", mutates_args=())
def _quantize_rows_op(x: torch.Tensor, fmt: str, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    return quantize_rows(x, fmt, backend=backend)


@_quantize_rows_op.register_fake
def _(x, fmt, backend):
    return _fake_codes(x, fmt, x.shape[1])


@torch.library.custom_op("flashrt::rms_norm_quantize", mutates_args=())
def _rms_norm_quantize_op(x: torch.Tensor, weight: torch.Tensor, eps: float, fmt: str,
                          backend: str) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    return rms_norm_quantize(x, weight, eps, fmt, backend=backend)


@_rms_norm_quantize_op.register_fake
def _(x, weight, eps, fmt, backend):
    return _fake_codes(x, fmt, x.shape[1])


@torch.library.custom_op("flashrt::silu_mul", mutates_args=())
def _silu_mul_op(gate_up: torch.Tensor, backend: str) -> torch.Tensor:
    return silu_mul(gate_up, backend=backend)


@_silu_mul_op.register_fake
def _(gate_up, backend):
    return gate_up.new_empty(gate_up.shape[0], gate_up.shape[1] // 2)


@torch.library.custom_op("flashrt::silu_mul_quantize", mutates_args=())
def _silu_mul_quantize_op(gate_up: torch.Tensor, fmt: str,
                          backend: str) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    return silu_mul_quantize(gate_up, fmt, backend=backend)


@_silu_mul_quantize_op.register_fake
def _(gate_up, fmt, backend):
    return _fake_codes(gate_up, fmt, gate_up.shape[1] // 2)
