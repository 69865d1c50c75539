"""Triton kernels of the exact select (hint-free radix rounds and the hinted guess pass).

A row is split into ``S`` chunks, one program each (``S = 1`` for short rows or large batches).
Every pass is its own launch, so programs of a row never wait on one another:

- pass 0 (``_pass_kernel`` ROUND 0): histogram of the top 11 bits of the order key into the row's
  global histogram (atomics); with a hint it also counts the scores at or above every guessed
  threshold;
- pass 1: every program re-derives the top digit from the global histogram (the same scan in every
  program, so no extra launch), then histograms the next 11 bits under that prefix; with a hint,
  a row whose tightest threshold count is in [k, CAP] collects its candidates here instead;
- pass 2: the last 10 bits (global histogram and a per-program histogram for tie ranks);
- ``_collect_kernel``: the exact K-th key T is known; keys > T get slots through a per-row atomic
  counter (their order is fixed by the final sort), keys == T take the lowest-index ties from the
  per-program tie counts (deterministic whatever the capacity: ties are never buffered beyond k);
- ``_finish_kernel``: one program per row sorts the candidates on the 64-bit composite
  (key, -index), writes values / indices / pads, publishes the state and re-zeroes the histograms
  and counters it owns, so the workspace is ready for the next call without a memset.
"""

from __future__ import annotations

import triton
import triton.language as tl

NB: tl.constexpr = tl.constexpr(2048)  # bins of the 11-bit digits
NB_LOW: tl.constexpr = tl.constexpr(1024)  # bins of the last 10-bit digit
N_GUESS = 4  # thresholds counted by the hinted pass


@triton.jit
def _order_key(x):
    """fp32 -> int32 order-preserving key; NaN is the maximum, -0.0 equals +0.0."""
    bits = x.to(tl.int32, bitcast=True)
    key = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    key = tl.where(key == -1, 0, key)
    return tl.where(x != x, 0x7FFFFFFF, key)


@triton.jit
def _pick(hist_ptr, krem, NBINS: tl.constexpr):
    """The digit holding the krem-th largest element and krem within that digit's bin.

    A histogram holding fewer than krem elements (the later rounds of a row a guess admitted are
    never filled) would give digit -1; it is clamped to 0 because callers index per-digit
    buffers with it (``_threshold``'s tie count, the collect pass's per-program tie counts)."""
    bins = tl.arange(0, NBINS)
    h = tl.load(hist_ptr + bins)
    total = tl.sum(h, axis=0)
    inc = total - tl.cumsum(h, axis=0) + h  # elements in bins >= d
    d = tl.maximum(tl.sum((inc >= krem).to(tl.int32), axis=0) - 1, 0)
    above = tl.sum(tl.where(bins == d, inc - h, 0), axis=0)
    return d, krem - above


@triton.jit
def _row_setup(LEN, b, n, k, HAS_LEN: tl.constexpr):
    length = n + b * 0  # a tensor even where n is specialized to a constant
    if HAS_LEN:
        length = tl.minimum(tl.maximum(tl.load(LEN + b), 0), n)
    return length, tl.minimum(length, k)


@triton.jit
def _load_keys(row_ptr, idx, m):
    return _order_key(tl.load(row_ptr + idx, mask=m, other=0.0).to(tl.float32))


@triton.jit
def _guesses(row_ptr, HINT, STATE, b, length, k, KP: tl.constexpr, STATE_WORDS: tl.constexpr):
    """Four candidate threshold keys: the smallest key at the hinted positions, the previous
    K-th key and accepted key (when the state is valid) and the smaller of the first two."""
    slots = tl.arange(0, KP)
    h = tl.load(HINT + b * k + slots, mask=slots < k, other=-1)
    ok = (h >= 0) & (h < length)
    keys = _load_keys(row_ptr, tl.where(ok, h, 0), ok)
    g0 = tl.min(tl.where(ok, keys, 0x7FFFFFFF), axis=0)
    valid = tl.load(STATE + b * STATE_WORDS + 0) == 1
    g1 = tl.where(valid, tl.load(STATE + b * STATE_WORDS + 1), 0x7FFFFFFF)
    g2 = tl.where(valid, tl.load(STATE + b * STATE_WORDS + 2), 0x7FFFFFFF)
    return g0, g1, g2, tl.minimum(g0, g1)


