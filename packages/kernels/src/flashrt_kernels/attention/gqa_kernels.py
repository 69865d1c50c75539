"""GQA split-KV attention over a KV pool: decode, tree verification (and, unsplit, packed prefill).

One program computes a tile of ``BLOCK_M`` (query, head) rows for one KV head: all the query heads
that share the KV head and as many query tokens as fit (row ``r`` of a row's tile space is token
``r // G``, head ``h * G + r % G``), over one split of the row's live context. Two tile launches
cover a batch: 16-row tiles for rows with at most ``NARROW_ROWS`` tile rows, wide tiles (warpgroup
MMA) for the others; each program leaves the rows of the other class alone (``splits`` has the
geometry). A row of one split writes its output directly; the combine pass merges the others'
splits in a fixed order and writes the zeros of dead query slots. With the geometry's ``MERGE``
(off by default until timed on a GPU) there is no combine pass: the last split program of a tile
to arrive merges its partials (``flashrt_kernels.arrival``), and the tiles write the zeros.

Batch invariance (contract ``exact`` across batch compositions): a row's class, split size and
tiles are functions of that row's own live extent and query count only, and tiles, splits and the
combine order are numbered from the row's own first token, so a row's bits do not depend on which
other rows share the launch, on ``B`` or on the padded ``q_max``.

Live extent: a program reads keys and values only at positions ``< cache_lens[b] + q_lens[b]``;
stale slots (even NaN) never reach the output; tiles with no live query and splits past a row's
extent do no KV work. Keys before the row's new tokens are visible to every query: those blocks run
without score masks; only the blocks holding new tokens (and the extent's last partial block)
apply the causal / ancestor mask. Causal tiles stop at the last key their last live query sees
(fully masked blocks contribute exactly nothing).

Numerics (``faithful``, bound in ``decode``): scores and softmax statistics in fp32 (exp2 domain),
probabilities rounded to the K/V dtype for the PV product (fp32 accumulation), output rounded once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashrt_kernels.arrival import arrived_last, tickets
from flashrt_kernels.attention.splits import (
    MAX_DOUBLINGS,
    NARROW_ROWS,
    RULE_KEYS,
    geometry,
    split_plan,
    vector_align,
)
from flashrt_kernels.backends import maxnreg_kwargs, pdl_supported, triton_interpreter_active
from flashrt_kernels.triton_helpers import cast_rne

# Bound vs the reference, per dtype: probabilities rounded to the dtype (relative 2^-8 / 2^-11 of
# each term, so at most that times max|v| in total) plus fp32 reordering, plus the output rounding.
ATOL_V = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-9, torch.float32: 2.0**-12}
RTOL = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10, torch.float32: 2.0**-16}
LOG2E = 1.4426950408889634
# Scores per masked block (the blocks holding new tokens): their per-score mask loads and pointers
# spill the registers of a 64-row tile at 64 keys (ptxas, triton 3.6), so wide tiles take them 32
# keys at a time (a tile key of the same name overrides it, for sweeps).
MASKED_ELEMENTS = 2048


@triton.jit
def _round_to(x, dtype: tl.constexpr, EMULATE: tl.constexpr):
    if EMULATE:
        return cast_rne(x, dtype)
    else:
        return x.to(dtype)


@triton.jit
def _row_chunk(total, q_len, G: tl.constexpr, NARROW: tl.constexpr, MIN_CHUNK: tl.constexpr,
               TARGET: tl.constexpr, KEYS_PER_ROW: tl.constexpr, WIDE_KEYS_PER_ROW: tl.constexpr,
               QUERY_CHUNK_CAP: tl.constexpr, QUERY_CHUNK_FLOOR: tl.constexpr,
               QUERY_SPLITS: tl.constexpr, DOUBLINGS: tl.constexpr):  # fmt: skip
    """Keys per split of a row (``splits.split_chunk`` is its host mirror)."""
    cap = tl.minimum(
        QUERY_CHUNK_CAP, tl.maximum(QUERY_CHUNK_FLOOR, (total + QUERY_SPLITS - 1) // QUERY_SPLITS)
    )
    kpr = tl.where(q_len * G > NARROW, WIDE_KEYS_PER_ROW, KEYS_PER_ROW)
    per_query = tl.minimum(kpr * q_len * G, cap)
    need = tl.maximum(per_query, (total + TARGET - 1) // TARGET)
    chunk = need * 0 + MIN_CHUNK
    for _ in tl.static_range(DOUBLINGS):
        chunk = tl.where(chunk < need, chunk * 2, chunk)
    return chunk


@triton.jit
def _scaled_max(s, qk_scale):
    """``max(s * qk_scale)`` per row as ``max(s) * qk_scale``: with ``qk_scale > 0`` (validated) and
    round-to-nearest monotonic, the same fp32 value, one multiply a row instead of one a score.
    The block's ``exp2(s * qk_scale - m)`` is then one fused multiply-add a score, as it was."""
    return tl.max(s, 1) * qk_scale


