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

Numerics (``faithful``, bound in ``decode``): scores and softmax statistics in fp32 (exp2 domain),
probabilities rounded to the K/V dtype for the PV product (fp32 accumulation), output rounded once.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from flashrt_kernels.backends import triton_interpreter_active
from flashrt_kernels.triton_helpers import cast_rne

# Decode / tree tiles: 16 (query, head) rows (a q=1 step of a G=8 model fills half of one; 64-row
# tiles did 4-16x wasted MMA work at q=1 and were compute-bound). Prefill uses 64-row tiles.
BLOCK_M = 16
PREFILL_BLOCK_M = 64
MIN_CHUNK = 256
TARGET_SPLITS = 64
MAX_DOUBLINGS = 20
# Bound vs the reference, per dtype: probabilities rounded to the dtype (relative 2^-8 / 2^-11 of
# each term, so at most that times max|v| in total) plus fp32 reordering, plus the output rounding.
ATOL_V = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-9, torch.float32: 2.0**-12}
RTOL = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10, torch.float32: 2.0**-16}
LOG2E = 1.4426950408889634


def split_chunk(total: int, q_len: int, group: int, min_chunk: int = MIN_CHUNK,
                target: int = TARGET_SPLITS) -> int:  # fmt: skip
    """Host mirror of the in-kernel split size (keys per split) of a row."""
    need = max(4 * q_len * group, -(-total // target))
    chunk = min_chunk
    for _ in range(MAX_DOUBLINGS):
        if chunk < need:
            chunk *= 2
    return chunk


@functools.cache
def split_plan(capacity: int, q_max: int, group: int, min_chunk: int = MIN_CHUNK,
               target: int = TARGET_SPLITS) -> tuple[int, int]:  # fmt: skip
    """(most splits of any row, partial slots per row) for a cache capacity and q_max."""
    max_splits, slots = 1, 1
    for q in range(1, q_max + 1):
        c = split_chunk(1, q, group, min_chunk, target)
        s = min(target, -(-capacity // c))
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
    HEAD_DIM: tl.constexpr, G: tl.constexpr, BLOCK_D: tl.constexpr, UPCAST: tl.constexpr,
    MIN_CHUNK_: tl.constexpr, TARGET: tl.constexpr, DOUBLINGS: tl.constexpr,
):  # fmt: skip
    """One (query, head): merges its splits, all ``TARGET`` slots at once (a fixed reduction
    shape, whatever the split count); dead query slots are written as zeros."""
    i = tl.program_id(0)
    b = tl.program_id(1)
    hh = tl.program_id(2)
    cache_len = tl.load(CacheLens + b)
    q_len = tl.load(QLens + b)
    total = tl.minimum(cache_len + q_len, capacity)
    chunk = _row_chunk(total, q_len, G, MIN_CHUNK_, TARGET, DOUBLINGS)
    n_splits = tl.where(i < q_len, (total + chunk - 1) // chunk, 0)
    s = tl.arange(0, TARGET)
    s_ok = s < n_splits
    d = tl.arange(0, BLOCK_D)
    slot = ((b.to(tl.int64) * slots + i) + s * q_len) * n_q_heads + hh
    m = tl.load(Mpart + slot, mask=s_ok, other=float("-inf"))
    m_all = tl.max(m, 0)
    m_safe = tl.where(m_all == float("-inf"), 0.0, m_all)
    w = tl.exp2(m - m_safe)
    l_all = tl.sum(w * tl.load(Lpart + slot, mask=s_ok, other=0.0), 0)
    o = tl.load(Opart + slot[:, None] * HEAD_DIM + d[None, :],
                mask=s_ok[:, None] & (d[None, :] < HEAD_DIM), other=0.0)  # fmt: skip
    acc = tl.sum(w[:, None] * o, 0)
    o = tl.where(l_all > 0, acc / tl.where(l_all > 0, l_all, 1.0), 0.0)
    o_ptr = Out + b.to(tl.int64) * stride_ob + i * stride_ot + hh * stride_oh + d
    tl.store(o_ptr, _round_to(o, Out.dtype.element_ty, UPCAST), mask=d < HEAD_DIM)


DEFAULT_CONFIG = {"BLOCK_N": 64, "num_warps": 4, "num_stages": 2, "MIN_CHUNK": MIN_CHUNK,
                  "TARGET": TARGET_SPLITS, "BLOCK_M": BLOCK_M}  # fmt: skip


def launch_gqa_tiles(
    q, k_cache, v_cache, out, cache_lens, q_lens, *, q_starts, cache_rows, mask, mask_mode,
    q_max, split, workspace, scale, config=None,
):  # fmt: skip
    """Launches the tile kernel (and the combine pass when ``split``); inputs validated.
    ``config`` overrides ``DEFAULT_CONFIG`` (benchmark sweeps only: the defaults are the
    contract's fixed geometry)."""
    cfg = dict(DEFAULT_CONFIG, **(config or {}))
    bsz = cache_lens.shape[0]
    hq, d = q.shape[-2], q.shape[-1]
    hkv, cap = k_cache.shape[2], k_cache.shape[1]
    group = hq // hkv
    upcast = triton_interpreter_active()
    block_d = max(16, triton.next_power_of_2(d))
    n_tiles = triton.cdiv(q_max * group, cfg["BLOCK_M"])
    packed = q_starts is not None
    if packed:
        sqb, sqt, sqh = 0, q.stride(0), q.stride(1)
        sob, sot, soh = 0, out.stride(0), out.stride(1)
    else:
        sqb, sqt, sqh = q.stride(0), q.stride(1), q.stride(2)
        sob, sot, soh = out.stride(0), out.stride(1), out.stride(2)
    if split:
        max_splits, slots = split_plan(cap, q_max, group, cfg["MIN_CHUNK"], cfg["TARGET"])
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
    chunks = {"MIN_CHUNK_": cfg["MIN_CHUNK"], "TARGET": cfg["TARGET"], "DOUBLINGS": MAX_DOUBLINGS}
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
        HEAD_DIM=d, G=group, BLOCK_M_=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_D=block_d,
        MASK_MODE=mask_mode, SPLIT=split, PACKED=packed, HAS_ROWS=cache_rows is not None,
        UPCAST=upcast, **chunks, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )  # fmt: skip
    if split:
        split_combine_kernel[(q_max, bsz, hq)](
            opart, mpart, lpart, out, cache_lens, q_lens,
            out.stride(0), out.stride(1), out.stride(2),
            cap, slots, hq,
            HEAD_DIM=d, G=group, BLOCK_D=block_d, UPCAST=upcast, **chunks, num_warps=4,
        )  # fmt: skip


def workspace_numel(batch: int, q_max: int, q_heads: int, kv_heads: int, head_dim: int,
                    capacity: int, config: dict | None = None) -> int:  # fmt: skip
    """fp32 elements of the split workspace ``gqa_attention`` needs for these sizes."""
    cfg = dict(DEFAULT_CONFIG, **(config or {}))
    _, slots = split_plan(capacity, q_max, q_heads // kv_heads, cfg["MIN_CHUNK"], cfg["TARGET"])
    return batch * slots * q_heads * (head_dim + 2)
