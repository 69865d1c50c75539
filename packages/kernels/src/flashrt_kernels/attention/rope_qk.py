"""Rotary embedding of q and k with the rotation in fp32, in one launch.

Vision towers (Qwen2.5-VL, Qwen3-VL) rotate their queries and keys in float32 whatever the model
dtype: ``(x.float() * cos + rotate_half(x.float()) * sin).to(x.dtype)`` with float32 cos / sin.
In torch that is about seven launches per tensor (the upcast copy, two multiplies, the negation,
the concatenation, the add and the downcast), each a full pass over q or k. Here one program per
token reads its q and k heads once (any token and head strides, e.g. the q and k column blocks
of one q|k|v projection) and writes contiguous ``[N, heads, D]`` rotated tensors, the layout
``segmented_attention`` reads.

Contract ``exact``: bit-identical to ``reference.rope_qk`` (the torch composition above): every
multiply and the add are the same fp32 operations, rounded once each, with no fused multiply-add;
the result is rounded to the dtype once (round to nearest even).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashrt_kernels.attention import reference
from flashrt_kernels.backends import resolve_backend
from flashrt_kernels.checks import check_no_alias, check_out, check_tensor
from flashrt_kernels.triton_helpers import cast_rne, negate_f32, to_f32

OP = "rope_qk"
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
IMPLEMENTED = ("triton", "reference")


@triton.jit
def _rotate_token(X, OUT, C1, C2, S1, S2, stride_h, H: tl.constexpr, HALF: tl.constexpr,
                  BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):  # fmt: skip
    """One token's heads: the two halves of each head loaded as separate tiles (contiguous
    loads), ``x1 * c1 + (-x2) * s1`` and ``x2 * c2 + x1 * s2`` in fp32."""
    h = tl.arange(0, BLOCK_H)[:, None]
    j = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (h < H) & (j < HALF)
    lo = X + h * stride_h + j
    x1 = tl.load(lo, mask=mask, other=0.0)
    dtype = x1.dtype
    x1 = to_f32(x1)
    x2 = to_f32(tl.load(lo + HALF, mask=mask, other=0.0))
    out1 = x1 * C1 + negate_f32(x2) * S1
    out2 = x2 * C2 + x1 * S2
    o = OUT + h * (2 * HALF) + j
    tl.store(o, cast_rne(out1, dtype), mask=mask)
    tl.store(o + HALF, cast_rne(out2, dtype), mask=mask)


@triton.jit
def _rope_qk_kernel(
    Q, K, COS, SIN, QO, KO, stride_qt, stride_qh, stride_kt, stride_kh, stride_ct, stride_st,
    HQ: tl.constexpr, HK: tl.constexpr, HALF: tl.constexpr, BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr, BLOCK_HALF: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, BLOCK_HALF)
    ok = j < HALF
    c = COS + t * stride_ct + j
    s = SIN + t * stride_st + j
    c1 = to_f32(tl.load(c, mask=ok, other=0.0))[None, :]
    c2 = to_f32(tl.load(c + HALF, mask=ok, other=0.0))[None, :]
    s1 = to_f32(tl.load(s, mask=ok, other=0.0))[None, :]
    s2 = to_f32(tl.load(s + HALF, mask=ok, other=0.0))[None, :]
    _rotate_token(Q + t * stride_qt, QO + t * (HQ * 2 * HALF), c1, c2, s1, s2, stride_qh, HQ,
                  HALF, BLOCK_HQ, BLOCK_HALF)  # fmt: skip
    _rotate_token(K + t * stride_kt, KO + t * (HK * 2 * HALF), c1, c2, s1, s2, stride_kh, HK,
                  HALF, BLOCK_HK, BLOCK_HALF)  # fmt: skip


def _validate(q, k, cos, sin, out):
    check_tensor(OP, "q", q, dtypes=DTYPES, ndim=3, last_dim_contiguous=True)
    n, _, d = q.shape
    if d % 2 or d == 0:
        raise ValueError(f"{OP}: head_dim must be even and positive (rotate-half), got {d}")
    check_tensor(OP, "k", k, dtypes=(q.dtype,), shape=[n, None, d], device=q.device,
                 last_dim_contiguous=True)  # fmt: skip
    for name, x in (("cos", cos), ("sin", sin)):
        check_tensor(OP, name, x, dtypes=DTYPES, shape=[n, d], device=q.device,
                     last_dim_contiguous=True)  # fmt: skip
    if out is not None:
        if not isinstance(out, tuple | list) or len(out) != 2:
            raise ValueError(f"{OP}: out must be a (q_out, k_out) pair")
        for name, o, x in (("q_out", out[0], q), ("k_out", out[1], k)):
            check_out(OP, name, o, shape=x.shape, dtype=q.dtype, device=q.device)
        check_no_alias(OP, [("q_out", out[0]), ("k_out", out[1])])
        for o_name, o in (("q_out", out[0]), ("k_out", out[1])):
            for name, x in (("q", q), ("k", k)):  # q and k may share one q|k|v output
                check_no_alias(OP, [(o_name, o), (name, x)])


def rope_qk(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate-half rotary embedding of q [N, Hq, D] and k [N, Hk, D] (one dtype of bf16 / fp16 /
    fp32; token and head strides free, last dim contiguous) by cos / sin [N, D] (fp32, bf16 or
    fp16; the rotation runs in fp32). Returns contiguous (q_rot, k_rot) in the input dtype, or
    writes ``out`` (a pair of contiguous tensors of those shapes)."""
    _validate(q, k, cos, sin, out)
    if out is None:
        out = (torch.empty(q.shape, dtype=q.dtype, device=q.device),
               torch.empty(k.shape, dtype=k.dtype, device=k.device))  # fmt: skip
    qo, ko = out
    if resolve_backend(OP, backend, q.device, IMPLEMENTED) == "reference":
        rq, rk = reference.rope_qk(q, k, cos, sin)
        qo.copy_(rq)
        ko.copy_(rk)
        return qo, ko
    n, hq, d = q.shape
    if n == 0:
        return qo, ko
    hk, half = k.shape[1], d // 2
    _rope_qk_kernel[(n,)](
        q, k, cos, sin, qo, ko, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        cos.stride(0), sin.stride(0), HQ=hq, HK=hk, HALF=half,
        BLOCK_HQ=triton.next_power_of_2(hq), BLOCK_HK=triton.next_power_of_2(hk),
        BLOCK_HALF=triton.next_power_of_2(half), num_warps=4, enable_fp_fusion=False,
    )  # fmt: skip
    return qo, ko
