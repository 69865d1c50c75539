"""Query-invariant GQA decode / tree-verify attention (``gqa_attention(..., query_invariant=True)``).

Contract ``exact``: a live query's output bits are a function of its query vector, its *visible
logical key sequence*, the scale, the dtype and the head dim only. Node ``i`` of a row sees logical
positions ``0 .. n - 1``: the ``cache_len`` committed slots, then its ancestors among the new nodes
in slot order (the set bits of its mask row; causal: nodes ``0 .. i``), itself last, so
``n = cache_len + popcount(row)`` and logical ``cache_len + t`` is slot ``cache_len + (index of the
t-th set bit)``. Nothing else reaches the bits: not ``q_len``, ``q_max``, the tree shape, the other
nodes, the batch, nor where the sequence is cut between committed prefix and new nodes. So a
greedy chain of ``q = 1`` steps and a tree verification holding the same path give the same bits.

How:
- Geometry independent of every length: a query's keys are cut into splits of ``SPLIT_KEYS``
  logical positions and blocks of ``BLOCK_N`` at fixed absolute logical positions; one split is
  one program; a query of ``ceil(n / SPLIT_KEYS)`` splits writes its output directly when that is
  1, else partials that ``invariant_combine_kernel`` merges in split order (fixed 64-wide chunks).
- One tile shape and one instruction for every query: a program holds ``NODES`` nodes of
  ``ROWS`` tile rows each (a node's ``G`` query heads padded to a power of two, at least 4 rows:
  8 nodes x 8 rows at G = 8, 16 x 4 at G = 4; ``tile_layout``, a function of ``G`` only) as one
  64-row tile (warpgroup MMA); one KV head; one split. A node's rows are the same rows of the
  same instruction whatever sits in the other rows (a decode step is one live node of the tile),
  so ``q_max``, the batch, the tree and the node's place in the tile do not reach its bits: an
  MMA computes each output row from its own A row alone, in the same order at every row offset
  (checked bit for bit on the H200). Under the interpreter the dots are broadcast products
  summed in order (``_mma``), for the same reason: numpy's matmul rounds a row differently at
  another offset modulo 16.
- Committed blocks (every key below ``cache_len``) load K/V once for the tile. With
  ``CAUSAL_TILE_STEPS`` (the default) so do the causal mode's blocks reaching the
  new nodes (a node's logical positions are its slots there: each row's scores past its own
  extent are -inf, loads stop at the tile's extent). Otherwise (and under a tree mask) blocks reaching the new nodes
  take one step per live node ``c``: K and V gathered from node
  ``c``'s own slots (logical ``pos`` -> ``cache_len + select(bits, pos - cache_len)``, the index
  of a set bit: integer arithmetic), the same ``[64, d] x [d, 64]`` QK dot and online-softmax step and PV dot
  as a committed block, with -inf scores on every row but node ``c``'s; so a row sees exactly
  the step it would see in a committed block, and the other nodes' steps are exact identities
  for it (m kept, alpha = 1, p = 0: the PV dot adds zeros). Nodes past ``q_len`` are skipped.
  Keys past a node's own extent are zero-masked loads with -inf scores; a block wholly past a
  row's extent leaves its state unchanged. Compiled without FMA contraction. (Corner: an
  accumulator that is exactly -0, possible only if every weighted value is -0, can turn +0 by
  those zero products.)
- fp32 scores and softmax statistics (exp2 domain), probabilities rounded to the K/V dtype for PV,
  one output rounding: ``faithful`` to ``reference.gqa_attention`` with the default mode's bound.
- K/V slots at or past ``cache_lens + q_lens`` are never read (the gather only follows mask bits
  below ``q_len``); programs whose nodes are all dead or past their extent do no KV work.
"""

from __future__ import annotations

import triton
import triton.language as tl

from flashrt_kernels.attention.gqa_kernels import (
    LOG2E,
    _normalized,
    _round_to,
    _split_sums,
    kv_descriptors,
)
from flashrt_kernels.attention.splits import invariant_geometry, vector_align
from flashrt_kernels.backends import triton_interpreter_active

COMBINE_CHUNK = 16
# Most nodes in one tile (G < 4 pads a node to 64 / MAX_NODES rows): the blocks reaching the new
# nodes run one dependent gather + dot per node, so this bounds that serial chain.
MAX_NODES = 16


