"""New tokens' bias add, rotary embedding and KV-pool append in one launch.

For each new token ``t`` (one program each): ``q[t]`` and ``k[t]`` (``[heads * D]`` rows, heads
back to back) get their bias added, are rotated by the token's ``cos[t]`` / ``sin[t]`` (the
rotate-half convention of Llama / Qwen / HF transformers), and are written to ``q_out[q_index[t]]``
and ``k_cache[rows[t], slots[t]]``; ``v[t]`` (+ bias) goes to ``v_cache[rows[t], slots[t]]``. It
replaces a dozen small launches per layer of a decoder step (three bias adds, the rotary
multiplies / adds / concatenations for q and k, the two pool scatters, the padded-query scatter).

Contract ``exact``: every output is bit-identical to ``reference.rope_append`` (plain torch in the
tensors' dtype: ``x = x + bias``, ``x * cos + rotate_half(x) * sin``, each operation rounded to
the dtype as torch rounds it). The kernel does the same operations, each in fp32 and rounded to
the dtype once (a product of two bf16 / fp16 values is exact in fp32; the sums are what torch
computes), with no fused multiply-add.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashrt_kernels.attention import reference
from flashrt_kernels.backends import resolve_backend
from flashrt_kernels.checks import check_tensor
from flashrt_kernels.triton_helpers import cast_rne, negate_f32, to_f32

OP = "rope_append"
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
IMPLEMENTED = ("triton", "reference")


@triton.jit
def _round(x, dtype: tl.constexpr):
    """fp32 -> dtype (round to nearest even) -> fp32."""
    return to_f32(cast_rne(x, dtype))


@triton.jit
def _rotate_heads(X, B, OUT, cos, sin, d, d_rot, first_half, d_ok,
                  H: tl.constexpr, D: tl.constexpr, BLOCK_H: tl.constexpr,
                  HAS_BIAS: tl.constexpr):  # fmt: skip
    h = tl.arange(0, BLOCK_H)
    mask = (h < H)[:, None] & d_ok[None, :]
    offs = h[:, None] * D + d[None, :]
    offs_rot = h[:, None] * D + d_rot[None, :]
    x = tl.load(X + offs, mask=mask, other=0.0)
    dtype = x.dtype
    x = to_f32(x)
    xr = to_f32(tl.load(X + offs_rot, mask=mask, other=0.0))
    if HAS_BIAS:
        x = _round(x + to_f32(tl.load(B + offs, mask=mask, other=0.0)), dtype)
        xr = _round(xr + to_f32(tl.load(B + offs_rot, mask=mask, other=0.0)), dtype)
    xr = tl.where(first_half[None, :], negate_f32(xr), xr)
    a = _round(x * cos[None, :], dtype)
    b = _round(xr * sin[None, :], dtype)
    tl.store(OUT + offs, cast_rne(a + b, dtype), mask=mask)


@triton.jit
def _rope_append_kernel(
    Q, K, V, QB, KB, VB, COS, SIN, KC, VC, ROWS, SLOTS, QO, QIDX,
    stride_q, stride_k, stride_v, stride_cs, stride_kc_row, stride_kc_slot,
    stride_vc_row, stride_vc_slot, stride_qo,
    HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, BLOCK_HQ: tl.constexpr,
    BLOCK_HKV: tl.constexpr, BLOCK_D: tl.constexpr, HAS_BIAS: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    half: tl.constexpr = D // 2
    first_half = d < half
    d_rot = tl.where(first_half, d + half, d - half)
    cos = to_f32(tl.load(COS + t * stride_cs + d, mask=d_ok, other=0.0))
    sin = to_f32(tl.load(SIN + t * stride_cs + d, mask=d_ok, other=0.0))
    row = tl.load(ROWS + t).to(tl.int64)
    slot = tl.load(SLOTS + t).to(tl.int64)
    qi = tl.load(QIDX + t).to(tl.int64)
    _rotate_heads(Q + t * stride_q, QB, QO + qi * stride_qo, cos, sin, d, d_rot, first_half,
                  d_ok, HQ, D, BLOCK_HQ, HAS_BIAS)  # fmt: skip
    _rotate_heads(K + t * stride_k, KB, KC + row * stride_kc_row + slot * stride_kc_slot, cos,
                  sin, d, d_rot, first_half, d_ok, HKV, D, BLOCK_HKV, HAS_BIAS)  # fmt: skip
    h = tl.arange(0, BLOCK_HKV)
    mask = (h < HKV)[:, None] & d_ok[None, :]
    offs = h[:, None] * D + d[None, :]
    v = tl.load(V + t * stride_v + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        v = cast_rne(to_f32(v) + to_f32(tl.load(VB + offs, mask=mask, other=0.0)), v.dtype)
    tl.store(VC + row * stride_vc_row + slot * stride_vc_slot + offs, v, mask=mask)


def _validate(q, k, v, cos, sin, k_cache, v_cache, rows, slots, q_out, q_index, biases):
    check_tensor(OP, "q", q, dtypes=DTYPES, ndim=2, last_dim_contiguous=True)
    t, dt, dev = q.shape[0], q.dtype, q.device
    check_tensor(OP, "k_cache", k_cache, dtypes=(dt,), ndim=4, device=dev)
    _, _, hkv, d = k_cache.shape
    if d % 2:
        raise ValueError(f"{OP}: head_dim must be even (rotate-half), got {d}")
    if q.shape[1] % d or q.shape[1] == 0:
        raise ValueError(f"{OP}: q must be [T, q_heads * {d}], got {list(q.shape)}")
    hq = q.shape[1] // d
    if hq % hkv:
        raise ValueError(f"{OP}: {hq} query heads are not a multiple of {hkv} KV heads")
    for name, x in (("k", k), ("v", v)):
        check_tensor(OP, name, x, dtypes=(dt,), shape=[t, hkv * d], device=dev,
                     last_dim_contiguous=True)  # fmt: skip
    for name, x in (("cos", cos), ("sin", sin)):
        check_tensor(OP, name, x, dtypes=(dt,), shape=[t, d], device=dev,
                     last_dim_contiguous=True)  # fmt: skip
    if cos.stride() != sin.stride():
        raise ValueError(f"{OP}: cos and sin must have the same strides")
    check_tensor(OP, "v_cache", v_cache, dtypes=(dt,), shape=list(k_cache.shape), device=dev)
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache)):
        if x.stride()[2:] != (d, 1):
            raise ValueError(f"{OP}: {name} must have contiguous [kv_heads, head_dim] entries")
    for name, x in (("rows", rows), ("slots", slots), ("q_index", q_index)):
        check_tensor(OP, name, x, dtypes=(torch.int32, torch.int64), shape=[t], device=dev)
    check_tensor(OP, "q_out", q_out, dtypes=(dt,), ndim=3, device=dev)
    if tuple(q_out.shape[1:]) != (hq, d) or q_out.stride()[1:] != (d, 1):
        raise ValueError(f"{OP}: q_out must be [N, {hq}, {d}] with contiguous rows, got "
                         f"{list(q_out.shape)} strides {q_out.stride()}")  # fmt: skip
    if biases is not None:
        if len(biases) != 3:
            raise ValueError(f"{OP}: biases must be (q_bias, k_bias, v_bias)")
        for name, x, n in zip(("q_bias", "k_bias", "v_bias"), biases, (hq, hkv, hkv), strict=True):
            check_tensor(OP, name, x, dtypes=(dt,), shape=[n * d], device=dev, contiguous=True)
    return hq, hkv, d


def rope_append(q, k, v, cos, sin, k_cache, v_cache, rows, slots, q_out, q_index, *,
                biases=None, backend: str = "auto") -> None:  # fmt: skip
    """Bias add + rotary embedding of ``T`` new tokens, K/V appended to a pool layer.

    q [T, Hq * D], k / v [T, Hkv * D] (rows may be strided, e.g. column slices of one q|k|v
    output); cos / sin [T, D]; k_cache / v_cache [rows, capacity, Hkv, D] (one ``KVPool`` layer);
    rows / slots [T] (int32 or int64): where token t's K/V go; q_out [N, Hq, D]: the rotated
    query of token t goes to ``q_out[q_index[t]]`` (other entries untouched); ``biases``:
    optional (q_bias [Hq * D], k_bias [Hkv * D], v_bias [Hkv * D]). All in one dtype. Indices
    are not range-checked on the device (no host sync): callers pass in-range ones."""
    hq, hkv, d = _validate(q, k, v, cos, sin, k_cache, v_cache, rows, slots, q_out, q_index,
                           biases)  # fmt: skip
    if resolve_backend(OP, backend, q.device, IMPLEMENTED) == "reference":
        reference.rope_append(q, k, v, cos, sin, k_cache, v_cache, rows, slots, q_out, q_index,
                              biases=biases)  # fmt: skip
        return
    t = q.shape[0]
    if t == 0:
        return
    qb, kb, vb = biases if biases is not None else (q, k, v)
    _rope_append_kernel[(t,)](
        q, k, v, qb, kb, vb, cos, sin, k_cache, v_cache, rows, slots, q_out, q_index,
        q.stride(0), k.stride(0), v.stride(0), cos.stride(0), k_cache.stride(0),
        k_cache.stride(1), v_cache.stride(0), v_cache.stride(1), q_out.stride(0),
        HQ=hq, HKV=hkv, D=d, BLOCK_HQ=triton.next_power_of_2(hq),
        BLOCK_HKV=triton.next_power_of_2(hkv), BLOCK_D=triton.next_power_of_2(d),
        HAS_BIAS=biases is not None, num_warps=4, enable_fp_fusion=False,
    )  # fmt: skip