@triton.jit
def _accepted(TCNT, TH, b, kk, CAP: tl.constexpr):
    """(admitted, threshold key, its count): the tightest counted guess with count in [kk, CAP]."""
    g = tl.arange(0, 4)
    cnt = tl.load(TCNT + b * 4 + g)
    th = tl.load(TH + b * 4 + g)
    ok = (cnt >= kk) & (cnt <= CAP) & (kk > 0)
    best = tl.min(tl.where(ok, cnt, 2147483647), axis=0)
    admitted = best < 2147483647
    pick = tl.min(tl.where(ok & (cnt == best), g, 4), axis=0)
    th_acc = tl.sum(tl.where(g == pick, th, 0), axis=0)
    return admitted, th_acc, best


@triton.jit
def _digit_histogram(key, m, top, prefix22, ROUND: tl.constexpr, NBINS: tl.constexpr):
    """Histogram of this round's radix digit (11 + 11 + 10 bits of the key) over the lanes ``m``
    whose earlier digits match the selected prefix; unselected lanes are not counted."""
    if ROUND == 0:
        sel = m
        digit = ((key >> 21) & 2047) ^ 1024
    elif ROUND == 1:
        sel = m & ((key >> 21) == top)
        digit = (key >> 10) & 2047
    else:
        sel = m & ((key >> 10) == prefix22)
        digit = key & 1023
    digit = tl.where(sel, digit, 0)
    dropped = tl.sum((~sel).to(tl.int32), axis=0)
    return tl.histogram(digit, NBINS) - tl.where(tl.arange(0, NBINS) == 0, dropped, 0)