def tile_layout(group: int, block_m: int) -> tuple[int, int]:
    """(tile rows per node, nodes per tile): a node's ``G`` query heads padded to a power of two,
    as many nodes as fill ``block_m`` rows. A function of ``G`` (and the geometry) only, never of
    the node count, so a chain step and a tree run the same tile."""
    rows = max(triton.next_power_of_2(group), block_m // MAX_NODES)
    return rows, max(1, block_m // rows)


@triton.jit
def _mma(a, b, acc, EMULATE: tl.constexpr):
    """``tl.dot(a, b, acc)``. Under the interpreter (``EMULATE``) a broadcast product summed over
    k in order: every output row is then computed the same way wherever it sits in the tile, as
    in the MMA; numpy's matmul (OpenBLAS) rounds a row differently at another row offset modulo
    16, which a node of 8 rows would see."""
    if EMULATE:
        prod = tl.sum(a[:, :, None] * b[None, :, :], 1)
        if acc is None:
            return prod
        else:
            return acc + prod
    else:
        return tl.dot(a, b, acc)


@triton.jit
def _popcount64(x):
    """Set bits of int64 ``x`` (SWAR; every mask clears the bits an arithmetic shift fills)."""
    x = x - ((x >> 1) & 0x5555555555555555)
    x = (x & 0x3333333333333333) + ((x >> 2) & 0x3333333333333333)
    x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0F
    x = x + (x >> 8)
    x = x + (x >> 16)
    x = x + (x >> 32)
    return (x & 127).to(tl.int32)


@triton.jit
def _select_bit(bits, t):
    """Index of the ``t``-th (0-based) set bit of ``bits``: the largest ``J`` in 0..63 with at
    most ``t`` set bits below ``J`` (binary search; meaningless where ``t >= popcount(bits)``)."""
    lo = t * 0
    for k in tl.static_range(6):
        cand = lo + (32 >> k)
        below = bits & ((tl.full(cand.shape, 1, tl.int64) << cand.to(tl.int64)) - 1)
        lo = tl.where(_popcount64(below) <= t, cand, lo)
    return lo


@triton.jit
def _node_bits(Mask, b, node, q_len, stride_mb, stride_mi, MASK_MODE: tl.constexpr):
    """Mask rows of ``node`` (a vector) as int64 bits, limited to the live nodes ``< q_len``."""
    live = node < q_len
    if MASK_MODE == 2:
        bits = tl.load(Mask + b * stride_mb + node * stride_mi, mask=live, other=0)
        keep = (tl.full([], 1, tl.int64) << tl.minimum(q_len, 63).to(tl.int64)) - 1
        bits = bits & tl.where(q_len >= 64, -1, keep)
    else:
        j = tl.arange(0, 64)
        row = tl.load(Mask + b * stride_mb + node[:, None] * stride_mi + j[None, :],
                      mask=live[:, None] & (j[None, :] < q_len), other=0)  # fmt: skip
        one = tl.full(row.shape, 1, tl.int64)
        bits = tl.sum(tl.where(row != 0, one << j[None, :].to(tl.int64), 0), 1)
    return bits


@triton.jit
def _visible(Mask, b, node, cache_len, q_len, stride_mb, stride_mi, MASK_MODE: tl.constexpr):
    """(n, bits) per entry of ``node``: the visible logical length (0 for a dead node) and the
    mask bits."""
    if MASK_MODE == 0:
        bits = node.to(tl.int64) * 0
        seen = node + 1
    else:
        bits = _node_bits(Mask, b, node, q_len, stride_mb, stride_mi, MASK_MODE)
        seen = _popcount64(bits)
    return tl.where(node < q_len, cache_len + seen, 0), bits


@triton.jit
def _softmax_step(s, pos, end_r, m_i, l_i):
    """Scores past each row's extent to -inf, then the online-softmax statistics (fp32)."""
    s = tl.where(pos[None, :] < end_r[:, None], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    return p, alpha, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def _load_kv(k_base, v_base, slot, ok, d, d_ok, stride_kn, stride_vn, ALIGN: tl.constexpr):
    """K and V rows at pool slots ``slot`` (zeros where not ``ok``)."""
    k_rows = tl.multiple_of(slot.to(tl.int64) * stride_kn, ALIGN)
    v_rows = tl.multiple_of(slot.to(tl.int64) * stride_vn, ALIGN)
    ld = ok[:, None] & d_ok[None, :]
    k = tl.load(k_base + k_rows[:, None] + d[None, :], mask=ld, other=0.0)
    v = tl.load(v_base + v_rows[:, None] + d[None, :], mask=ld, other=0.0)
    return k, v


@triton.jit
def _block_step(q, k, v, pos, end_r, m_i, l_i, acc, qk_scale, dtype: tl.constexpr,
                UPCAST: tl.constexpr):  # fmt: skip
    """One key block's online-softmax step for every row of the tile (scores past each row's
    extent -inf; probabilities rounded to the K/V dtype for the PV product)."""
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    s = _mma(q, tl.trans(k), None, UPCAST) * qk_scale
    p, alpha, m_i, l_i = _softmax_step(s, pos, end_r, m_i, l_i)
    p_lo = _round_to(p, dtype, UPCAST)
    if UPCAST:
        p_lo = p_lo.to(tl.float32)
    return m_i, l_i, _mma(p_lo, v, acc * alpha[:, None], UPCAST)


@triton.jit
def _node_slots(pos, cache_len, bits_r, end_r, nd, c, capacity, MASK_MODE: tl.constexpr):
    """Slots of node ``c``'s logical positions ``pos`` and which of them it reads."""
    pick = nd == c
    end_c = tl.max(tl.where(pick, end_r, 0), 0)
    if MASK_MODE == 0:
        slot = pos
    else:
        # every row of node c holds its bits; min, not max: bit 63 makes them negative
        bits_c = tl.min(tl.where(pick, bits_r, 0x7FFFFFFFFFFFFFFF), 0)
        t = pos - cache_len
        slot = tl.where(t < 0, pos, cache_len + _select_bit(bits_c, tl.maximum(t, 0)))
    return slot, (pos < end_c) & (slot < capacity)


@triton.jit
def gqa_invariant_kernel(
    Q, K, V, KDesc, VDesc, Out, Opart, Mpart, Lpart, CacheLens, QLens, Rows, Mask,
    stride_qb, stride_qt, stride_qh,
    stride_kr, stride_kn, stride_kh,
    stride_vr, stride_vn, stride_vh,
    stride_ob, stride_ot, stride_oh,
    stride_mb, stride_mi,
    capacity, q_max, max_splits, n_kv_heads, qk_scale,
    HEAD_DIM: tl.constexpr, G: tl.constexpr, ROWS: tl.constexpr, NODES: tl.constexpr,
    BLOCK_N: tl.constexpr, SPLIT_KEYS: tl.constexpr, BLOCK_D: tl.constexpr,
    MASK_MODE: tl.constexpr, HAS_ROWS: tl.constexpr, UPCAST: tl.constexpr, ALIGN: tl.constexpr,
    TMA: tl.constexpr = False, CAUSAL_TILE_STEPS: tl.constexpr = False,
):  # fmt: skip
    """One program: ``NODES`` nodes (``ROWS`` tile rows each: the node's ``G`` query heads) x one
    KV head x one split of ``SPLIT_KEYS`` logical keys. MASK_MODE: 0 causal, 1 bool/uint8
    ``[B, q_max, q_max]``, 2 bit rows int64 ``[B, q_max]``. TMA: the committed blocks load
    through the tensor descriptors ``KDesc`` / ``VDesc`` (``gqa_kernels.kv_descriptors``; the
    same values), else ``KDesc`` / ``VDesc`` are ``K`` / ``V`` again, unused. CAUSAL_TILE_STEPS
    (causal mode): the blocks reaching the new nodes take one step for the whole tile instead of
    one per node (the same bits; the default, splits.INVARIANT)."""
    grp = tl.program_id(0)
    split = tl.program_id(1)
    bh = tl.program_id(2)
    b = bh // n_kv_heads
    h = bh % n_kv_heads
    cache_len = tl.load(CacheLens + b)
    q_len = tl.load(QLens + b)
    if HAS_ROWS:
        row = tl.load(Rows + b).to(tl.int64)
    else:
        row = b.to(tl.int64)
    r = tl.arange(0, NODES * ROWS)
    nd = r // ROWS
    node = grp * NODES + nd
    head = h * G + r % ROWS
    r_ok = (r % ROWS < G) & (node < q_len)
    # nodes of this tile that hold a query: the per-node loops stop there (a dead node's rows
    # have no extent: their scores are -inf and their probabilities 0 whether or not it runs)
    n_live = tl.minimum(q_len - grp * NODES, NODES)
    n_vis, bits = _visible(Mask, b, node, cache_len, q_len, stride_mb, stride_mi, MASK_MODE)
    start = split * SPLIT_KEYS
    end_r = tl.minimum(n_vis, start + SPLIT_KEYS)
    end = tl.max(end_r, 0)
    if end > start:
        d = tl.arange(0, BLOCK_D)
        d_ok = d < HEAD_DIM
        q_rows = b.to(tl.int64) * stride_qb + node.to(tl.int64) * stride_qt + head * stride_qh
        q_rows = tl.multiple_of(q_rows, ALIGN)
        q = tl.load(Q + q_rows[:, None] + d[None, :], mask=r_ok[:, None] & d_ok[None, :],
                    other=0.0)  # fmt: skip
        if UPCAST:
            q = q.to(tl.float32)
        k_base = K + tl.multiple_of(row * stride_kr + h * stride_kh, ALIGN)
        v_base = V + tl.multiple_of(row * stride_vr + h * stride_vh, ALIGN)
        m_i = tl.full([NODES * ROWS], float("-inf"), tl.float32)
        l_i = tl.zeros([NODES * ROWS], tl.float32)
        acc = tl.zeros([NODES * ROWS, BLOCK_D], tl.float32)
        # committed blocks: the same keys for every node, loaded once
        mid = start + tl.maximum(tl.minimum(end, cache_len) - start, 0) // BLOCK_N * BLOCK_N
        desc_row = (row * capacity).to(tl.int32)
        for n0 in range(start, mid, BLOCK_N):
            pos = n0 + tl.arange(0, BLOCK_N)
            if TMA:
                k = KDesc.load([desc_row + n0, h * HEAD_DIM])
                v = VDesc.load([desc_row + n0, h * HEAD_DIM])
            else:
                k_rows = tl.multiple_of(pos.to(tl.int64) * stride_kn, ALIGN)
                v_rows = tl.multiple_of(pos.to(tl.int64) * stride_vn, ALIGN)
                k = tl.load(k_base + k_rows[:, None] + d[None, :], mask=d_ok[None, :], other=0.0)
                v = tl.load(v_base + v_rows[:, None] + d[None, :], mask=d_ok[None, :], other=0.0)
            m_i, l_i, acc = _block_step(q, k, v, pos, end_r, m_i, l_i, acc, qk_scale,
                                        v_base.dtype.element_ty, UPCAST)  # fmt: skip
        if (MASK_MODE == 0) and CAUSAL_TILE_STEPS:
            # causal: node c's logical positions are its slots, so every node of the tile takes
            # its step on the same keys at once (loads bounded by the tile's extent; each row's
            # scores past its own extent -inf): the step the per-node loop below gives it. Not
            # software-pipelined, as that loop (a second pipeline's buffers: not measured)
            for n0 in tl.range(mid, end, BLOCK_N, num_stages=1):
                pos = n0 + tl.arange(0, BLOCK_N)
                ok = (pos < end) & (pos < capacity)
                k, v = _load_kv(k_base, v_base, pos, ok, d, d_ok, stride_kn, stride_vn, ALIGN)
                m_i, l_i, acc = _block_step(q, k, v, pos, end_r, m_i, l_i, acc, qk_scale,
                                            v_base.dtype.element_ty, UPCAST)  # fmt: skip
        else:
            # blocks reaching the new nodes, one node at a time: node c's rows take the
            # committed block's step against node c's own slots (zero past its extent); the
            # other rows see -inf scores, an exact identity (m kept, alpha = 1, p = 0: their PV
            # adds exact zeros), as do rows whose extent ends before the block. K and V of a
            # node load together; the loop is not software-pipelined (shared memory) nor
            # unrolled (registers).
            for n0 in tl.range(mid, end, BLOCK_N, num_stages=1):
                pos = n0 + tl.arange(0, BLOCK_N)
                for c in tl.range(0, n_live, num_stages=1):
                    slot, ok = _node_slots(pos, cache_len, bits, end_r, nd, c, capacity,
                                           MASK_MODE)  # fmt: skip
                    k, v = _load_kv(k_base, v_base, slot, ok, d, d_ok, stride_kn, stride_vn,
                                    ALIGN)  # fmt: skip
                    # (``_block_step`` inline, with the other nodes' scores -inf: as a call with
                    # their extents at 0 it spilled 264 bytes instead of 200, tools/registers.py)
                    if UPCAST:
                        k = k.to(tl.float32)
                        v = v.to(tl.float32)
                    s = _mma(q, tl.trans(k), None, UPCAST) * qk_scale
                    s = tl.where((nd == c)[:, None], s, float("-inf"))
                    p, alpha, m_i, l_i = _softmax_step(s, pos, end_r, m_i, l_i)
                    p_lo = _round_to(p, v_base.dtype.element_ty, UPCAST)
                    if UPCAST:
                        p_lo = p_lo.to(tl.float32)
                    acc = _mma(p_lo, v, acc * alpha[:, None], UPCAST)
        n_splits = (n_vis + SPLIT_KEYS - 1) // SPLIT_KEYS
        mine = r_ok & (start < n_vis)
        o = tl.where(l_i[:, None] > 0, acc / tl.where(l_i > 0, l_i, 1.0)[:, None], 0.0)
        o_rows = b.to(tl.int64) * stride_ob + node.to(tl.int64) * stride_ot + head * stride_oh
        o_rows = tl.multiple_of(o_rows, ALIGN)
        direct = mine & (n_splits == 1)
        tl.store(Out + o_rows[:, None] + d[None, :], _round_to(o, Out.dtype.element_ty, UPCAST),
                 mask=direct[:, None] & d_ok[None, :])  # fmt: skip
        part = mine & (n_splits > 1)
        slot_p = ((b.to(tl.int64) * q_max + node) * max_splits + split) * (G * n_kv_heads) + head
        tl.store(Opart + slot_p[:, None] * HEAD_DIM + d[None, :], acc,
                 mask=part[:, None] & d_ok[None, :])  # fmt: skip
        tl.store(Mpart + slot_p, m_i, mask=part)
        tl.store(Lpart + slot_p, l_i, mask=part)


@triton.jit
def invariant_combine_kernel(
    Opart, Mpart, Lpart, Out, CacheLens, QLens, Mask,
    stride_ob, stride_ot, stride_oh, stride_mb, stride_mi,
    q_max, max_splits, n_q_heads,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, SPLIT_KEYS: tl.constexpr,
    MASK_MODE: tl.constexpr, CHUNK: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """One (query, head): merges its ``ceil(n / SPLIT_KEYS)`` splits in split order, ``CHUNK``
    at a time (fixed reduction shapes); queries of one split were written by the tile kernel;
    dead query slots and queries that see nothing are written as zeros."""
    i = tl.program_id(0)
    b = tl.program_id(1)
    hh = tl.program_id(2)
    cache_len = tl.load(CacheLens + b)
    q_len = tl.load(QLens + b)
    n_vis, _ = _visible(Mask, b, i + tl.arange(0, 1), cache_len, q_len, stride_mb, stride_mi,
                        MASK_MODE)  # fmt: skip
    n_splits = (tl.max(n_vis, 0) + SPLIT_KEYS - 1) // SPLIT_KEYS
    if n_splits != 1:
        d = tl.arange(0, BLOCK_D)
        d_ok = d < HEAD_DIM
        base = (b.to(tl.int64) * q_max + i) * max_splits
        if n_splits <= CHUNK:  # one wave: each slot read once (the loop's bits for one chunk)
            l_all, acc = _split_sums(Opart, Mpart, Lpart, base * n_q_heads + hh, n_q_heads,
                                     n_splits, d, HEAD_DIM, CHUNK)  # fmt: skip
        else:
            l_all, acc = _merge_chunks(Mpart, Lpart, Opart, base, n_splits, n_q_heads, hh, d,
                                       d_ok, HEAD_DIM, CHUNK)  # fmt: skip
        o = _normalized(l_all, acc)
        o_ptr = Out + b.to(tl.int64) * stride_ob + i * stride_ot + hh * stride_oh + d
        tl.store(o_ptr, _round_to(o, Out.dtype.element_ty, UPCAST), mask=d_ok)


@triton.jit
def _merge_chunks(Mpart, Lpart, Opart, base, n_splits, n_q_heads, hh, d, d_ok,
                  HEAD_DIM: tl.constexpr, CHUNK: tl.constexpr):  # fmt: skip
    """More than ``CHUNK`` splits: the max over every chunk, then the sums chunk by chunk in
    split order (the summed weights and the weighted sum, as ``_split_sums``)."""
    m_all = tl.full([], float("-inf"), tl.float32)
    for c in range(0, n_splits, CHUNK):
        s = c + tl.arange(0, CHUNK)
        m = tl.load(Mpart + (base + s) * n_q_heads + hh, mask=s < n_splits, other=float("-inf"))
        m_all = tl.maximum(m_all, tl.max(m, 0))
    m_safe = tl.where(m_all == float("-inf"), 0.0, m_all)
    l_all = tl.zeros([], tl.float32)
    acc = tl.zeros(d.shape, tl.float32)
    for c in range(0, n_splits, CHUNK):
        s = c + tl.arange(0, CHUNK)
        s_ok = s < n_splits
        slot = (base + s) * n_q_heads + hh
        w = tl.exp2(tl.load(Mpart + slot, mask=s_ok, other=float("-inf")) - m_safe)
        l_all += tl.sum(w * tl.load(Lpart + slot, mask=s_ok, other=0.0), 0)
        o = tl.load(Opart + slot[:, None] * HEAD_DIM + d[None, :],
                    mask=s_ok[:, None] & d_ok[None, :], other=0.0)  # fmt: skip
        acc += tl.sum(w[:, None] * o, 0)
    return l_all, acc


def launch_invariant(q, k_cache, v_cache, out, cache_lens, q_lens, *, cache_rows, mask, mask_mode,
                     workspace, scale, config=None):  # fmt: skip
    """The query-invariant tile launch and its combine pass. Inputs validated, ``workspace``
    sized by ``splits.invariant_workspace_numel``. ``config`` overrides the geometry (benchmark
    sweeps only: the defaults are the contract's fixed geometry)."""
    cfg = invariant_geometry(config)
    bsz, q_max, hq, d = q.shape
    hkv, cap = k_cache.shape[2], k_cache.shape[1]
    group = hq // hkv
    upcast = triton_interpreter_active()
    block_d = max(16, triton.next_power_of_2(d))
    split_keys = cfg["SPLIT_KEYS"]
    max_splits = triton.cdiv(cap, split_keys)
    per = bsz * q_max * max_splits * hq
    opart = workspace[: per * d]
    mpart = workspace[per * d : per * (d + 1)]
    lpart = workspace[per * (d + 1) : per * (d + 2)]
    align = vector_align(q.element_size(), *q.stride()[:3], *out.stride()[:3],
                         *k_cache.stride()[:3], *v_cache.stride()[:3])  # fmt: skip
    mask_arg = mask if mask is not None else cache_lens
    smb = mask.stride(0) if mask is not None else 0
    smi = mask.stride(1) if mask is not None else 0
    rows, nodes = tile_layout(group, cfg["BLOCK_M"])
    descs = kv_descriptors(k_cache, v_cache, cfg["BLOCK_N"]) if cfg["TMA"] else None
    k_desc, v_desc = descs or (k_cache, v_cache)
    gqa_invariant_kernel[(triton.cdiv(q_max, nodes), max_splits, bsz * hkv)](
        q, k_cache, v_cache, k_desc, v_desc, out, opart, mpart, lpart, cache_lens, q_lens,
        cache_rows if cache_rows is not None else cache_lens, mask_arg,
        q.stride(0), q.stride(1), q.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        out.stride(0), out.stride(1), out.stride(2), smb, smi,
        cap, q_max, max_splits, hkv, scale * LOG2E,
        HEAD_DIM=d, G=group, ROWS=rows, NODES=nodes, BLOCK_N=cfg["BLOCK_N"],
        SPLIT_KEYS=split_keys, BLOCK_D=block_d, MASK_MODE=mask_mode,
        HAS_ROWS=cache_rows is not None, UPCAST=upcast, ALIGN=align, TMA=descs is not None,
        CAUSAL_TILE_STEPS=cfg["CAUSAL_TILE_STEPS"],
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], enable_fp_fusion=False,
    )  # fmt: skip
    invariant_combine_kernel[(q_max, bsz, hq)](
        opart, mpart, lpart, out, cache_lens, q_lens, mask_arg,
        out.stride(0), out.stride(1), out.stride(2), smb, smi,
        q_max, max_splits, hq,
        HEAD_DIM=d, BLOCK_D=block_d, SPLIT_KEYS=split_keys, MASK_MODE=mask_mode,
        CHUNK=COMBINE_CHUNK, UPCAST=upcast, num_warps=1, enable_fp_fusion=False,
    )  # fmt: skip
