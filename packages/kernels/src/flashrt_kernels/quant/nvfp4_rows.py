"""NVFP4 row quantizer: e2m1 codes (two per byte, low nibble first), one UE4M3 scale per 16
elements, one fp32 alpha per row (``reference.nvfp4_quantize(x, per_row=True)``).

Contract: ``exact`` against that reference (codes, block scales and alphas bit for bit): every
division is correctly rounded (``tl.div_rn``), the e4m3 scale is built from the fp32 bits under
the interpreter and by the native conversion on the GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashrt_kernels.backends import resolve_backend, triton_interpreter_active
from flashrt_kernels.checks import check_out, check_tensor
from flashrt_kernels.quant import reference
from flashrt_kernels.quant.device import e2m1_code, fp32_to_e4m3_bits
from flashrt_kernels.triton_helpers import to_f32

OP = "quantize_rows_nvfp4"
IMPLEMENTED = ("triton", "reference")


@triton.jit
def _nvfp4_rows_kernel(X, Q, SF, A, n_cols, stride_x, stride_q, stride_sf,
                       NATIVE: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    col_ok = cols < n_cols
    x = to_f32(tl.load(X + row * stride_x + cols, mask=col_ok, other=0.0))
    amax = tl.maximum(tl.max(tl.abs(x), axis=0), 7.888609052210118e-31)
    g = tl.div_rn(2688.0, amax)  # 448 * 6 / amax
    xb = tl.reshape(x, (BLOCK // 16, 16))
    amax16 = tl.max(tl.abs(xb), axis=1)
    sfv = tl.minimum(tl.div_rn(g * amax16, 6.0), 448.0)
    if NATIVE:
        sf8 = sfv.to(tl.float8e4nv)
    else:
        sf8 = fp32_to_e4m3_bits(sfv).to(tl.float8e4nv, bitcast=True)
    sff = sf8.to(tl.float32)
    blocks = tl.arange(0, BLOCK // 16)
    tl.store(SF + row * stride_sf + blocks, sf8.to(tl.uint8, bitcast=True),
             mask=blocks < n_cols // 16)  # fmt: skip
    scaled = tl.div_rn(xb * g, tl.where(sff > 0, sff, 1.0)[:, None])
    mag = tl.where(sff[:, None] > 0, e2m1_code(tl.abs(scaled)), 0)
    code = mag | ((scaled < 0).to(tl.int32) << 3)
    lo, hi = tl.split(tl.reshape(code, (BLOCK // 2, 2)))
    packed = (lo | (hi << 4)).to(tl.uint8)
    half = tl.arange(0, BLOCK // 2)
    tl.store(Q + row * stride_q + half, packed, mask=half < n_cols // 2)
    tl.store(A + row + tl.arange(0, 1), tl.div_rn(1.0, g) + tl.zeros((1,), tl.float32))


def quantize_rows_nvfp4(x: torch.Tensor, *, out=None, backend: str = "auto"):
    """[rows, K] (K a multiple of 16) -> (codes uint8 [rows, K/2], block scales float8_e4m3fn
    [rows, K/16], alpha fp32 [rows]); value = e2m1 * scale * alpha."""
    check_tensor(OP, "x", x, dtypes=(torch.bfloat16, torch.float16, torch.float32), ndim=2,
                 last_dim_contiguous=True)  # fmt: skip
    m, k = x.shape
    if k % 16 or not 16 <= k <= 32768:
        raise ValueError(f"{OP}: x's K must be a multiple of 16 in [16, 32768], got {k}")
    dev = x.device
    if out is None:
        out = (torch.empty(m, k // 2, dtype=torch.uint8, device=dev),
               torch.empty(m, k // 16, dtype=torch.float8_e4m3fn, device=dev),
               torch.empty(m, dtype=torch.float32, device=dev))  # fmt: skip
    q, sf, alpha = out
    check_out(OP, "out[0] (codes)", q, shape=(m, k // 2), dtype=torch.uint8, device=dev)
    check_out(OP, "out[1] (block scales)", sf, shape=(m, k // 16), dtype=torch.float8_e4m3fn,
              device=dev)  # fmt: skip
    check_out(OP, "out[2] (alpha)", alpha, shape=(m,), dtype=torch.float32, device=dev)
    if resolve_backend(OP, backend, dev, IMPLEMENTED) == "reference":
        rq, rsf, ra = reference.nvfp4_quantize(x, per_row=True)
        q.copy_(rq)
        sf.copy_(rsf)
        alpha.copy_(ra)
    elif m:
        block = triton.next_power_of_2(k)
        _nvfp4_rows_kernel[(m,)](
            x, q, sf.view(torch.uint8), alpha, k, x.stride(0), q.stride(0), sf.stride(0),
            NATIVE=dev.type == "cuda" and not triton_interpreter_active(), BLOCK=block,
            num_warps=4 if block <= 2048 else 8,
        )  # fmt: skip
    return q, sf, alpha


@torch.library.custom_op("flashrt::quantize_rows_nvfp4", mutates_args=())
def _nvfp4_op(x: torch.Tensor, backend: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return quantize_rows_nvfp4(x, backend=backend)


@_nvfp4_op.register_fake
def _(x, backend):
    m, k = x.shape
    return (x.new_empty(m, k // 2, dtype=torch.uint8),
            x.new_empty(m, k // 16, dtype=torch.float8_e4m3fn),
            x.new_empty(m, dtype=torch.float32))  # fmt: skip
