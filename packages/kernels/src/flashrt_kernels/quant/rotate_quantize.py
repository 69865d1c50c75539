"""ParoQuant activation preparation in one kernel: channel scale, the rotation layers, row absmax
and per-token INT8, the input of ``gemm.w4a8_linear`` for rotated INT4 weights.

Contract: ``exact`` against ``reference.quantize_rows(paroquant.rotate_activations(x, rot),
"int8")``: the kernel runs without fp fusion, so each layer's ``c * x_i + s * x_j`` rounds both
products and the sum separately, as torch does. Each program owns one row: it keeps the row in an
fp32 workspace row, and a block barrier separates the layers (pairs of one layer are disjoint, so
within a layer no lane reads what another writes).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashrt_kernels.backends import resolve_backend
from flashrt_kernels.checks import check_out, check_tensor
from flashrt_kernels.quant import paroquant, reference
from flashrt_kernels.quant.device import quantize_tile
from flashrt_kernels.triton_helpers import to_f32

OP = "rotate_quantize_rows"
IMPLEMENTED = ("triton", "reference")


@triton.jit
def _rotate_quantize_kernel(
    X, CS, PI, PJ, COS, SIN, WS, Q, S, n_cols, stride_x, stride_q, layers,
    BLOCK_K: tl.constexpr, BLOCK_P: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_K)
    col_ok = cols < n_cols
    x = to_f32(tl.load(X + row * stride_x + cols, mask=col_ok, other=0.0))
    cs = tl.load(CS + cols, mask=col_ok, other=0.0)
    ws = WS + row * n_cols
    tl.store(ws + cols, x * cs, mask=col_ok)
    tl.debug_barrier()
    p = tl.arange(0, BLOCK_P)
    p_ok = p < n_cols // 2
    for layer in range(layers):
        off = layer * (n_cols // 2) + p
        i = tl.load(PI + off, mask=p_ok, other=0)
        j = tl.load(PJ + off, mask=p_ok, other=0)
        c = tl.load(COS + off, mask=p_ok, other=0.0)
        s = tl.load(SIN + off, mask=p_ok, other=0.0)
        xi = tl.load(ws + i, mask=p_ok, other=0.0)
        xj = tl.load(ws + j, mask=p_ok, other=0.0)
        tl.store(ws + i, c * xi + s * xj, mask=p_ok)
        tl.store(ws + j, -s * xi + c * xj, mask=p_ok)
        tl.debug_barrier()
    v = tl.load(ws + cols, mask=col_ok, other=0.0)
    q, scale = quantize_tile(v[None, :], col_ok[None, :], False, False)
    tl.store(Q + row * stride_q + cols[None, :], q, mask=col_ok[None, :])
    tl.store(S + row + tl.arange(0, 1), scale)


def rotate_quantize_rows(x, rot: paroquant.Rotation, *, out=None, workspace=None,
                         backend: str = "auto"):  # fmt: skip
    """bf16 / fp16 / fp32 rows [M, K] -> (INT8 codes [M, K], scales fp32 [M]) of
    ``R(x * channel_scales)``. ``workspace`` (fp32 [M, K]) is the kernel's scratch; passing it
    makes the call allocation-free."""
    check_tensor(OP, "x", x, dtypes=(torch.bfloat16, torch.float16, torch.float32), ndim=2,
                 last_dim_contiguous=True)  # fmt: skip
    m, k = x.shape
    if not isinstance(rot, paroquant.Rotation) or rot.channel_scales.numel() != k:
        raise ValueError(f"{OP}: rot must be a paroquant.Rotation over K = {k} channels")
    for name in ("pair_i", "pair_j", "cos", "sin", "channel_scales"):
        check_tensor(OP, f"rot.{name}", getattr(rot, name), device=x.device, contiguous=True)
    if out is None:
        out = (torch.empty(m, k, dtype=torch.int8, device=x.device),
               torch.empty(m, dtype=torch.float32, device=x.device))  # fmt: skip
    q, s = out
    check_out(OP, "out[0] (codes)", q, shape=(m, k), dtype=torch.int8, device=x.device)
    check_out(OP, "out[1] (scales)", s, shape=(m,), dtype=torch.float32, device=x.device)
    if resolve_backend(OP, backend, x.device, IMPLEMENTED) == "reference":
        rq, rs = reference.quantize_rows(paroquant.rotate_activations(x, rot), "int8")
        q.copy_(rq)
        s.copy_(rs)
        return q, s
    if workspace is None:
        workspace = torch.empty(m, k, dtype=torch.float32, device=x.device)
    check_out(OP, "workspace", workspace, shape=(m, k), dtype=torch.float32, device=x.device)
    if m == 0:
        return q, s
    block_k = triton.next_power_of_2(k)
    warps = 4 if block_k <= 2048 else (8 if block_k <= 8192 else 16)
    _rotate_quantize_kernel[(m,)](
        x, rot.channel_scales, rot.pair_i, rot.pair_j, rot.cos, rot.sin, workspace, q, s,
        k, x.stride(0), q.stride(0), rot.layers,
        BLOCK_K=block_k, BLOCK_P=max(1, block_k // 2), num_warps=warps, enable_fp_fusion=False,
    )  # fmt: skip
    return q, s


@torch.library.custom_op("flashrt::rotate_quantize_rows", mutates_args=())
def _rotate_quantize_op(x: torch.Tensor, pair_i: torch.Tensor, pair_j: torch.Tensor,
                        cos: torch.Tensor, sin: torch.Tensor, channel_scales: torch.Tensor,
                        backend: str) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    rot = paroquant.Rotation(pair_i, pair_j, cos, sin, channel_scales)
    return rotate_quantize_rows(x, rot, backend=backend)


@_rotate_quantize_op.register_fake
def _(x, pair_i, pair_j, cos, sin, channel_scales, backend):
    return x.new_empty(x.shape, dtype=torch.int8), x.new_empty(x.shape[0], dtype=torch.float32)
