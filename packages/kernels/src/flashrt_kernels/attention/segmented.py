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
from flashrt_kernels.attention.gqa_kernels import LOG2E, _round_to, _scaled_max
from flashrt_kernels.attention.splits import vector_align
from flashrt_kernels.backends import maxnreg_kwargs, resolve_backend, triton_interpreter_active
from flashrt_kernels.checks import check_float, check_int, check_no_alias, check_out, check_tensor

OP = "segmented_attention"
IMPLEMENTED = ("triton", "reference")


def head_dim_split(d: int) -> tuple[int, int]:
    """(power-of-two part, tail width; 0 without a tail), both tl.dot-sized (>= 16)."""
    hi = max(16, 1 << (d.bit_length() - 1))
    rest = d - hi
    lo = 0 if rest <= 0 else max(16, triton.next_power_of_2(rest))
    return hi, lo


# From this longest segment on, the launch caps registers at 128 a thread: four programs an SM
# instead of three (156 registers uncapped). 720-patch images at d = 72: 1.07x; 64-patch windows
# at d = 80 lost 5% with the cap (H100, attention.md, 2026-12-06).
LONG_SEGMENT = 256
LONG_SEGMENT_REGISTERS = 128


def launch_config(d: int) -> dict:
    """Tile geometry: a function of the head dim only (segments stay independent bit for bit).
    64-row tiles with 4 warps beat 128 rows with 8 warps on the H200 for 720-patch images at
    d=72 (185 vs 269 us; attention.md)."""
    return {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2}


def register_cap(max_seqlen: int) -> int | None:
    """The register cap of the launch, by the longest segment. It may depend on the batch: it only
    sets ptxas's ``.maxnreg`` (the PTX is otherwise identical, so are the bits)."""
    return LONG_SEGMENT_REGISTERS if max_seqlen >= LONG_SEGMENT else None