@triton.jit
def _attend_block(q, k_base, v_base, n0, end, cache_len, qi, row_live, bits, chain, Mask,
                  mask_rows, m_i, l_i, acc, stride_kn, stride_vn, d, d_ok, qk_scale,
                  BLOCK_N: tl.constexpr, MASK_MODE: tl.constexpr, MASKED: tl.constexpr,
                  UPCAST: tl.constexpr, ALIGN: tl.constexpr, k_desc=None, v_desc=None,
                  desc_row=0, desc_col=0, TMA: tl.constexpr = False):  # fmt: skip
    """One K/V block of the online softmax. ``MASKED``: the block may hold new tokens or end past
    the extent (loads bounded by ``end``, the causal / ancestor mask applied); otherwise every key
    is a committed one below ``end``, visible to every query. Mask mode 2: the row's first
    ``chain`` new tokens are causal; query ``qi >= chain`` sees them and new token ``j >= chain``
    where bit ``j - chain`` of its ``bits`` is set (``chain`` 0: plain bit rows).
    ``TMA`` (unmasked blocks only): K and V come through tensor descriptors over the pool's
    ``[slots, kv_heads * d]`` view, block ``(desc_row + n0, desc_col)``: the same values."""
    pos = n0 + tl.arange(0, BLOCK_N)
    kv_ok = pos < end
    if TMA and not MASKED:
        k = k_desc.load([desc_row + n0, desc_col])
        v = v_desc.load([desc_row + n0, desc_col])
    else:
        if MASKED:
            ld = kv_ok[:, None] & d_ok[None, :]
        else:
            ld = d_ok[None, :]
        k_rows = tl.multiple_of(pos.to(tl.int64) * stride_kn, ALIGN)
        v_rows = tl.multiple_of(pos.to(tl.int64) * stride_vn, ALIGN)
        k = tl.load(k_base + k_rows[:, None] + d[None, :], mask=ld, other=0.0)
        v = tl.load(v_base + v_rows[:, None] + d[None, :], mask=ld, other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
    s = tl.dot(q, tl.trans(k))
    if MASKED:
        s = s * qk_scale
        j = pos - cache_len
        visible = row_live[:, None] & kv_ok[None, :]
        if MASK_MODE == 0:
            visible = visible & (j[None, :] <= qi[:, None])
        elif MASK_MODE == 1:
            in_new = visible & (j[None, :] >= 0)
            node = tl.load(Mask + mask_rows[:, None] + j[None, :], mask=in_new, other=0)
            visible = visible & ((j[None, :] < 0) | (node != 0))
        else:
            t = j - chain  # the node index in the row's tree, negative in its causal chain
            tc = tl.minimum(tl.maximum(t, 0), 63).to(tl.int64)
            seen = (((bits[:, None] >> tc[None, :]) & 1) != 0) & (t[None, :] < 64)
            causal = (t[None, :] < 0) | (qi[:, None] < chain)
            new_ok = tl.where(causal, j[None, :] <= qi[:, None], seen)
            visible = visible & ((j[None, :] < 0) | new_ok)
        s = tl.where(visible, s, float("-inf"))
        m_blk = tl.max(s, 1)
    else:
        m_blk = _scaled_max(s, qk_scale)
    m_new = tl.maximum(m_i, m_blk)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    if MASKED:
        p = tl.exp2(s - m_safe[:, None])
    else:
        p = tl.exp2(s * qk_scale - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    p_lo = _round_to(p, v_base.dtype.element_ty, UPCAST)
    if UPCAST:
        p_lo = p_lo.to(tl.float32)
        v = v.to(tl.float32)
    acc = acc * alpha[:, None] + tl.dot(p_lo, v)
    return m_new, l_i, acc


@triton.jit
def _store_out(Out, o_rows, acc, l_i, row_live, d, d_ok, UPCAST: tl.constexpr):
    o = tl.where(l_i[:, None] > 0, acc / tl.where(l_i > 0, l_i, 1.0)[:, None], 0.0)
    tl.store(Out + o_rows[:, None] + d[None, :], _round_to(o, Out.dtype.element_ty, UPCAST),
             mask=row_live[:, None] & d_ok[None, :])  # fmt: skip


@triton.jit
def gqa_tile_kernel(
    Q, K, V, KDesc, VDesc, Out, Opart, Mpart, Lpart, Tickets,
    CacheLens, QLens, QStarts, Rows, Mask, Chain,
    stride_qb, stride_qt, stride_qh,
    stride_kr, stride_kn, stride_kh,
    stride_vr, stride_vn, stride_vh,
    stride_ob, stride_ot, stride_oh,
    stride_mb, stride_mi,
    capacity, slots, n_kv_heads, qk_scale, ticket_base, q_max,
    HEAD_DIM: tl.constexpr, G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    TAIL_N: tl.constexpr, BLOCK_D: tl.constexpr, MASK_MODE: tl.constexpr, SPLIT: tl.constexpr, PACKED: tl.constexpr,
    HAS_ROWS: tl.constexpr, UPCAST: tl.constexpr, ROW_CLASS: tl.constexpr,
    NARROW: tl.constexpr, MIN_CHUNK: tl.constexpr, TARGET: tl.constexpr,
    KEYS_PER_ROW: tl.constexpr, WIDE_KEYS_PER_ROW: tl.constexpr, QUERY_CHUNK_CAP: tl.constexpr,
    QUERY_CHUNK_FLOOR: tl.constexpr, QUERY_SPLITS: tl.constexpr, DOUBLINGS: tl.constexpr,
    ALIGN: tl.constexpr,
    PDL: tl.constexpr, ONE_LOOP: tl.constexpr, TMA: tl.constexpr = False,
    HAS_CHAIN: tl.constexpr = False, MERGE: tl.constexpr = False, MERGE_SLOTS: tl.constexpr = 1,
    MERGE_CHUNK: tl.constexpr = 1, MERGE_COLS: tl.constexpr = 16, MERGE_STAGES: tl.constexpr = 1,
    MERGE_GROUP: tl.constexpr = 0, MERGE_TICKETS: tl.constexpr = 1,
):  # fmt: skip
    """MASK_MODE: 0 causal, 1 bool/uint8 [B, q_max, q_max], 2 bit rows int64 [B, q_max], over
    the nodes after each row's causal chain of ``Chain[b]`` new tokens with ``HAS_CHAIN`` (tiles
    whose queries all lie in the chain stop at their last query's key, as causal tiles do).
    PACKED: queries and outputs are token-major ``[T, H, d]`` and row ``b`` owns tokens
    ``QStarts[b] .. QStarts[b + 1]`` (cu_seqlens); otherwise ``[B, q_max, H, d]``.
    ROW_CLASS: 0 every row, 1 rows of at most ``NARROW`` tile rows, 2 the others.
    PDL: the combine pass is launched as a programmatic dependent; each program lets it start at
    once (it is scheduled when the grid's last wave is resident; it waits for this grid's
    completion before it reads).
    ONE_LOOP: every key block goes through the masked loop (one software pipeline per program
    instead of an unmasked and a masked one).
    TMA: the unmasked blocks (committed keys, all below the extent) load through the tensor
    descriptors ``KDesc`` / ``VDesc`` over ``[rows * capacity, kv_heads * HEAD_DIM]`` (otherwise
    they are ``K`` / ``V`` again, unused); masked blocks keep bounded pointer loads.
    MERGE (split launches): no combine pass. A split program stores its partial and takes the
    tile's ticket (``Tickets[ticket_base + bh * tiles + tile]``); the last of the row's splits to
    arrive merges them in split order (``_merge_tile``: the weights over ``MERGE_SLOTS`` slots,
    then ``MERGE_CHUNK`` partials of ``MERGE_COLS`` columns at a time in a loop of
    ``MERGE_STAGES`` stages; with ``MERGE_GROUP``, by groups first: ``_merge_arrival``, and
    ``MERGE_TICKETS`` tickets a tile) and writes the output. The split-0 program of each
    tile writes the zeros of its dead query slots (below ``q_max``) that belong to this launch:
    every dead slot of its own class's rows, and for the wide launch also the narrow rows' slots
    past the narrow tiles (``NARROW`` rows)."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    tile = tl.program_id(0)
    split = tl.program_id(1)
    bh = tl.program_id(2)
    b = bh // n_kv_heads
    h = bh % n_kv_heads
    cache_len = tl.load(CacheLens + b)
    if PACKED:
        q_first = tl.load(QStarts + b)
        q_len = tl.load(QStarts + b + 1) - q_first
    else:
        q_len = tl.load(QLens + b)
    if HAS_ROWS:
        row = tl.load(Rows + b).to(tl.int64)
    else:
        row = b.to(tl.int64)
    total = tl.minimum(cache_len + q_len, capacity)
    if ROW_CLASS == 1:
        mine = q_len * G <= NARROW
    elif ROW_CLASS == 2:
        mine = q_len * G > NARROW
    else:
        mine = q_len >= 0

    r = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    qi = r // G
    head = h * G + r % G
    row_live = qi < q_len
    if SPLIT:
        chunk = _row_chunk(total, q_len, G, NARROW, MIN_CHUNK, TARGET, KEYS_PER_ROW,
                           WIDE_KEYS_PER_ROW, QUERY_CHUNK_CAP, QUERY_CHUNK_FLOOR, QUERY_SPLITS,
                           DOUBLINGS)  # fmt: skip
        n_splits = (total + chunk - 1) // chunk
        start = split * chunk
        end = tl.minimum(start + chunk, total)
    else:
        n_splits = 1
        start = split * 0
        end = total
    chain = q_len * 0
    if HAS_CHAIN:
        chain = tl.load(Chain + b)
    if MASK_MODE == 0:
        last_q = tl.minimum((tile * BLOCK_M + BLOCK_M - 1) // G, q_len - 1)
        end = tl.minimum(end, cache_len + last_q + 1)
    elif HAS_CHAIN:
        last_q = tl.minimum((tile * BLOCK_M + BLOCK_M - 1) // G, q_len - 1)
        end = tl.where(last_q < chain, tl.minimum(end, cache_len + last_q + 1), end)

    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    if PACKED:
        q_rows = (q_first + qi).to(tl.int64) * stride_qt + head * stride_qh
        o_rows = (q_first + qi).to(tl.int64) * stride_ot + head * stride_oh
    else:
        q_rows = b.to(tl.int64) * stride_qb + qi.to(tl.int64) * stride_qt + head * stride_qh
        o_rows = b.to(tl.int64) * stride_ob + qi.to(tl.int64) * stride_ot + head * stride_oh
    q_rows = tl.multiple_of(q_rows, ALIGN)
    o_rows = tl.multiple_of(o_rows, ALIGN)

    if mine & (tile * BLOCK_M < q_len * G) & (split < n_splits):
        q = tl.load(Q + q_rows[:, None] + d[None, :], mask=row_live[:, None] & d_ok[None, :],
                    other=0.0)  # fmt: skip
        if UPCAST:
            q = q.to(tl.float32)
        mask_rows = b * stride_mb + qi * stride_mi
        if MASK_MODE == 2:
            bits = tl.load(Mask + mask_rows, mask=row_live, other=0)
        else:
            bits = mask_rows
        k_base = K + tl.multiple_of(row * stride_kr + h * stride_kh, ALIGN)
        v_base = V + tl.multiple_of(row * stride_vr + h * stride_vh, ALIGN)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        if ONE_LOOP:
            mid = start
        else:
            mid = start + tl.maximum(tl.minimum(end, cache_len) - start, 0) // BLOCK_N * BLOCK_N
        desc_row = (row * capacity).to(tl.int32)
        for n0 in range(start, mid, BLOCK_N):
            m_i, l_i, acc = _attend_block(
                q, k_base, v_base, n0, end, cache_len, qi, row_live, bits, chain, Mask,
                mask_rows, m_i, l_i, acc, stride_kn, stride_vn, d, d_ok, qk_scale,
                BLOCK_N, MASK_MODE, False, UPCAST, ALIGN, KDesc, VDesc, desc_row,
                h * HEAD_DIM, TMA,
            )  # fmt: skip
        for n0 in range(mid, end, TAIL_N):
            m_i, l_i, acc = _attend_block(
                q, k_base, v_base, n0, end, cache_len, qi, row_live, bits, chain, Mask,
                mask_rows, m_i, l_i, acc, stride_kn, stride_vn, d, d_ok, qk_scale,
                TAIL_N, MASK_MODE, True, UPCAST, ALIGN,
            )  # fmt: skip
        if SPLIT:
            if n_splits == 1:
                _store_out(Out, o_rows, acc, l_i, row_live, d, d_ok, UPCAST)
            else:
                slot = ((b.to(tl.int64) * slots + split * q_len + qi) * (G * n_kv_heads)
                        + head)  # fmt: skip
                tl.store(Opart + slot[:, None] * HEAD_DIM + d[None, :], acc,
                         mask=row_live[:, None] & d_ok[None, :])  # fmt: skip
                tl.store(Mpart + slot, m_i, mask=row_live)
                tl.store(Lpart + slot, l_i, mask=row_live)
                if MERGE:
                    first = (b.to(tl.int64) * slots + qi) * (G * n_kv_heads) + head
                    _merge_arrival(Opart, Mpart, Lpart, Out, Tickets,
                                   ticket_base + (bh * tl.num_programs(0) + tile) * MERGE_TICKETS,
                                   o_rows, first, q_len * (G * n_kv_heads), split, n_splits,
                                   row_live, HEAD_DIM, BLOCK_D, MERGE_SLOTS, MERGE_GROUP,
                                   MERGE_CHUNK, MERGE_COLS, MERGE_STAGES, UPCAST)  # fmt: skip
        else:
            _store_out(Out, o_rows, acc, l_i, row_live, d, d_ok, UPCAST)
    if MERGE:
        if split == 0:
            dead = (qi >= q_len) & (qi < q_max)
            if q_len * G <= NARROW:
                if ROW_CLASS == 2:  # a narrow row: its slots past the narrow tiles
                    dead = dead & (r >= NARROW)
            elif ROW_CLASS == 1:  # a wide row: the wide launch writes its slots
                dead = dead & (r < 0)
            if tl.max(dead.to(tl.int32), 0) != 0:
                zero = tl.zeros((BLOCK_M, BLOCK_D), dtype=Out.dtype.element_ty)
                tl.store(Out + o_rows[:, None] + d[None, :], zero,
                         mask=dead[:, None] & d_ok[None, :])  # fmt: skip


@triton.jit
def _merge_arrival(Opart, Mpart, Lpart, Out, Tickets, tix, o_rows, first, step, split, n_splits,
                   row_live, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, SLOTS: tl.constexpr,
                   GROUP: tl.constexpr, CHUNK: tl.constexpr, COLS: tl.constexpr,
                   STAGES: tl.constexpr, UPCAST: tl.constexpr):  # fmt: skip
    """A split program's arrival after storing its partial (split ``s`` of a row at slot
    ``first + s * step``), with the tile's tickets from ``Tickets[tix]``. ``GROUP`` 0: the last
    of the ``n_splits`` to arrive merges them all. ``GROUP`` > 0: the splits arrive in groups of
    ``GROUP`` (ticket ``tix + 1 + g``); the last of a group merges its splits into the slot of
    the group's first split, then arrives at ``tix``, where the last group merges the groups'
    partials (so the last program reads about ``GROUP + n_splits / GROUP`` partials, not
    ``n_splits``). Either way the order is fixed by ``n_splits`` alone."""
    if GROUP == 0:
        if arrived_last(Tickets, tix, n_splits):
            _merge_tile(Opart, Mpart, Lpart, Out, o_rows, first, step, n_splits, row_live,
                        HEAD_DIM, BLOCK_D, SLOTS, CHUNK, COLS, STAGES, UPCAST, True)  # fmt: skip
    else:
        g0 = split // GROUP * GROUP
        n_groups = (n_splits + GROUP - 1) // GROUP
        if arrived_last(Tickets, tix + 1 + g0 // GROUP, tl.minimum(n_splits - g0, GROUP)):
            if n_groups == 1:
                _merge_tile(Opart, Mpart, Lpart, Out, o_rows, first, step, n_splits, row_live,
                            HEAD_DIM, BLOCK_D, GROUP, CHUNK, COLS, STAGES, UPCAST,
                            True)  # fmt: skip
            else:
                _merge_tile(Opart, Mpart, Lpart, Out, o_rows, first + g0 * step, step,
                            tl.minimum(n_splits - g0, GROUP), row_live, HEAD_DIM, BLOCK_D,
                            GROUP, CHUNK, COLS, STAGES, UPCAST, False)  # fmt: skip
                if arrived_last(Tickets, tix, n_groups):
                    _merge_tile(Opart, Mpart, Lpart, Out, o_rows, first, step * GROUP,
                                n_groups, row_live, HEAD_DIM, BLOCK_D, SLOTS // GROUP, CHUNK,
                                COLS, STAGES, UPCAST, True)  # fmt: skip


@triton.jit
def _merge_tile(Opart, Mpart, Lpart, Out, o_rows, first, step, count, row_live,
                HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, SLOTS: tl.constexpr,
                CHUNK: tl.constexpr, COLS: tl.constexpr, STAGES: tl.constexpr,
                UPCAST: tl.constexpr, TO_OUT: tl.constexpr):  # fmt: skip
    """``count`` partials of a tile's rows (partial ``s`` of row ``r`` at slot ``first[r] + s *
    step``) merged in order: the weights and their sum over ``SLOTS`` slots at once, then,
    ``COLS`` output columns at a time, the weighted outputs ``CHUNK`` partials at a time (so few
    registers stay live), through a loop of ``STAGES`` software-pipeline stages. ``TO_OUT``: the
    output written; else the merged partial (its max, summed weights and weighted sum) stored
    over the first partial's slot. Every load bypasses the L1 (other programs wrote the
    partials): plain loads are ``.cg``; a pipelined loop loads only the outputs (16-byte
    copies, L2 only) and picks a chunk's weights from the registers (a sum of one weight and
    zeros, exact)."""
    s = tl.arange(0, SLOTS)
    ok = (s[:, None] < count) & row_live[None, :]
    slot = first[None, :] + s[:, None].to(tl.int64) * step
    m = tl.load(Mpart + slot, mask=ok, other=float("-inf"), cache_modifier=".cg")
    m_all = tl.max(m, 0)
    m_safe = tl.where(m_all == float("-inf"), 0.0, m_all)
    w_all = tl.exp2(m - m_safe[None, :])
    lp = tl.load(Lpart + slot, mask=ok, other=0.0, cache_modifier=".cg")
    l_all = tl.sum(w_all * lp, 0)
    c = tl.arange(0, CHUNK)
    for c0 in tl.static_range(0, BLOCK_D, COLS):
        d = c0 + tl.arange(0, COLS)
        d_ok = d < HEAD_DIM
        acc = tl.zeros((first.shape[0], COLS), tl.float32)
        for j in tl.range(0, count, CHUNK, num_stages=STAGES):
            c_ok = ((j + c)[:, None] < count) & row_live[None, :]
            c_slot = first[None, :] + (j + c)[:, None].to(tl.int64) * step
            if STAGES == 1:
                w = tl.exp2(tl.load(Mpart + c_slot, mask=c_ok, other=float("-inf"),
                                    cache_modifier=".cg") - m_safe[None, :])  # fmt: skip
            else:  # (a pipelined 4-byte load would be an L1-cached copy)
                pick = s[None, :, None] == (j + c)[:, None, None]
                w = tl.sum(tl.where(pick, w_all[None, :, :], 0.0), 1)
            o = tl.load(Opart + c_slot[:, :, None] * HEAD_DIM + d[None, None, :],
                        mask=c_ok[:, :, None] & d_ok[None, None, :], other=0.0,
                        cache_modifier=".cg")  # fmt: skip
            acc += tl.sum(w[:, :, None] * o, 0)
        if TO_OUT:
            _store_out(Out, o_rows, acc, l_all, row_live, d, d_ok, UPCAST)
        else:
            tl.store(Opart + first[:, None] * HEAD_DIM + d[None, :], acc,
                     mask=row_live[:, None] & d_ok[None, :])  # fmt: skip
    if not TO_OUT:
        tl.store(Mpart + first, m_all, mask=row_live)
        tl.store(Lpart + first, l_all, mask=row_live)


@triton.jit
def split_combine_kernel(
    Opart, Mpart, Lpart, Out, CacheLens, QLens,
    stride_ob, stride_ot, stride_oh,
    capacity, slots, n_q_heads, q_max,
    HEAD_DIM: tl.constexpr, G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr,
    UPCAST: tl.constexpr, NARROW: tl.constexpr, MIN_CHUNK: tl.constexpr, TARGET: tl.constexpr,
    KEYS_PER_ROW: tl.constexpr, WIDE_KEYS_PER_ROW: tl.constexpr, QUERY_CHUNK_CAP: tl.constexpr,
    QUERY_CHUNK_FLOOR: tl.constexpr, QUERY_SPLITS: tl.constexpr, DOUBLINGS: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    """One (query, head): merges its splits in a fixed reduction shape (a power of two from 4 to
    ``TARGET`` slots, by the row's own split count; read at once up to 32 slots, 32 at a time
    above that, so one warp holds them without spilling). Rows of one split were written
    by the tile kernel. The grid covers only the query slots a split row can have
    (``split_plan``); the head-0 program of slot ``i`` writes the zeros of the dead slots ``i, i +
    grid, ...`` below ``q_max``, every head in one store (a padded step's dead slots cost little). PDL: launched as a programmatic
    dependent of the tile launch: every program reads the lengths, then waits for the tile grid
    to complete (and its writes to be visible) before it touches the partials or the output."""
    i = tl.program_id(0)
    b = tl.program_id(1)
    hh = tl.program_id(2)
    cache_len = tl.load(CacheLens + b)
    q_len = tl.load(QLens + b)
    if PDL:
        tl.extra.cuda.gdc_wait()
    d = tl.arange(0, BLOCK_D)
    o_rows = Out + b.to(tl.int64) * stride_ob
    o_row = o_rows + i * stride_ot
    if hh == 0:
        h = tl.arange(0, BLOCK_H)
        zero = tl.zeros((BLOCK_H, BLOCK_D), dtype=Out.dtype.element_ty)
        g = tl.num_programs(0)
        first = i + tl.maximum(q_len - i + g - 1, 0) // g * g  # the first dead slot i + k * g
        for j in range(first, q_max, g):
            tl.store(o_rows + j * stride_ot + h[:, None] * stride_oh + d[None, :], zero,
                     mask=(h[:, None] < n_q_heads) & (d[None, :] < HEAD_DIM))  # fmt: skip
    if i < q_len:
        total = tl.minimum(cache_len + q_len, capacity)
        chunk = _row_chunk(total, q_len, G, NARROW, MIN_CHUNK, TARGET, KEYS_PER_ROW,
                           WIDE_KEYS_PER_ROW, QUERY_CHUNK_CAP, QUERY_CHUNK_FLOOR, QUERY_SPLITS,
                           DOUBLINGS)  # fmt: skip
        n_splits = (total + chunk - 1) // chunk
        # the reduction's fixed shape: the row's split count rounded up to a power of two from 4
        # to TARGET (a function of the row alone), so rows of few splits (trees) do not pay for
        # TARGET masked slots
        first = (b.to(tl.int64) * slots + i) * n_q_heads + hh
        step = q_len * n_q_heads
        if n_splits != 1:
            if n_splits <= 4:
                o = _merge_splits(Opart, Mpart, Lpart, first, step, n_splits, d, HEAD_DIM, 4)
            elif n_splits <= 8:
                o = _merge_splits(Opart, Mpart, Lpart, first, step, n_splits, d, HEAD_DIM, 8)
            elif TARGET <= 16:
                o = _merge_splits(Opart, Mpart, Lpart, first, step, n_splits, d, HEAD_DIM,
                                  TARGET)  # fmt: skip
            elif n_splits <= 16:
                o = _merge_splits(Opart, Mpart, Lpart, first, step, n_splits, d, HEAD_DIM, 16)
            elif TARGET <= 32:
                o = _merge_splits(Opart, Mpart, Lpart, first, step, n_splits, d, HEAD_DIM,
                                  TARGET)  # fmt: skip
            elif n_splits <= 32:
                o = _merge_splits(Opart, Mpart, Lpart, first, step, n_splits, d, HEAD_DIM, 32)
            else:  # TARGET slots in 32-slot chunks (one warp holds 32 x 128 partial values)
                o = _merge_splits(Opart, Mpart, Lpart, first, step, n_splits, d, HEAD_DIM,
                                  TARGET, 32)  # fmt: skip
            tl.store(o_row + hh * stride_oh + d, _round_to(o, Out.dtype.element_ty, UPCAST),
                     mask=d < HEAD_DIM)  # fmt: skip


@triton.jit
def _merge_splits(Opart, Mpart, Lpart, first, step, n_splits, d, HEAD_DIM: tl.constexpr,
                  SLOTS: tl.constexpr, CHUNK: tl.constexpr = 0):  # fmt: skip
    """``_split_sums`` normalized (in each of the split combine's branches: fewer registers
    there than normalizing after them, 152 against 154 at 16/2 offline)."""
    l_all, acc = _split_sums(Opart, Mpart, Lpart, first, step, n_splits, d, HEAD_DIM, SLOTS,
                             CHUNK)  # fmt: skip
    return _normalized(l_all, acc)


@triton.jit
def _normalized(l_all, acc):
    """The merged output: the weighted sum over the summed weights (zeros where none)."""
    return tl.where(l_all > 0, acc / tl.where(l_all > 0, l_all, 1.0), 0.0)


@triton.jit
def _split_sums(Opart, Mpart, Lpart, first, step, n_splits, d, HEAD_DIM: tl.constexpr,
                SLOTS: tl.constexpr, CHUNK: tl.constexpr = 0):  # fmt: skip
    """A (query, head)'s ``n_splits`` partials (at most ``SLOTS``, at ``first + s * step``)
    merged in a fixed reduction shape: the max and the sum over ``SLOTS`` at once, the outputs
    read at once too, or ``CHUNK`` slots at a time in split order where ``CHUNK`` is set. Returns
    the summed weights and the weighted sum of the outputs (``_normalized`` divides them; the
    query-invariant combine does so after its branches: 78-80 registers there, 127 inside)."""
    s = tl.arange(0, SLOTS)
    s_ok = s < n_splits
    slot = first + s * step
    m = tl.load(Mpart + slot, mask=s_ok, other=float("-inf"))
    m_all = tl.max(m, 0)
    m_safe = tl.where(m_all == float("-inf"), 0.0, m_all)
    w = tl.exp2(m - m_safe)
    l_all = tl.sum(w * tl.load(Lpart + slot, mask=s_ok, other=0.0), 0)
    if CHUNK == 0:
        o = tl.load(Opart + slot[:, None] * HEAD_DIM + d[None, :],
                    mask=s_ok[:, None] & (d[None, :] < HEAD_DIM), other=0.0)  # fmt: skip
        acc = tl.sum(w[:, None] * o, 0)
    else:
        c = tl.arange(0, CHUNK)
        acc = tl.zeros(d.shape, tl.float32)
        for j in tl.static_range(0, SLOTS, CHUNK):
            c_ok = j + c < n_splits
            c_slot = first + (j + c) * step
            wc = tl.exp2(tl.load(Mpart + c_slot, mask=c_ok, other=float("-inf")) - m_safe)
            o = tl.load(Opart + c_slot[:, None] * HEAD_DIM + d[None, :],
                        mask=c_ok[:, None] & (d[None, :] < HEAD_DIM), other=0.0)  # fmt: skip
            acc += tl.sum(wc[:, None] * o, 0)
    return l_all, acc


def kv_descriptors(k_cache, v_cache, block_n: int):
    """Tensor descriptors for the tiles' committed K/V blocks: each pool viewed as
    ``[rows * capacity, kv_heads * d]``, blocks of ``[block_n, d]``. ``None`` where a pool does
    not have that view (positions, heads and dims not packed in that order, a base not 16-byte
    aligned, 2^31 positions or more) or the head dim is not a power of two, and with a Triton
    that has no host-side descriptors (before 3.4: the package asks for 3.2 or later)."""
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor
    except ImportError:
        return None

    descs = []
    for cache in (k_cache, v_cache):
        rows, cap, hkv, d = cache.shape
        packed = cache.stride()[1:] == (hkv * d, d, 1) and cache.stride(0) == cap * hkv * d
        if not packed or d != triton.next_power_of_2(d) or d * cache.element_size() < 16:
            return None
        if cache.data_ptr() % 16 or rows * cap >= 2**31:  # (block rows are int32 coordinates)
            return None
        descs.append(TensorDescriptor(cache, [rows * cap, hkv * d], [hkv * d, 1], [block_n, d]))
    return descs


def launch_gqa_tiles(
    q, k_cache, v_cache, out, cache_lens, q_lens, *, q_starts, cache_rows, mask, mask_mode,
    q_max, split, workspace, scale, config=None, chain_lens=None,
):  # fmt: skip
    """Launches the tile kernel: with ``split``, the narrow class, the wide class when ``q_max * G``
    allows wide rows, and the combine pass; otherwise one unsplit packed prefill launch. Inputs
    validated. ``config`` overrides the geometry (``splits.geometry``). ``chain_lens`` (mask mode
    2): each row's causal chain before its tree's bit rows."""
    bsz = cache_lens.shape[0]
    hq, d = q.shape[-2], q.shape[-1]
    hkv, cap = k_cache.shape[2], k_cache.shape[1]
    cfg = geometry(config, hkv)
    group = hq // hkv
    upcast = triton_interpreter_active()
    block_d = max(16, triton.next_power_of_2(d))
    packed = q_starts is not None
    if packed:
        sqb, sqt, sqh = 0, q.stride(0), q.stride(1)
        sob, sot, soh = 0, out.stride(0), out.stride(1)
    else:
        sqb, sqt, sqh = q.stride(0), q.stride(1), q.stride(2)
        sob, sot, soh = out.stride(0), out.stride(1), out.stride(2)
    align = vector_align(q.element_size(), sqb, sqt, sqh, sob, sot, soh,
                         *k_cache.stride()[:3], *v_cache.stride()[:3])  # fmt: skip
    rows = q_max * group
    if split:
        narrow_splits, wide_splits, slots, split_queries = split_plan(cap, q_max, group, cfg)
        per = bsz * slots * hq
        opart = workspace[: per * d]
        mpart = workspace[per * d : per * (d + 1)]
        lpart = workspace[per * (d + 1) : per * (d + 2)]
        n_narrow = triton.cdiv(min(rows, NARROW_ROWS), cfg["narrow"]["BLOCK_M"])
        launches = [("narrow", 1, narrow_splits, n_narrow)]
        if rows > NARROW_ROWS:
            launches.append(("wide", 2, wide_splits, triton.cdiv(rows, cfg["wide"]["BLOCK_M"])))
    else:
        slots = 0
        opart = mpart = lpart = out
        launches = [("prefill", 0, 1, triton.cdiv(rows, cfg["prefill"]["BLOCK_M"]))]
    mask_arg = mask if mask is not None else cache_lens
    smb = mask.stride(0) if mask is not None else 0
    smi = mask.stride(1) if mask is not None else 0
    chunks = {**{key: cfg[key] for key in RULE_KEYS}, "DOUBLINGS": MAX_DOUBLINGS}
    merge = split and cfg["MERGE"]
    pdl = split and not merge and cfg["PDL"] and pdl_supported(q.device)
    merge_plan = {}  # class -> (slots, group, tickets a tile)
    for name, _, n_splits, _ in launches:
        n_slots = triton.next_power_of_2(n_splits)
        by = min(cfg[name].get("MERGE_GROUP", 0), n_slots)  # (a power of two, or 0: flat)
        merge_plan[name] = (n_slots, by, 1 + (triton.cdiv(n_slots, by) if by else 0))
    n_tickets = sum(n_tiles * merge_plan[name][2] for name, *_, n_tiles in launches) * bsz * hkv
    ticket_buf = tickets(q.device, n_tickets) if merge else cache_lens
    ticket_base = 0
    for name, row_class, n_splits, n_tiles in launches:
        tiles = cfg[name]
        merge_slots, merge_group, merge_tickets = merge_plan[name]
        descs = kv_descriptors(k_cache, v_cache, tiles["BLOCK_N"]) if tiles.get("TMA") else None
        k_desc, v_desc = descs or (k_cache, v_cache)
        gqa_tile_kernel[(n_tiles, n_splits, bsz * hkv)](
            q, k_cache, v_cache, k_desc, v_desc, out, opart, mpart, lpart, ticket_buf,
            cache_lens, q_lens if q_lens is not None else cache_lens,
            q_starts if packed else cache_lens,
            cache_rows if cache_rows is not None else cache_lens, mask_arg,
            chain_lens if chain_lens is not None else cache_lens,
            sqb, sqt, sqh,
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
            sob, sot, soh, smb, smi,
            cap, slots, hkv, scale * LOG2E, ticket_base, q_max,
            HEAD_DIM=d, G=group, BLOCK_M=tiles["BLOCK_M"], BLOCK_N=tiles["BLOCK_N"],
            TAIL_N=min(tiles["BLOCK_N"],
                       max(16, tiles.get("MASKED_ELEMENTS", MASKED_ELEMENTS) // tiles["BLOCK_M"])),
            BLOCK_D=block_d, MASK_MODE=mask_mode, SPLIT=split, PACKED=packed,
            HAS_ROWS=cache_rows is not None, UPCAST=upcast, ROW_CLASS=row_class,
            NARROW=NARROW_ROWS, ALIGN=align, PDL=pdl, ONE_LOOP=tiles.get("ONE_LOOP", False),
            TMA=descs is not None, HAS_CHAIN=chain_lens is not None, MERGE=merge,
            MERGE_SLOTS=merge_slots, MERGE_CHUNK=min(tiles.get("MERGE_CHUNK", 1), merge_slots),
            MERGE_COLS=min(tiles.get("MERGE_COLS", block_d), block_d),
            MERGE_STAGES=tiles.get("MERGE_STAGES", 1), MERGE_GROUP=merge_group,
            MERGE_TICKETS=merge_tickets,
            **chunks,
            num_warps=tiles["num_warps"], num_stages=tiles["num_stages"],
            **maxnreg_kwargs(tiles.get("MAXNREG")), enable_fp_fusion=True,
        )  # fmt: skip
        ticket_base += n_tiles * bsz * hkv * merge_tickets
    if split and not merge:
        # one warp a program: its slot reduction stays within the warp (4 warps reduced across
        # warps through shared memory: tree calls 1.02-1.49x slower on an H100,
        # docs/kernels/attention.md, "The split combine by split count, one warp a program")
        split_combine_kernel[(max(1, split_queries), bsz, hq)](
            opart, mpart, lpart, out, cache_lens, q_lens,
            out.stride(0), out.stride(1), out.stride(2),
            cap, slots, hq, q_max,
            HEAD_DIM=d, G=group, BLOCK_D=block_d, BLOCK_H=triton.next_power_of_2(hq),
            UPCAST=upcast, NARROW=NARROW_ROWS, PDL=pdl, **chunks, num_warps=1, launch_pdl=pdl,
            enable_fp_fusion=True,
        )  # fmt: skip
