"""Fused RMSNorm with an optional residual add, as one Triton kernel.

Contract (see ``reference.rms_norm`` for the order of operations):
- the new residual (``x + residual`` rounded to the dtype): ``exact``;
- the normalized output: ``faithful``; only the fp32 sum of squares is reduced in another order,
  so ``|y - y_ref| <= RTOL[dtype] * |y_ref| + smallest_normal(dtype)`` with RTOL 2e-5 for fp32
  and 1.5 ulp for bf16 / fp16 (one ulp from the rounded intermediate, half from the weight product);
- rows are independent: a row's output is bit-identical whatever the number of rows (``exact``).
A row holding +-inf gives NaN where it is infinite and (signed) zero elsewhere, as the reference
evaluates on a CPU (torch's CUDA ``rsqrt(inf)`` is NaN, so its own GPU result differs there).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashrt_kernels.backends import resolve_backend
from flashrt_kernels.checks import check_float, check_out, check_tensor
from flashrt_kernels.norm import reference
from flashrt_kernels.triton_helpers import cast_rne, to_f32

OP = "rms_norm"
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_COLS = 65536
RTOL = {torch.float32: 2e-5, torch.bfloat16: 1.5 * 2**-7, torch.float16: 1.5 * 2**-10}
IMPLEMENTED = ("triton", "reference")


@triton.jit
def _rms_norm_kernel(
    X, W, R, Y, RO,
    n_rows, n_cols,
    stride_x, stride_r, stride_y, stride_ro,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
):  # fmt: skip
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < n_cols
    mask = (rows < n_rows)[:, None] & col_ok[None, :]
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(R + rows[:, None] * stride_r + cols[None, :], mask=mask, other=0.0)
        x = cast_rne(to_f32(x) + to_f32(r), x.dtype)
        tl.store(RO + rows[:, None] * stride_ro + cols[None, :], x, mask=mask)
    xf = to_f32(x)
    mean_sq = tl.sum(xf * xf, axis=1) / n_cols
    inv = 1.0 / tl.sqrt(mean_sq + eps)
    normed = cast_rne(xf * inv[:, None], x.dtype)
    w = tl.load(W + cols, mask=col_ok, other=0.0)
    y = to_f32(normed) * to_f32(w)[None, :]
    tl.store(
        Y + rows[:, None] * stride_y + cols[None, :], cast_rne(y, Y.dtype.element_ty), mask=mask
    )


def launch_config(n_cols: int) -> tuple[int, int, int]:
    """(BLOCK_N, ROWS, num_warps): a function of the row width only, so a row's reduction order
    never depends on how many rows there are."""
    block_n = triton.next_power_of_2(n_cols)
    rows = max(1, min(16, 4096 // block_n))
    elems = block_n * rows
    num_warps = 4 if elems <= 2048 else (8 if elems <= 8192 else 16)
    return block_n, rows, num_warps


def _launch_triton(x2, weight, eps, r2, y2, ro2, config=None) -> None:
    """``config`` overrides ``launch_config`` (used by the tuning script only)."""
    n_rows, n_cols = x2.shape
    if n_rows == 0:
        return
    block_n, rows, num_warps = config or launch_config(n_cols)
    has_res = r2 is not None
    _rms_norm_kernel[(triton.cdiv(n_rows, rows),)](
        x2, weight, r2 if has_res else x2, y2, ro2 if has_res else y2,
        n_rows, n_cols,
        x2.stride(0), r2.stride(0) if has_res else 0, y2.stride(0), ro2.stride(0) if has_res else 0,
        eps,
        HAS_RESIDUAL=has_res, BLOCK_N=block_n, ROWS=rows, num_warps=num_warps,
    )  # fmt: skip


def _as_rows(op: str, name: str, t: torch.Tensor) -> torch.Tensor:
    """A [rows, cols] view with unit column stride, without copying."""
    if t.dim() == 2:
        check_tensor(op, name, t, last_dim_contiguous=True)
        return t
    check_tensor(op, name, t, contiguous=True)
    return t.view(-1, t.shape[-1])


def _validate(x, weight, eps, residual, out, residual_out):
    check_tensor(OP, "x", x, dtypes=DTYPES, ndim=(1, 2, 3, 4))
    n_cols = x.shape[-1]
    if not 1 <= n_cols <= MAX_COLS:
        raise ValueError(f"{OP}: x's last dimension must be in [1, {MAX_COLS}], got {n_cols}")
    check_tensor(
        OP, "weight", weight, dtypes=(x.dtype,), shape=[n_cols], device=x.device, contiguous=True
    )
    check_float(OP, "eps", eps, positive=True)
    if residual is not None:
        check_tensor(
            OP, "residual", residual, dtypes=(x.dtype,), shape=list(x.shape), device=x.device
        )
    if out is not None:
        check_out(OP, "out", out, shape=x.shape, dtype=x.dtype, device=x.device)
    if residual_out is not None:
        if residual is None:
            raise ValueError(f"{OP}: residual_out given without residual")
        check_out(OP, "residual_out", residual_out, shape=x.shape, dtype=x.dtype, device=x.device)


def rms_norm_into(x, weight, eps, residual, out, residual_out, backend) -> None:
    """Writes ``out`` (and ``residual_out``); inputs already validated. No allocation, no sync."""
    which = resolve_backend(OP, backend, x.device, IMPLEMENTED)
    if which == "reference":
        y, r = reference.rms_norm(x, weight, eps, residual)
        if r is not None:
            residual_out.copy_(r)
        out.copy_(y)
        return
    x2 = _as_rows(OP, "x", x)
    r2 = _as_rows(OP, "residual", residual) if residual is not None else None
    ro2 = residual_out.view(-1, x.shape[-1]) if residual is not None else None
    _launch_triton(x2, weight, float(eps), r2, out.view(-1, x.shape[-1]), ro2)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    residual_out: torch.Tensor | None = None,
    backend: str = "auto",
):
    """RMSNorm over the last dimension, optionally of ``x + residual``.

    Returns ``y`` without a residual, ``(y, x + residual)`` with one. ``out`` / ``residual_out``
    are written when given (no allocation: CUDA-graph safe); ``residual_out`` may be ``residual``
    itself (in-place update of the residual stream) and ``out`` may be ``x``.
    """
    _validate(x, weight, eps, residual, out, residual_out)
    if torch.compiler.is_compiling():
        return _compiled_call(x, weight, eps, residual, out, residual_out, backend)
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if residual is not None and residual_out is None:
        residual_out = torch.empty_like(x, memory_format=torch.contiguous_format)
    rms_norm_into(x, weight, eps, residual, out, residual_out, backend)
    return out if residual is None else (out, residual_out)


def _compiled_call(x, weight, eps, residual, out, residual_out, backend):
    """Under torch.compile the op goes through its registered custom op."""
    ops = torch.ops.flashrt
    if residual is None:
        if out is None:
            return ops.rms_norm(x, weight, eps, backend)
        ops.rms_norm_out(x, weight, eps, out, backend)
        return out
    if out is None or residual_out is None:
        return ops.add_rms_norm(x, residual, weight, eps, backend)
    ops.add_rms_norm_out(x, residual, weight, eps, out, residual_out, backend)
    return out, residual_out


# torch.library registration: functional ops with fake (meta) implementations, and out variants.
@torch.library.custom_op("flashrt::rms_norm", mutates_args=())
def _rms_norm_op(x: torch.Tensor, weight: torch.Tensor, eps: float, backend: str) -> torch.Tensor:
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    rms_norm_into(x, weight, eps, None, out, None, backend)
    return out


@_rms_norm_op.register_fake
def _(x, weight, eps, backend):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("flashrt::rms_norm_out", mutates_args=("out",))
def _rms_norm_out_op(
    x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor, backend: str
) -> None:
    rms_norm_into(x, weight, eps, None, out, None, backend)


@torch.library.custom_op("flashrt::add_rms_norm", mutates_args=())
def _add_rms_norm_op(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, backend: str
) -> tuple[torch.Tensor, torch.Tensor]:
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    new_res = torch.empty_like(x, memory_format=torch.contiguous_format)
    rms_norm_into(x, weight, eps, residual, out, new_res, backend)
    return out, new_res


@_add_rms_norm_op.register_fake
def _(x, residual, weight, eps, backend):
    like = torch.empty_like(x, memory_format=torch.contiguous_format)
    return like, torch.empty_like(like)


@torch.library.custom_op("flashrt::add_rms_norm_out", mutates_args=("out", "residual_out"))
def _add_rms_norm_out_op(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    out: torch.Tensor,
    residual_out: torch.Tensor,
    backend: str,
) -> None:
    rms_norm_into(x, weight, eps, residual, out, residual_out, backend)