@triton.jit
def _segment_block(q_hi, q_lo, acc_hi, acc_lo, m_i, l_i, k_ptr, v_ptr, kv, n, dh, dh_ok, dl, dl_ok,
                   qk_scale, D_LO: tl.constexpr, MASKED: tl.constexpr,
                   UPCAST: tl.constexpr):  # fmt: skip
    """One key block; ``MASKED``: the segment's last, partial block (loads and scores bounded)."""
    kv_ok = kv < n
    if MASKED:
        hi_ok = kv_ok[:, None] & dh_ok[None, :]
    else:
        hi_ok = dh_ok[None, :]
    k_hi = tl.load(k_ptr + dh[None, :], mask=hi_ok, other=0.0)
    v_hi = tl.load(v_ptr + dh[None, :], mask=hi_ok, other=0.0)
    if UPCAST:
        k_hi = k_hi.to(tl.float32)
        v_hi = v_hi.to(tl.float32)
    s = tl.dot(q_hi, tl.trans(k_hi))
    if D_LO > 0:
        if MASKED:
            lo_ok = kv_ok[:, None] & dl_ok[None, :]
        else:
            lo_ok = dl_ok[None, :]
        k_lo = tl.load(k_ptr + dl[None, :], mask=lo_ok, other=0.0)
        v_lo = tl.load(v_ptr + dl[None, :], mask=lo_ok, other=0.0)
        if UPCAST:
            k_lo = k_lo.to(tl.float32)
            v_lo = v_lo.to(tl.float32)
        s += tl.dot(q_lo, tl.trans(k_lo))
    if MASKED:
        s = tl.where(kv_ok[None, :], s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
    else:
        m_new = tl.maximum(m_i, _scaled_max(s, qk_scale))
        p = tl.exp2(s * qk_scale - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    p_lo = _round_to(p, v_ptr.dtype.element_ty, UPCAST)
    if UPCAST:
        p_lo = p_lo.to(tl.float32)
    acc_hi = acc_hi * alpha[:, None] + tl.dot(p_lo, v_hi)
    if D_LO > 0:
        acc_lo = acc_lo * alpha[:, None] + tl.dot(p_lo, v_lo)
    return acc_hi, acc_lo, m_new, l_i


@triton.jit
def segmented_attention_kernel(
    Q, K, V, Out, CuSeqlens,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    qk_scale,
    G: tl.constexpr, HEAD_DIM: tl.constexpr, D_HI: tl.constexpr, D_LO: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr, ALIGN: tl.constexpr,
):  # fmt: skip
    """Full key blocks run unmasked; only a segment's last, partial block is masked. Loads of a
    head dim like 72 are 16 bytes wide through ``ALIGN`` (the strides' power of two)."""
    tile = tl.program_id(0)
    seg = tl.program_id(1)
    hq = tl.program_id(2)
    hk = hq // G
    first = tl.load(CuSeqlens + seg)
    n = tl.load(CuSeqlens + seg + 1) - first
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < n
    if tile * BLOCK_M < n:
        tok = (first + rows).to(tl.int64)
        q_rows = tl.multiple_of(tok * stride_qt + hq * stride_qh, ALIGN)
        dh = tl.arange(0, D_HI)
        dh_ok = dh < HEAD_DIM
        q_hi = tl.load(Q + q_rows[:, None] + dh[None, :], mask=row_ok[:, None] & dh_ok[None, :],
                       other=0.0)  # fmt: skip
        if UPCAST:
            q_hi = q_hi.to(tl.float32)
        acc_hi = tl.zeros([BLOCK_M, D_HI], tl.float32)
        if D_LO > 0:
            dl = D_HI + tl.arange(0, D_LO)
            dl_ok = dl < HEAD_DIM
            q_lo = tl.load(Q + q_rows[:, None] + dl[None, :],
                           mask=row_ok[:, None] & dl_ok[None, :], other=0.0)  # fmt: skip
            if UPCAST:
                q_lo = q_lo.to(tl.float32)
            acc_lo = tl.zeros([BLOCK_M, D_LO], tl.float32)
        else:
            dl, dl_ok, q_lo, acc_lo = dh, dh_ok, q_hi, acc_hi
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        full = n // BLOCK_N * BLOCK_N
        for n0 in range(0, full, BLOCK_N):
            kv = n0 + tl.arange(0, BLOCK_N)
            kt = (first + kv).to(tl.int64)
            k_ptr = K + tl.multiple_of(kt * stride_kt + hk * stride_kh, ALIGN)[:, None]
            v_ptr = V + tl.multiple_of(kt * stride_vt + hk * stride_vh, ALIGN)[:, None]
            acc_hi, acc_lo, m_i, l_i = _segment_block(
                q_hi, q_lo, acc_hi, acc_lo, m_i, l_i, k_ptr, v_ptr, kv, n, dh, dh_ok, dl, dl_ok,
                qk_scale, D_LO, False, UPCAST,
            )  # fmt: skip
        for n0 in range(full, n, BLOCK_N):
            kv = n0 + tl.arange(0, BLOCK_N)
            kt = (first + kv).to(tl.int64)
            k_ptr = K + tl.multiple_of(kt * stride_kt + hk * stride_kh, ALIGN)[:, None]
            v_ptr = V + tl.multiple_of(kt * stride_vt + hk * stride_vh, ALIGN)[:, None]
            acc_hi, acc_lo, m_i, l_i = _segment_block(
                q_hi, q_lo, acc_hi, acc_lo, m_i, l_i, k_ptr, v_ptr, kv, n, dh, dh_ok, dl, dl_ok,
                qk_scale, D_LO, True, UPCAST,
            )  # fmt: skip
        inv = 1.0 / tl.where(l_i > 0, l_i, 1.0)
        o_rows = Out + tl.multiple_of(tok * stride_ot + hq * stride_oh, ALIGN)[:, None]
        o_hi = _round_to(acc_hi * inv[:, None], Out.dtype.element_ty, UPCAST)
        tl.store(o_rows + dh[None, :], o_hi, mask=row_ok[:, None] & dh_ok[None, :])
        if D_LO > 0:
            o_lo = _round_to(acc_lo * inv[:, None], Out.dtype.element_ty, UPCAST)
            tl.store(o_rows + dl[None, :], o_lo, mask=row_ok[:, None] & dl_ok[None, :])


def launch_segmented(q, k, v, out, cu_seqlens, max_seqlen, scale, config=None) -> None:
    n_seg = cu_seqlens.shape[0] - 1
    hq, d = q.shape[1], q.shape[2]
    if max_seqlen == 0 or n_seg == 0:
        return
    cfg = dict(launch_config(d), **(config or {}))
    d_hi, d_lo = head_dim_split(d)
    align = vector_align(q.element_size(), *q.stride()[:2], *k.stride()[:2], *v.stride()[:2],
                         *out.stride()[:2])  # fmt: skip
    grid = (triton.cdiv(max_seqlen, cfg["BLOCK_M"]), n_seg, hq)
    segmented_attention_kernel[grid](
        q, k, v, out, cu_seqlens,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1), scale * LOG2E,
        G=hq // k.shape[1], HEAD_DIM=d, D_HI=d_hi, D_LO=d_lo,
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], UPCAST=triton_interpreter_active(),
        ALIGN=align, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        **maxnreg_kwargs(register_cap(max_seqlen)), enable_fp_fusion=True,
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
