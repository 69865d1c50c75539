"""GQA split-KV attention over a KV pool: decode, tree verification (and, unsplit, packed prefill).

One program computes a tile of ``BLOCK_M`` (query, head) rows for one KV head: all the query heads
that share the KV head and as many query tokens as fit (row ``r`` of a row's tile space is token
``r // G``, head ``h * G + r % G``), over one split of the row's live context; a combine pass merges
the splits in a fixed order.

Batch invariance (contract ``exact`` across batch compositions): the split size of a row is a
function of that row's own live extent and query count only (``split_chunk``), the tile geometry is
fixed (``BLOCK_M``, ``BLOCK_N`` depend on nothing but the head dim), and tiles, splits and the
combine order are numbered from the row's own first token, so a row's bits do not depend on which
other rows share the launch, on ``B`` or on the padded ``q_max``.

Live extent: a program reads keys and values only at positions ``< cache_lens[b] + q_lens[b]``
(masked loads), so stale slots (even NaN) never reach the output; tiles with no live query and
splits past a row's extent do no KV work. Causal tiles stop at the last key their last live query
sees; that only drops fully masked blocks, which contribute exactly nothing.

Numerics (``faithful``): scores and softmax statistics in fp32 (exp2 domain), probabilities rounded
to the K/V dtype for the PV product (fp32 accumulation), output rounded once. Against
``reference.gqa_attention``: ``|out - ref| <= ATOL_V[dtype] * max|v| + RTOL[dtype] * |ref|``.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from flashrt_kernels.attention import reference
from flashrt_kernels.backends import resolve_backend, triton_interpreter_active
from flashrt_kernels.checks import check_float, check_no_alias, check_out, check_tensor
from flashrt_kernels.triton_helpers import cast_rne

BLOCK_M = 64
MIN_CHUNK = 128
TARGET_SPLITS = 64
MAX_DOUBLINGS = 20
# Bound vs the reference, per dtype: probabilities rounded to the dtype (relative 2^-8 / 2^-11 of
# each term, so at most that times max|v| in total) plus fp32 reordering, plus the output rounding.
ATOL_V = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-9, torch.float32: 2.0**-12}
RTOL = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-16}
LOG2E = 1.4426950408889634


def block_n_for(head_dim: int) -> int:
    return 64


def split_chunk(total: int, q_len: int, group: int) -> int:
    """Host mirror of the in-kernel split size (keys per split) of a row."""
    need = max(4 * q_len * group, -(-total // TARGET_SPLITS))
    chunk = MIN_CHUNK
    for _ in range(MAX_DOUBLINGS):
        if chunk < need:
            chunk *= 2
    return chunk


@functools.cache
def split_plan(capacity: int, q_max: int, group: int) -> tuple[int, int]:
    """(most splits of any row, partial slots per row) for a cache capacity and q_max."""
    max_splits, slots = 1, 1
    for q in range(1, q_max + 1):
        c = max(MIN_CHUNK, split_chunk(1, q, group))
        s = min(TARGET_SPLITS, -(-capacity // c))
        max_splits = max(max_splits, s)
        slots = max(slots, q * s)
    return max_splits, slots


@triton.jit
def _round_to(x, dtype: tl.constexpr, EMULATE: tl.constexpr):
    if EMULATE:
        return cast_rne(x, dtype)
    else:
        return x.to(dtype)


@triton.jit
def _row_chunk(total, q_len, G: tl.constexpr, MIN_CHUNK_: tl.constexpr, TARGET: tl.constexpr,
               DOUBLINGS: tl.constexpr):  # fmt: skip
    need = tl.maximum(4 * q_len * G, (total + TARGET - 1) // TARGET)
    chunk = need * 0 + MIN_CHUNK_
    for _ in tl.static_range(DOUBLINGS):
        chunk = tl.where(chunk < need, chunk * 2, chunk)
    return chunk


@triton.jit
def gqa_tile_kernel(
    Q, K, V, Out, Opart, Mpart, Lpart,
    CacheLens, QLens, QStarts, Rows, Mask,
    stride_qb, stride_qt, stride_qh,
    stride_kr, stride_kn, stride_kh,
    stride_vr, stride_vn, stride_vh,
    stride_ob, stride_ot, stride_oh,
    stride_mb, stride_mi,
    capacity, slots, n_kv_heads, qk_scale,
    HEAD_DIM: tl.constexpr, G: tl.constexpr, BLOCK_M_: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, MASK_MODE: tl.constexpr, SPLIT: tl.constexpr, PACKED: tl.constexpr,
    HAS_ROWS: tl.constexpr, UPCAST: tl.constexpr,
    MIN_CHUNK_: tl.constexpr, TARGET: tl.constexpr, DOUBLINGS: tl.constexpr,
):  # fmt: skip
    """MASK_MODE: 0 causal, 1 bool/uint8 [B, q_max, q_max], 2 bit rows int64 [B, q_max].
    PACKED: queries and outputs are token-major ``[T, H, d]`` and row ``b`` owns tokens
    ``QStarts[b] .. QStarts[b + 1]`` (cu_seqlens); otherwise ``[B, q_max, H, d]``."""
    tile = tl.program_id(0)
    split = tl.program_id(1)
    bh = tl.program_id(2)
    b = bh // n_kv_heads
    h = bh % n_kv_heads
    cache_len = tl.load(CacheLens + b)
    if PACKED:
        q_len = tl.load(QStarts + b + 1) - tl.load(QStarts + b)
    else:
        q_len = tl.load(QLens + b)
    if HAS_ROWS:
        row = tl.load(Rows + b).to(tl.int64)
    else:
        row = b.to(tl.int64)
    if PACKED:
        q_base = tl.load(QStarts + b).to(tl.int64) * stride_qt
        o_base = tl.load(QStarts + b).to(tl.int64) * stride_ot
    else:
        q_base = b.to(tl.int64) * stride_qb
        o_base = b.to(tl.int64) * stride_ob
    total = tl.minimum(cache_len + q_len, capacity)

    r = tile * BLOCK_M_ + tl.arange(0, BLOCK_M_)
    qi = r // G
    head = h * G + r % G
    row_live = qi < q_len
    tile_live = tile * BLOCK_M_ < q_len * G
    if SPLIT:
        chunk = _row_chunk(total, q_len, G, MIN_CHUNK_, TARGET, DOUBLINGS)
        n_splits = (total + chunk - 1) // chunk
        start = split * chunk
        end = tl.minimum(start + chunk, total)
    else:
        start = split * 0
        end = total
    if MASK_MODE == 0:
        last_q = tl.minimum((tile * BLOCK_M_ + BLOCK_M_ - 1) // G, q_len - 1)
        end = tl.minimum(end, cache_len + last_q + 1)
    end = tl.where(tile_live, end, start)

    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    q_ptr = (
        Q + q_base + qi[:, None].to(tl.int64) * stride_qt + head[:, None] * stride_qh + d[None, :]
    )
    q = tl.load(q_ptr, mask=row_live[:, None] & d_ok[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    if MASK_MODE == 2:
        bits = tl.load(Mask + b * stride_mb + qi * stride_mi, mask=row_live, other=0)

    k_base = K + row * stride_kr + h * stride_kh
    v_base = V + row * stride_vr + h * stride_vh
    m_i = tl.full([BLOCK_M_], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M_], tl.float32)
    acc = tl.zeros([BLOCK_M_, BLOCK_D], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        kv_ok = pos < end
        ld_mask = kv_ok[:, None] & d_ok[None, :]
        k = tl.load(k_base + pos[:, None].to(tl.int64) * stride_kn + d[None, :], mask=ld_mask,
                    other=0.0)  # fmt: skip
        v = tl.load(v_base + pos[:, None].to(tl.int64) * stride_vn + d[None, :], mask=ld_mask,
                    other=0.0)  # fmt: skip
        if UPCAST:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        j = pos - cache_len
        visible = row_live[:, None] & kv_ok[None, :]
        if MASK_MODE == 0:
            visible = visible & (j[None, :] <= qi[:, None])
        elif MASK_MODE == 1:
            in_new = visible & (j[None, :] >= 0)
            node = tl.load(Mask + b * stride_mb + qi[:, None] * stride_mi + j[None, :],
                           mask=in_new, other=0)  # fmt: skip
            visible = visible & ((j[None, :] < 0) | (node != 0))
        else:
            jc = tl.minimum(tl.maximum(j, 0), 63).to(tl.int64)
            seen = ((bits[:, None] >> jc[None, :]) & 1) != 0
            visible = visible & ((j[None, :] < 0) | seen)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        p_lo = _round_to(p, V.dtype.element_ty, UPCAST)
        if UPCAST:
            p_lo = p_lo.to(tl.float32)
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p_lo, v)
        m_i = m_new

    if SPLIT:
        slot = (b.to(tl.int64) * slots + split * q_len + qi) * (G * n_kv_heads) + head
        st_ok = row_live & ((qi * 0 + split) < n_splits)
        tl.store(Opart + slot[:, None] * HEAD_DIM + d[None, :], acc,
                 mask=st_ok[:, None] & d_ok[None, :])  # fmt: skip
        tl.store(Mpart + slot, m_i, mask=st_ok)
        tl.store(Lpart + slot, l_i, mask=st_ok)
    else:
        o = tl.where(l_i[:, None] > 0, acc / tl.where(l_i > 0, l_i, 1.0)[:, None], 0.0)
        o_ptr = (Out + o_base + qi[:, None].to(tl.int64) * stride_ot + head[:, None] * stride_oh
                 + d[None, :])  # fmt: skip
        tl.store(o_ptr, _round_to(o, Out.dtype.element_ty, UPCAST),
                 mask=row_live[:, None] & d_ok[None, :])  # fmt: skip


@triton.jit
def split_combine_kernel(
    Opart, Mpart, Lpart, Out, CacheLens, QLens,
    stride_ob, stride_ot, stride_oh,
    capacity, slots, n_q_heads,
    HEAD_DIM: tl.constexpr, G: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    UPCAST: tl.constexpr, MIN_CHUNK_: tl.constexpr, TARGET: tl.constexpr,
    DOUBLINGS: tl.constexpr,
):  # fmt: skip
    """Merges a query's splits in split order; dead query slots are written as zeros."""
    i = tl.program_id(0)
    b = tl.program_id(1)
    cache_len = tl.load(CacheLens + b)
    q_len = tl.load(QLens + b)
    total = tl.minimum(cache_len + q_len, capacity)
    chunk = _row_chunk(total, q_len, G, MIN_CHUNK_, TARGET, DOUBLINGS)
    n_splits = tl.where(i < q_len, (total + chunk - 1) // chunk, 0)
    hh = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    h_ok = hh < n_q_heads
    mask2 = h_ok[:, None] & (d[None, :] < HEAD_DIM)
    base = b.to(tl.int64) * slots + i
    m_all = tl.full([BLOCK_H], float("-inf"), tl.float32)
    for s in range(0, n_splits):
        m = tl.load(Mpart + (base + s * q_len) * n_q_heads + hh, mask=h_ok, other=float("-inf"))
        m_all = tl.maximum(m_all, m)
    m_safe = tl.where(m_all == float("-inf"), 0.0, m_all)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    l_all = tl.zeros([BLOCK_H], tl.float32)
    for s in range(0, n_splits):
        slot = (base + s * q_len) * n_q_heads + hh
        m = tl.load(Mpart + slot, mask=h_ok, other=float("-inf"))
        w = tl.exp2(m - m_safe)
        l_all += w * tl.load(Lpart + slot, mask=h_ok, other=0.0)
        o = tl.load(Opart + slot[:, None] * HEAD_DIM + d[None, :], mask=mask2, other=0.0)
        acc += w[:, None] * o
    o = tl.where(l_all[:, None] > 0, acc / tl.where(l_all > 0, l_all, 1.0)[:, None], 0.0)
    o_ptr = Out + b.to(tl.int64) * stride_ob + i * stride_ot + hh[:, None] * stride_oh + d[None, :]
    tl.store(o_ptr, _round_to(o, Out.dtype.element_ty, UPCAST), mask=mask2)


def launch_gqa_tiles(
    q, k_cache, v_cache, out, cache_lens, q_lens, *, q_starts, cache_rows, mask, mask_mode,
    q_max, split, workspace, scale, num_warps=4, num_stages=2,
):  # fmt: skip
    """Launches the tile kernel (and the combine pass when ``split``); inputs validated."""
    bsz = cache_lens.shape[0]
    hq, d = q.shape[-2], q.shape[-1]
    hkv, cap = k_cache.shape[2], k_cache.shape[1]
    group = hq // hkv
    upcast = triton_interpreter_active()
    block_d = max(16, triton.next_power_of_2(d))
    n_tiles = triton.cdiv(q_max * group, BLOCK_M)
    packed = q_starts is not None
    if packed:
        sqb, sqt, sqh = 0, q.stride(0), q.stride(1)
        sob, sot, soh = 0, out.stride(0), out.stride(1)
    else:
        sqb, sqt, sqh = q.stride(0), q.stride(1), q.stride(2)
        sob, sot, soh = out.stride(0), out.stride(1), out.stride(2)
    if split:
        max_splits, slots = split_plan(cap, q_max, group)
        per = bsz * slots * hq
        opart = workspace[: per * d]
        mpart = workspace[per * d : per * (d + 1)]
        lpart = workspace[per * (d + 1) : per * (d + 2)]
    else:
        max_splits, slots = 1, 0
        opart = mpart = lpart = out
    mask_arg = mask if mask is not None else cache_lens
    smb = mask.stride(0) if mask is not None else 0
    smi = mask.stride(1) if mask is not None else 0
    gqa_tile_kernel[(n_tiles, max_splits, bsz * hkv)](
        q, k_cache, v_cache, out, opart, mpart, lpart,
        cache_lens, q_lens if q_lens is not None else cache_lens,
        q_starts if packed else cache_lens,
        cache_rows if cache_rows is not None else cache_lens, mask_arg,
        sqb, sqt, sqh,
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        sob, sot, soh, smb, smi,
        cap, slots, hkv, scale * LOG2E,
        HEAD_DIM=d, G=group, BLOCK_M_=BLOCK_M, BLOCK_N=block_n_for(d), BLOCK_D=block_d,
        MASK_MODE=mask_mode, SPLIT=split, PACKED=packed, HAS_ROWS=cache_rows is not None,
        UPCAST=upcast, MIN_CHUNK_=MIN_CHUNK, TARGET=TARGET_SPLITS, DOUBLINGS=MAX_DOUBLINGS,
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    if split:
        split_combine_kernel[(q_max, bsz)](
            opart, mpart, lpart, out, cache_lens, q_lens,
            out.stride(0), out.stride(1), out.stride(2),
            cap, slots, hq,
            HEAD_DIM=d, G=group, BLOCK_H=triton.next_power_of_2(hq), BLOCK_D=block_d,
            UPCAST=upcast, MIN_CHUNK_=MIN_CHUNK, TARGET=TARGET_SPLITS, DOUBLINGS=MAX_DOUBLINGS,
            num_warps=4,
        )  # fmt: skip


def workspace_numel(batch: int, q_max: int, q_heads: int, kv_heads: int, head_dim: int,
                    capacity: int) -> int:  # fmt: skip
    """fp32 elements of the split workspace ``gqa_attention`` needs for these sizes."""
    _, slots = split_plan(capacity, q_max, q_heads // kv_heads)
    return batch * slots * q_heads * (head_dim + 2)


# ---------------------------------------------------------------------------------------------
# Public op
OP = "gqa_attention"
DTYPES = (torch.bfloat16, torch.float16)
IMPLEMENTED = ("triton", "reference")
MAX_HEAD_DIM = 256
MAX_Q = 1024


def validate_cache(op, q_heads, head_dim, dtype, device, k_cache, v_cache):
    check_tensor(op, "k_cache", k_cache, dtypes=(dtype,), ndim=4, device=device,
                 last_dim_contiguous=True)  # fmt: skip
    check_tensor(op, "v_cache", v_cache, dtypes=(dtype,), shape=list(k_cache.shape),
                 device=device, last_dim_contiguous=True)  # fmt: skip
    hkv = k_cache.shape[2]
    if k_cache.shape[3] != head_dim:
        raise ValueError(f"{op}: k_cache head dim must be {head_dim} (q's), got {k_cache.shape[3]}")
    if q_heads % hkv:
        raise ValueError(f"{op}: q heads ({q_heads}) must be a multiple of kv heads ({hkv})")


def validate_lengths(op, bsz, device, **named):
    for name, t in named.items():
        if t is not None:
            check_tensor(op, name, t, dtypes=(torch.int32,), shape=[bsz], device=device,
                         contiguous=True)  # fmt: skip


def _validate(q, k_cache, v_cache, cache_lens, q_lens, cache_rows, tree_mask, scale, out,
              workspace):  # fmt: skip
    check_tensor(OP, "q", q, dtypes=DTYPES, ndim=4, last_dim_contiguous=True)
    bsz, q_max, hq, d = q.shape
    if not (1 <= d <= MAX_HEAD_DIM and 1 <= q_max <= MAX_Q and bsz >= 1):
        raise ValueError(
            f"{OP}: q must be [B >= 1, 1 <= q_max <= {MAX_Q}, Hq, 1 <= d <= {MAX_HEAD_DIM}], "
            f"got {list(q.shape)}"
        )
    validate_cache(OP, hq, d, q.dtype, q.device, k_cache, v_cache)
    validate_lengths(OP, bsz, q.device, cache_lens=cache_lens, q_lens=q_lens,
                     cache_rows=cache_rows)  # fmt: skip
    if tree_mask is not None:
        if tree_mask.dtype == torch.int64:
            if q_max > 64:
                raise ValueError(
                    f"{OP}: a bit-packed tree_mask holds at most 64 nodes, q_max={q_max}"
                )
            check_tensor(OP, "tree_mask", tree_mask, shape=[bsz, q_max], device=q.device,
                         last_dim_contiguous=True)  # fmt: skip
        else:
            check_tensor(OP, "tree_mask", tree_mask, dtypes=(torch.bool,),
                         shape=[bsz, q_max, q_max], device=q.device, last_dim_contiguous=True)  # fmt: skip
    if scale is not None:
        check_float(OP, "scale", scale, positive=True)
    if out is not None:
        check_out(OP, "out", out, shape=q.shape, dtype=q.dtype, device=q.device)
        check_no_alias(OP, [("out", out), ("q", q), ("k_cache", k_cache), ("v_cache", v_cache)])
    if workspace is not None:
        need = workspace_numel(bsz, q_max, hq, k_cache.shape[2], d, k_cache.shape[1])
        check_tensor(OP, "workspace", workspace, dtypes=(torch.float32,), ndim=1,
                     device=q.device, contiguous=True)  # fmt: skip
        if workspace.numel() < need:
            raise ValueError(
                f"{OP}: workspace must hold >= {need} fp32 elements, got {workspace.numel()}"
            )


def gqa_attention_into(q, k_cache, v_cache, cache_lens, q_lens, cache_rows, tree_mask, scale,
                       out, workspace, backend) -> None:  # fmt: skip
    """Writes ``out``; inputs validated, ``workspace`` sized. No allocation, no host sync."""
    which = resolve_backend(OP, backend, q.device, IMPLEMENTED)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if which == "reference":
        out.copy_(reference.gqa_attention(q, k_cache, v_cache, cache_lens, q_lens,
                                          cache_rows=cache_rows, tree_mask=tree_mask, scale=scale))  # fmt: skip
        return
    if tree_mask is None:
        mask, mode = None, 0
    elif tree_mask.dtype == torch.int64:
        mask, mode = tree_mask, 2
    else:
        mask, mode = tree_mask.view(torch.uint8), 1
    launch_gqa_tiles(q, k_cache, v_cache, out, cache_lens, q_lens, q_starts=None,
                     cache_rows=cache_rows, mask=mask, mask_mode=mode, q_max=q.shape[1],
                     split=True, workspace=workspace, scale=scale)  # fmt: skip


def gqa_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_lens: torch.Tensor,
    q_lens: torch.Tensor,
    *,
    cache_rows: torch.Tensor | None = None,
    tree_mask: torch.Tensor | None = None,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    workspace: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Decode / tree-verify GQA attention over a KV pool layer (see ``reference.gqa_attention``).

    q ``[B, q_max, Hq, d]`` (bf16/fp16); caches ``[rows, capacity, Hkv, d]``; ``cache_lens``,
    ``q_lens`` (and ``cache_rows``, the pool row of each batch row) int32 ``[B]``; the new tokens'
    K/V must already be appended and ``cache_lens + q_lens <= capacity``. ``tree_mask``: bool
    ``[B, q_max, q_max]`` or bit rows int64 ``[B, q_max]``; None = causal. With ``out`` and
    ``workspace`` (fp32, ``workspace_numel(...)`` elements) nothing is allocated.
    Contract: ``faithful`` to the reference (module docstring), ``exact`` across batch
    compositions, pool rows and padded ``q_max``.
    """
    _validate(q, k_cache, v_cache, cache_lens, q_lens, cache_rows, tree_mask, scale, out,
              workspace)  # fmt: skip
    if torch.compiler.is_compiling():
        if out is None:
            return torch.ops.flashrt.gqa_attention(q, k_cache, v_cache, cache_lens, q_lens,
                                                   cache_rows, tree_mask, scale, backend)  # fmt: skip
        torch.ops.flashrt.gqa_attention_out(q, k_cache, v_cache, cache_lens, q_lens, cache_rows,
                                            tree_mask, scale, out, workspace, backend)  # fmt: skip
        return out
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if workspace is None:
        n = workspace_numel(q.shape[0], q.shape[1], q.shape[2], k_cache.shape[2], q.shape[3],
                            k_cache.shape[1])  # fmt: skip
        workspace = torch.empty(n, dtype=torch.float32, device=q.device)
    gqa_attention_into(q, k_cache, v_cache, cache_lens, q_lens, cache_rows, tree_mask, scale,
                       out, workspace, backend)  # fmt: skip
    return out


@torch.library.custom_op("flashrt::gqa_attention", mutates_args=())
def _gqa_attention_op(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_lens: torch.Tensor,
    q_lens: torch.Tensor, cache_rows: torch.Tensor | None, tree_mask: torch.Tensor | None,
    scale: float | None, backend: str,
) -> torch.Tensor:  # fmt: skip
    return gqa_attention(q, k_cache, v_cache, cache_lens, q_lens, cache_rows=cache_rows,
                         tree_mask=tree_mask, scale=scale, backend=backend)  # fmt: skip


@_gqa_attention_op.register_fake
def _(q, k_cache, v_cache, cache_lens, q_lens, cache_rows, tree_mask, scale, backend):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


@torch.library.custom_op("flashrt::gqa_attention_out", mutates_args=("out", "workspace"))
def _gqa_attention_out_op(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_lens: torch.Tensor,
    q_lens: torch.Tensor, cache_rows: torch.Tensor | None, tree_mask: torch.Tensor | None,
    scale: float | None, out: torch.Tensor, workspace: torch.Tensor, backend: str,
) -> None:  # fmt: skip
    gqa_attention_into(q, k_cache, v_cache, cache_lens, q_lens, cache_rows, tree_mask, scale,
                       out, workspace, backend)  # fmt: skip
