"""Segmented attention for vision towers: variable-length segments packed back to back.

Segment ``s`` is tokens ``cu_seqlens[s] .. cu_seqlens[s + 1]`` of q ``[T, Hq, d]`` and k/v
``[T, Hkv, d]``; attention is non-causal inside a segment and never crosses one (Qwen2.5-VL windows,
whole images, Qwen3-VL per-image attention). One program: a tile of ``BLOCK_M`` queries of one
segment and head, walking that segment's keys.

Head dims that are not powers of two (72, 80) are split into a power-of-two part and a small tail
(64 + 16) instead of padding to 128, so the tensor cores do at most 16 columns of padding work.

Contracts: ``faithful`` to ``reference.segmented_attention`` with the bound of ``decode``
(``ATOL_V[dtype] * max|v| + RTOL[dtype] * |ref|``); a segment's output is bit-identical whatever the
other segments are (``exact``: the tile geometry depends only on the head dim). Tokens outside
every segment are not written.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from flashrt_kernels.attention import reference
from flashrt_kernels.attention.decode import DTYPES, MAX_HEAD_DIM
from flashrt_kernels.attention.gqa_kernels import LOG2E, _round_to
from flashrt_kernels.backends import resolve_backend, triton_interpreter_active
from flashrt_kernels.checks import check_float, check_int, check_no_alias, check_out, check_tensor

OP = "segmented_attention"
IMPLEMENTED = ("triton", "reference")


def head_dim_split(d: int) -> tuple[int, int]:
    """(power-of-two part, tail width; 0 without a tail), both tl.dot-sized (>= 16)."""
    hi = max(16, 1 << (d.bit_length() - 1))
    rest = d - hi
    lo = 0 if rest <= 0 else max(16, triton.next_power_of_2(rest))
    return hi, lo


def launch_config(d: int) -> dict:
    """Tile geometry: a function of the head dim only (segments stay independent bit for bit)."""
    return {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2}


@triton.jit
def segmented_attention_kernel(
    Q, K, V, Out, CuSeqlens,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    qk_scale,
    G: tl.constexpr, HEAD_DIM: tl.constexpr, D_HI: tl.constexpr, D_LO: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    tile = tl.program_id(0)
    seg = tl.program_id(1)
    hq = tl.program_id(2)
    hk = hq // G
    first = tl.load(CuSeqlens + seg)
    n = tl.load(CuSeqlens + seg + 1) - first
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < n
    end = tl.where(tile * BLOCK_M < n, n, 0)
    tok = (first + rows).to(tl.int64)
    dh = tl.arange(0, D_HI)
    dh_ok = dh < HEAD_DIM
    q_hi = tl.load(Q + tok[:, None] * stride_qt + hq * stride_qh + dh[None, :],
                   mask=row_ok[:, None] & dh_ok[None, :], other=0.0)  # fmt: skip
    if UPCAST:
        q_hi = q_hi.to(tl.float32)
    acc_hi = tl.zeros([BLOCK_M, D_HI], tl.float32)
    if D_LO > 0:
        dl = D_HI + tl.arange(0, D_LO)
        dl_ok = dl < HEAD_DIM
        q_lo = tl.load(Q + tok[:, None] * stride_qt + hq * stride_qh + dl[None, :],
                       mask=row_ok[:, None] & dl_ok[None, :], other=0.0)  # fmt: skip
        if UPCAST:
            q_lo = q_lo.to(tl.float32)
        acc_lo = tl.zeros([BLOCK_M, D_LO], tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    for n0 in range(0, end, BLOCK_N):
        kv = n0 + tl.arange(0, BLOCK_N)
        kv_ok = kv < n
        kt = (first + kv).to(tl.int64)
        k_hi = tl.load(K + kt[:, None] * stride_kt + hk * stride_kh + dh[None, :],
                       mask=kv_ok[:, None] & dh_ok[None, :], other=0.0)  # fmt: skip
        v_hi = tl.load(V + kt[:, None] * stride_vt + hk * stride_vh + dh[None, :],
                       mask=kv_ok[:, None] & dh_ok[None, :], other=0.0)  # fmt: skip
        if UPCAST:
            k_hi = k_hi.to(tl.float32)
            v_hi = v_hi.to(tl.float32)
        s = tl.dot(q_hi, tl.trans(k_hi))
        if D_LO > 0:
            k_lo = tl.load(K + kt[:, None] * stride_kt + hk * stride_kh + dl[None, :],
                           mask=kv_ok[:, None] & dl_ok[None, :], other=0.0)  # fmt: skip
            v_lo = tl.load(V + kt[:, None] * stride_vt + hk * stride_vh + dl[None, :],
                           mask=kv_ok[:, None] & dl_ok[None, :], other=0.0)  # fmt: skip
            if UPCAST:
                k_lo = k_lo.to(tl.float32)
                v_lo = v_lo.to(tl.float32)
            s += tl.dot(q_lo, tl.trans(k_lo))
        s = tl.where(kv_ok[None, :], s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        p_lo = _round_to(p, V.dtype.element_ty, UPCAST)
        if UPCAST:
            p_lo = p_lo.to(tl.float32)
        acc_hi = acc_hi * alpha[:, None] + tl.dot(p_lo, v_hi)
        if D_LO > 0:
            acc_lo = acc_lo * alpha[:, None] + tl.dot(p_lo, v_lo)
        m_i = m_new
    inv = 1.0 / tl.where(l_i > 0, l_i, 1.0)
    o_rows = Out + tok[:, None] * stride_ot + hq * stride_oh
    o_hi = _round_to(acc_hi * inv[:, None], Out.dtype.element_ty, UPCAST)
    tl.store(o_rows + dh[None, :], o_hi, mask=row_ok[:, None] & dh_ok[None, :])
    if D_LO > 0:
        o_lo = _round_to(acc_lo * inv[:, None], Out.dtype.element_ty, UPCAST)
        tl.store(o_rows + dl[None, :], o_lo, mask=row_ok[:, None] & dl_ok[None, :])


def launch_segmented(q, k, v, out, cu_seqlens, max_seqlen, scale, config=None) -> None:
    n_seg = cu_seqlens.shape[0] - 1
    hq, d = q.shape[1], q.shape[2]
    cfg = dict(launch_config(d), **(config or {}))
    if max_seqlen == 0 or n_seg == 0:
        return
    d_hi, d_lo = head_dim_split(d)
    grid = (triton.cdiv(max_seqlen, cfg["BLOCK_M"]), n_seg, hq)
    segmented_attention_kernel[grid](
        q, k, v, out, cu_seqlens,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1), scale * LOG2E,
        G=hq // k.shape[1], HEAD_DIM=d, D_HI=d_hi, D_LO=d_lo,
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], UPCAST=triton_interpreter_active(),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )  # fmt: skip


def _validate(q, k, v, cu_seqlens, max_seqlen, scale, out):
    check_tensor(OP, "q", q, dtypes=DTYPES, ndim=3, last_dim_contiguous=True)
    t, hq, d = q.shape
    if not 1 <= d <= MAX_HEAD_DIM:
        raise ValueError(f"{OP}: head dim must be in [1, {MAX_HEAD_DIM}], got {d}")
    check_tensor(OP, "k", k, dtypes=(q.dtype,), ndim=3, device=q.device, last_dim_contiguous=True)
    if k.shape[0] != t or k.shape[2] != d or hq % k.shape[1]:
        raise ValueError(
            f"{OP}: k must be [{t}, Hkv, {d}] with Hkv dividing {hq}, got {list(k.shape)}"
        )
    check_tensor(OP, "v", v, dtypes=(q.dtype,), shape=list(k.shape), device=q.device,
                 last_dim_contiguous=True)  # fmt: skip
    check_tensor(OP, "cu_seqlens", cu_seqlens, dtypes=(torch.int32,), ndim=1, device=q.device,
                 contiguous=True)  # fmt: skip
    check_int(OP, "max_seqlen", max_seqlen, low=0)
    if scale is not None:
        check_float(OP, "scale", scale, positive=True)
    if out is not None:
        check_out(OP, "out", out, shape=q.shape, dtype=q.dtype, device=q.device)
        for name, t in (("q", q), ("k", k), ("v", v)):
            check_no_alias(OP, [("out", out), (name, t)])


def segmented_attention_into(q, k, v, cu_seqlens, max_seqlen, scale, out, backend) -> None:
    which = resolve_backend(OP, backend, q.device, IMPLEMENTED)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if which == "reference":
        out.copy_(reference.segmented_attention(q, k, v, cu_seqlens, scale=scale))
        return
    launch_segmented(q, k, v, out, cu_seqlens, max_seqlen, scale)


def segmented_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    *,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Non-causal attention inside packed segments (module docstring). ``max_seqlen``: a host
    bound on the longest segment (it sizes the grid). With ``out`` nothing is allocated."""
    _validate(q, k, v, cu_seqlens, max_seqlen, scale, out)
    if torch.compiler.is_compiling():
        return torch.ops.flashrt.segmented_attention(q, k, v, cu_seqlens, max_seqlen, scale,
                                                     backend)  # fmt: skip
    if out is None:
        out = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
    segmented_attention_into(q, k, v, cu_seqlens, max_seqlen, scale, out, backend)
    return out


@torch.library.custom_op("flashrt::segmented_attention", mutates_args=())
def _segmented_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
    max_seqlen: int, scale: float | None, backend: str,
) -> torch.Tensor:  # fmt: skip
    out = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
    segmented_attention_into(q, k, v, cu_seqlens, max_seqlen, scale, out, backend)
    return out


@_segmented_op.register_fake
def _(q, k, v, cu_seqlens, max_seqlen, scale, backend):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


@torch.library.custom_op("flashrt::segmented_attention_out", mutates_args=("out",))
def _segmented_out_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
    max_seqlen: int, scale: float | None, out: torch.Tensor, backend: str,
) -> None:  # fmt: skip
    segmented_attention_into(q, k, v, cu_seqlens, max_seqlen, scale, out, backend)