@triton.jit
def _pass_kernel(
    SC, stride_s, LEN, HIST, LHIST, CNT, CAND, HINT, STATE, TCNT, TH, BM, stride_bm,
    n, k, chunk, n_split, cap,
    ROUND: tl.constexpr, HAS_LEN: tl.constexpr, HINTED: tl.constexpr, NBINS: tl.constexpr,
    PRECOUNTED: tl.constexpr, HAS_BMAX: tl.constexpr,
    KP: tl.constexpr, STATE_WORDS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    s = tl.program_id(1)
    row_ptr = SC + b.to(tl.int64) * stride_s
    length, kk = _row_setup(LEN, b, n, k, HAS_LEN)
    start = s * chunk
    end = tl.minimum(start + chunk, length)
    hist_row = HIST + b * 3 * NB
    adm = kk * 0
    th_acc = kk * 0
    if HINTED:
        if ROUND >= 1 or PRECOUNTED:
            admitted, th_acc, _ = _accepted(TCNT, TH, b, kk, cap)
            adm = admitted.to(tl.int32)
            if ROUND != 1:
                end = tl.where(adm != 0, start, end)
    krem = kk
    d0 = 0
    d1 = 0
    if ROUND >= 1:
        d0, krem = _pick(hist_row, krem, NB)
    if ROUND >= 2:
        d1, krem = _pick(hist_row + NB, krem, NB)
    top = d0 - 1024  # signed top 11 bits
    prefix22 = top * 2048 + d1
    g0 = 0
    g1 = 0
    g2 = 0
    g3 = 0
    if HINTED and not PRECOUNTED:
        if ROUND == 0:
            g0, g1, g2, g3 = _guesses(row_ptr, HINT, STATE, b, length, k, KP, STATE_WORDS)
            gi = tl.arange(0, 4)
            gv = tl.where(gi == 0, g0, tl.where(gi == 1, g1, tl.where(gi == 2, g2, g3)))
            tl.store(TH + b * 4 + gi, gv, mask=gi < tl.where(s == 0, 4, 0))
    hist = tl.zeros([NBINS], dtype=tl.int32)
    c0 = kk * 0
    c1 = kk * 0
    c2 = kk * 0
    c3 = kk * 0
    lanes = tl.arange(0, BLOCK)
    for off in range(start, end, BLOCK):
        idx = off + lanes
        m = idx < end
        key = _load_keys(row_ptr, idx, m)
        if adm != 0:
            take = m & (key >= th_acc)
            if HAS_BMAX:  # a block whose maximum ranks below the threshold holds no candidate
                sub = off // 32 + tl.arange(0, BLOCK // 32)
                mx = tl.load(BM + b.to(tl.int64) * stride_bm + sub, mask=sub * 32 < end)
                live = tl.max(tl.where(sub * 32 < end, _order_key(mx), -2147483647), axis=0)
                take = take & ((lanes * 0 + (live >= th_acc).to(tl.int32)) != 0)
            n_take = tl.sum(take.to(tl.int32), axis=0)
            if n_take > 0:
                base = tl.atomic_add(CNT + b, n_take)
                pos = base + tl.cumsum(take.to(tl.int32), axis=0) - 1
                tl.store(CAND + b * cap + pos, idx, mask=take)
        else:
            hist += _digit_histogram(key, m, top, prefix22, ROUND, NBINS)
            if HINTED and not PRECOUNTED:
                if ROUND == 0:
                    c0 += tl.sum((m & (key >= g0)).to(tl.int32), axis=0)
                    c1 += tl.sum((m & (key >= g1)).to(tl.int32), axis=0)
                    c2 += tl.sum((m & (key >= g2)).to(tl.int32), axis=0)
                    c3 += tl.sum((m & (key >= g3)).to(tl.int32), axis=0)
    if adm == 0:
        bins = tl.arange(0, NBINS)
        tl.atomic_add(hist_row + ROUND * NB + bins, hist, mask=hist != 0)
        if ROUND == 2:
            tl.store(LHIST + (b * n_split + s) * NB_LOW + bins, hist)
        if HINTED and not PRECOUNTED:
            if ROUND == 0:
                tl.atomic_add(TCNT + b * 4 + 0, c0)
                tl.atomic_add(TCNT + b * 4 + 1, c1)
                tl.atomic_add(TCNT + b * 4 + 2, c2)
                tl.atomic_add(TCNT + b * 4 + 3, c3)


@triton.jit
def _threshold(hist_row, kk):
    """(T, ties needed, ties in the row) from the three global histograms of a row."""
    d0, krem = _pick(hist_row, kk, NB)
    d1, krem = _pick(hist_row + NB, krem, NB)
    d2, krem = _pick(hist_row + 2 * NB, krem, NB_LOW)
    t = ((d0 - 1024) << 21) | (d1 << 10) | d2
    ties = tl.load(hist_row + 2 * NB + d2)
    return t, krem, ties, d2


@triton.jit
def _collect_kernel(
    SC, stride_s, LEN, HIST, LHIST, CNT, CAND, TCNT, TH,
    n, k, chunk, n_split, cap,
    HAS_LEN: tl.constexpr, HINTED: tl.constexpr, SP: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    s = tl.program_id(1)
    row_ptr = SC + b.to(tl.int64) * stride_s
    length, kk = _row_setup(LEN, b, n, k, HAS_LEN)
    start = s * chunk
    end = tl.minimum(start + chunk, length)
    if HINTED:
        admitted, _, _ = _accepted(TCNT, TH, b, kk, cap)
        end = tl.where(admitted, start, end)
    t, krem, _, d2 = _threshold(HIST + b * 3 * NB, kk)
    n_gt = kk - krem
    prev = tl.arange(0, SP)
    ties_before = tl.sum(
        tl.load(LHIST + (b * n_split + prev) * NB_LOW + d2, mask=prev < s, other=0), axis=0
    )
    lanes = tl.arange(0, BLOCK)
    for off in range(start, end, BLOCK):
        idx = off + lanes
        m = idx < end
        key = _load_keys(row_ptr, idx, m)
        gt = m & (key > t)
        n_take = tl.sum(gt.to(tl.int32), axis=0)
        if n_take > 0:
            base = tl.atomic_add(CNT + b, n_take)
            pos = base + tl.cumsum(gt.to(tl.int32), axis=0) - 1
            tl.store(CAND + b * cap + pos, idx, mask=gt)
        eq = m & (key == t)
        rank = ties_before + tl.cumsum(eq.to(tl.int32), axis=0) - 1
        take = eq & (rank < krem)
        tl.store(CAND + b * cap + n_gt + rank, idx, mask=take)
        ties_before += tl.sum(eq.to(tl.int32), axis=0)


@triton.jit
def _emit(row_ptr, bits_ptr, b, CAND, n_cand, kk, k, length, OV, OI, STATE, TCNT, TH,
          acc_key, acc_cnt, path, HINTED: tl.constexpr, HAS_STATE: tl.constexpr,
          CAP: tl.constexpr, STATE_WORDS: tl.constexpr):  # fmt: skip
    """Sort the row's n_cand candidates on (key, -index), write the first k (pads past kk) and
    publish the row's state."""
    slots = tl.arange(0, CAP)
    live = slots < n_cand
    idx = tl.load(CAND + b * CAP + slots, mask=live, other=0)
    key = _load_keys(row_ptr, idx, live)
    comp = (key.to(tl.int64) << 32) - 1 - idx.to(tl.int64)
    comp = tl.where(live, comp, tl.full([CAP], -1, tl.int64) << 63)
    comp = tl.sort(comp, descending=True)
    key_s = (comp >> 32) + 1
    idx_s = ((key_s << 32) - 1 - comp).to(tl.int32)
    out_ok = slots < kk
    # values are copied as raw bits (bits_ptr / OV are integer views): NaN payloads survive
    bits = tl.load(bits_ptr + idx_s, mask=out_ok, other=0)
    pad = (
        tl.full([CAP], float("-inf"), tl.float32)
        .to(row_ptr.dtype.element_ty)
        .to(bits_ptr.dtype.element_ty, bitcast=True)
    )
    wr = slots < k
    tl.store(OV + b * k + slots, tl.where(out_ok, bits, pad), mask=wr)
    tl.store(OI + b * k + slots, tl.where(out_ok, idx_s, -1), mask=wr)
    if HAS_STATE:
        kth = tl.sum(tl.where(slots == kk - 1, key_s, 0), axis=0).to(tl.int32)
        w = tl.arange(0, 32)  # STATE_WORDS <= 32
        row = tl.zeros([32], dtype=tl.int32)
        row = tl.where(w == 0, (kk > 0).to(tl.int32), row)
        row = tl.where(w == 1, kth, row)
        row = tl.where(w == 2, acc_key, row)
        row = tl.where(w == 3, acc_cnt, row)
        row = tl.where(w == 5, path, row)
        row = tl.where(w == 6, length, row)
        row = tl.where(w == 7, k, row)
        if HINTED:
            row = tl.where(w == 4, 4, row)
            gi = w - 8
            tmask = (gi >= 0) & (gi < 4)
            th = tl.load(TH + b * 4 + gi, mask=tmask, other=0)
            row = tl.where(tmask, th, row)
            ci = w - 8 - (STATE_WORDS - 8) // 2
            cmask = (ci >= 0) & (ci < 4)
            row = tl.where(cmask, tl.load(TCNT + b * 4 + ci, mask=cmask, other=0), row)
        tl.store(STATE + b * STATE_WORDS + w, row, mask=w < STATE_WORDS)


@triton.jit
def _finish_kernel(
    SC, stride_s, LEN, HIST, CNT, CAND, TCNT, TH, STATE, OV, OI, SCB,
    n, k,
    HAS_LEN: tl.constexpr, HINTED: tl.constexpr, HAS_STATE: tl.constexpr,
    CAP: tl.constexpr, KO: tl.constexpr, STATE_WORDS: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    row_ptr = SC + b.to(tl.int64) * stride_s
    length, kk = _row_setup(LEN, b, n, k, HAS_LEN)
    hist_row = HIST + b * 3 * NB
    admitted = kk < 0
    th_acc = kk * 0
    cnt_acc = kk * 0
    if HINTED:
        admitted, th_acc, cnt_acc = _accepted(TCNT, TH, b, kk, CAP)
    if admitted:
        acc_key = th_acc
        acc_cnt = cnt_acc
    else:
        t, krem, ties, _ = _threshold(hist_row, kk)
        acc_key = t
        acc_cnt = kk - krem + ties
    n_cand = tl.where(admitted, cnt_acc, kk)
    _emit(row_ptr, SCB + b.to(tl.int64) * stride_s, b, CAND, n_cand, kk, k, length, OV, OI,
          STATE, TCNT, TH, acc_key, acc_cnt, admitted.to(tl.int32), HINTED, HAS_STATE, CAP,
          STATE_WORDS)  # fmt: skip
    # restore the workspace this row owns to zero for the next call
    bins = tl.arange(0, NB)
    tl.store(hist_row + bins, tl.zeros([NB], dtype=tl.int32))
    tl.store(hist_row + NB + bins, tl.zeros([NB], dtype=tl.int32))
    tl.store(hist_row + 2 * NB + bins, tl.zeros([NB], dtype=tl.int32), mask=bins < NB_LOW)
    tl.store(CNT + b, 0)
    if HINTED:
        tl.store(TCNT + b * 4 + tl.arange(0, 4), tl.zeros([4], dtype=tl.int32))


@triton.jit
def _pick_reg(h, krem, NBINS: tl.constexpr):
    bins = tl.arange(0, NBINS)
    total = tl.sum(h, axis=0)
    inc = total - tl.cumsum(h, axis=0) + h
    d = tl.maximum(tl.sum((inc >= krem).to(tl.int32), axis=0) - 1, 0)  # as in _pick
    above = tl.sum(tl.where(bins == d, inc - h, 0), axis=0)
    return d, krem - above


@triton.jit
def _row_hist(row_ptr, length, top, prefix22, ROUND: tl.constexpr, NBINS: tl.constexpr,
              BLOCK: tl.constexpr):  # fmt: skip
    hist = tl.zeros([NBINS], dtype=tl.int32)
    lanes = tl.arange(0, BLOCK)
    for off in range(0, length, BLOCK):
        idx = off + lanes
        m = idx < length
        key = _load_keys(row_ptr, idx, m)
        hist += _digit_histogram(key, m, top, prefix22, ROUND, NBINS)
    return hist


@triton.jit
def _row_select_kernel(
    SC, stride_s, LEN, CAND, STATE, OV, OI, SCB,
    n, k,
    HAS_LEN: tl.constexpr, HAS_STATE: tl.constexpr, CAP: tl.constexpr,
    STATE_WORDS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """The whole hint-free select of one row in one program (short rows / large batches): the
    three histogram rounds in registers, the collect with running counters, the sort."""
    b = tl.program_id(0)
    row_ptr = SC + b.to(tl.int64) * stride_s
    length, kk = _row_setup(LEN, b, n, k, HAS_LEN)
    h0 = _row_hist(row_ptr, length, 0, 0, 0, NB, BLOCK)
    d0, krem = _pick_reg(h0, kk, NB)
    top = d0 - 1024
    h1 = _row_hist(row_ptr, length, top, 0, 1, NB, BLOCK)
    d1, krem = _pick_reg(h1, krem, NB)
    prefix22 = top * 2048 + d1
    h2 = _row_hist(row_ptr, length, top, prefix22, 2, NB_LOW, BLOCK)
    d2, krem = _pick_reg(h2, krem, NB_LOW)
    t = (top << 21) | (d1 << 10) | d2
    ties = tl.sum(tl.where(tl.arange(0, NB_LOW) == d2, h2, 0), axis=0)
    n_gt = kk - krem
    gt_seen = kk * 0
    ties_seen = kk * 0
    lanes = tl.arange(0, BLOCK)
    for off in range(0, length, BLOCK):
        idx = off + lanes
        m = idx < length
        key = _load_keys(row_ptr, idx, m)
        gt = m & (key > t)
        pos = gt_seen + tl.cumsum(gt.to(tl.int32), axis=0) - 1
        tl.store(CAND + b * CAP + pos, idx, mask=gt)
        gt_seen += tl.sum(gt.to(tl.int32), axis=0)
        eq = m & (key == t)
        rank = ties_seen + tl.cumsum(eq.to(tl.int32), axis=0) - 1
        tl.store(CAND + b * CAP + n_gt + rank, idx, mask=eq & (rank < krem))
        ties_seen += tl.sum(eq.to(tl.int32), axis=0)
    tl.debug_barrier()  # the candidates written above are read back by other threads
    _emit(row_ptr, SCB + b.to(tl.int64) * stride_s, b, CAND, kk, kk, k, length, OV, OI,
          STATE, CAND, CAND, t, kk - krem + ties, kk * 0, False, HAS_STATE, CAP,
          STATE_WORDS)  # fmt: skip
