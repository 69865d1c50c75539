"""FP8 W8A8 prefill GEMM (Hopper wgmma through ``tl.dot`` on float8_e4m3fn) with fused epilogues.

``y = act(acc * xs[m] * ws[n] + bias[n]) + residual[m, n]`` -> bf16, ``acc`` the fp32 dot of the
e4m3 codes (``xq`` [M, K] per-row scales ``xs``, ``wq`` [N, K] per-output-channel scales ``ws``);
``act`` is none, GELU tanh or GELU erf; ``out`` may be a column slice of a wider buffer (its own
leading dimension).

Contract: ``faithful`` against ``reference.fp8_linear`` (float64): |y - y_ref| <= 2**-7 |y_ref| +
2**-20 * K * sum_k |xq_k wq_k| xs ws (+ the same bound through the GELU, whose slope is < 1.2):
fp32 accumulation in tensor-core order, the epilogue in fp32, one bf16 rounding.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashrt_kernels.backends import resolve_backend, sm_count
from flashrt_kernels.checks import check_choice, check_tensor
from flashrt_kernels.gemm import reference
from flashrt_kernels.triton_helpers import cast_rne, grouped_tile

OP = "fp8_linear"
ACTIVATIONS = ("none", "gelu_tanh", "gelu_erf")
IMPLEMENTED = ("triton", "reference")


# Named tiles (BLOCK_M, BLOCK_N, num_warps, num_stages), BLOCK_K 128 and GROUP_M 8 for all.
TILES = {
    "m64_n64": (64, 64, 4, 4),
    "m64_n128": (64, 128, 4, 4),
    "m128_n128": (128, 128, 8, 3),
    "m128_n256": (128, 256, 8, 3),
}
SMS = 132  # the H200's SM count (the default of ``tile_for``; launches pass their device's)


def tile_for(m: int, n: int, sms: int = SMS) -> str:
    """The tile measured fastest on the H200 (2026-12-04 sweep over the ActiveVLN prefill and
    vision shapes, docs/kernels/gemm.md): the bench's large problems (M >= 2048, N >= 4096) keep
    128 x 256; otherwise the largest tile whose grid still fills the SMs (128-row tiles only from
    256 rows: below that they mostly compute padding), else 64 x 64."""
    if m <= 64:
        return "m64_n128"
    if m >= 2048 and n >= 4096:
        return "m128_n256"
    for name in ("m128_n128", "m64_n128"):
        bm, bn = TILES[name][:2]
        if (bm == 64 or m >= 256) and triton.cdiv(m, bm) * triton.cdiv(n, bn) >= sms:
            return name
    return "m64_n64"


def launch_config(m: int, n: int, tile: str | None = None, sms: int = SMS) -> dict:
    """Launch parameters of ``tile`` (default ``tile_for(m, n, sms)``); no tile changes the
    contract (tensor-core order within the bound either way)."""
    bm, bn, warps, stages = TILES[tile or tile_for(m, n, sms)]
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": warps,
            "num_stages": stages}  # fmt: skip


@triton.jit
def _gelu(v, ERF: tl.constexpr):
    if ERF:
        return 0.5 * v * (1.0 + tl.erf(v * 0.7071067811865476))
    u = 0.7978845608028654 * (v + 0.044715 * v * v * v)
    t = 1.0 - 2.0 / (1.0 + tl.exp(2.0 * u))  # tanh(u)
    return 0.5 * v * (1.0 + t)


@triton.jit
def _fp8_linear_kernel(
    XQ, XS, WQ, WS, B, R, Y, m, n, k, stride_x, stride_w, stride_r, stride_y,
    HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, ACT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    pid_m, pid_n = grouped_tile(tl.program_id(0), m, n, BLOCK_M, BLOCK_N, GROUP_M)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_ok, col_ok = rows < m, cols < n
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, k, BLOCK_K):
        k_ok = (k0 + ks) < k
        a = tl.load(XQ + rows[:, None].to(tl.int64) * stride_x + (k0 + ks)[None, :],
                    mask=row_ok[:, None] & k_ok[None, :], other=0.0)  # fmt: skip
        b = tl.load(WQ + cols[None, :].to(tl.int64) * stride_w + (k0 + ks)[:, None],
                    mask=col_ok[None, :] & k_ok[:, None], other=0.0)  # fmt: skip
        acc = tl.dot(a, b, acc)
    xs = tl.load(XS + rows, mask=row_ok, other=0.0)
    ws = tl.load(WS + cols, mask=col_ok, other=0.0)
    v = acc * xs[:, None] * ws[None, :]
    if HAS_BIAS:
        v += tl.load(B + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if ACT == 1:
        v = _gelu(v, False)
    elif ACT == 2:
        v = _gelu(v, True)
    mask = row_ok[:, None] & col_ok[None, :]
    if HAS_RES:
        v += tl.load(R + rows[:, None].to(tl.int64) * stride_r + cols[None, :], mask=mask,
                     other=0.0).to(tl.float32)  # fmt: skip
    tl.store(Y + rows[:, None].to(tl.int64) * stride_y + cols[None, :], cast_rne(v, tl.bfloat16),
             mask=mask)  # fmt: skip


def fp8_linear(xq, xs, wq, ws, *, bias=None, residual=None, activation: str = "none", out=None,
               backend: str = "auto", config=None):  # fmt: skip
    """FP8 W8A8 GEMM with the bias / GELU / residual epilogue: -> bf16 [M, N]."""
    check_tensor(OP, "xq", xq, dtypes=(torch.float8_e4m3fn,), ndim=2, last_dim_contiguous=True)
    m, k = xq.shape
    dev = xq.device
    check_tensor(OP, "wq", wq, dtypes=(torch.float8_e4m3fn,), ndim=2, shape=[None, k],
                 device=dev, last_dim_contiguous=True)  # fmt: skip
    n = wq.shape[0]
    check_tensor(OP, "xs", xs, dtypes=(torch.float32,), shape=[m], device=dev, contiguous=True)
    check_tensor(OP, "ws", ws, dtypes=(torch.float32,), shape=[n], device=dev, contiguous=True)
    check_choice(OP, "activation", activation, ACTIVATIONS)
    if bias is not None:
        check_tensor(OP, "bias", bias, dtypes=(torch.bfloat16, torch.float32), shape=[n],
                     device=dev, contiguous=True)  # fmt: skip
    if residual is not None:
        check_tensor(OP, "residual", residual, dtypes=(torch.bfloat16,), shape=[m, n],
                     device=dev, last_dim_contiguous=True)  # fmt: skip
    if out is None:
        out = torch.empty(m, n, dtype=torch.bfloat16, device=dev)
    check_tensor(OP, "out", out, dtypes=(torch.bfloat16,), shape=[m, n], device=dev,
                 last_dim_contiguous=True)  # fmt: skip
    if resolve_backend(OP, backend, dev, IMPLEMENTED) == "reference":
        out.copy_(reference.fp8_linear(xq, xs, wq, ws, bias, activation, residual))
        return out
    if m == 0 or n == 0:
        return out
    sms = sm_count(dev.index or 0) if dev.type == "cuda" else SMS  # (interpreter: CPU tensors)
    cfg = dict(config or launch_config(m, n, sms=sms))
    grid = (triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"]),)
    _fp8_linear_kernel[grid](
        xq, xs, wq, ws, bias if bias is not None else xs, residual if residual is not None else out,
        out, m, n, k, xq.stride(0), wq.stride(0),
        residual.stride(0) if residual is not None else 0, out.stride(0),
        HAS_BIAS=bias is not None, HAS_RES=residual is not None,
        ACT=ACTIVATIONS.index(activation), **cfg, enable_fp_fusion=True,
    )  # fmt: skip
    return out


@torch.library.custom_op("flashrt::fp8_linear", mutates_args=())
def _fp8_linear_op(xq: torch.Tensor, xs: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor,
                   bias: torch.Tensor | None, residual: torch.Tensor | None, activation: str,
                   backend: str) -> torch.Tensor:  # fmt: skip
    return fp8_linear(xq, xs, wq, ws, bias=bias, residual=residual, activation=activation,
                      backend=backend)  # fmt: skip


@_fp8_linear_op.register_fake
def _(xq, xs, wq, ws, bias, residual, activation, backend):
    return xq.new_empty(xq.shape[0], wq.shape[0], dtype=torch.bfloat16)
