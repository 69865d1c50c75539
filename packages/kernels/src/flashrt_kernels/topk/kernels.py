"""Triton kernels of the exact select: counting rounds, ordered collection, the finishing program.

Everything works on the order key of the scores (``_order_key``: int32, order-preserving, NaN
highest) and on a *bracket* ``lo < hi`` of keys per row with exact counts: ``count(key >= lo) =
clo >= kk`` and ``count(key >= hi) = chi < kk`` (``kk = min(k, length)``), so the K-th key ``T``
lies in ``[lo, hi)``. The bracket starts at ``(-2**31: length, 2**31: 0)`` and every counted
threshold narrows it. A row is *resolved* when either

- mode A: ``hi == lo + 1``, so ``T = lo`` exactly; the ``kk - chi`` ties at ``T`` with the lowest
  indices are kept (per-program counts at ``lo`` and ``hi`` give every program its output offset);
- mode B: ``clo <= cap``: the ``clo`` scores ``>= lo`` are compacted (in index order) and the
  finishing program finds ``T`` among them in registers.

Launches of one call (``select.launch``): ``R`` counting rounds over ``S`` programs per row
(``_count_kernel``: round 0 counts guessed thresholds, later rounds refine by log-count
interpolation), ``_collect_kernel`` (mode A rows write their output directly, mode B rows compact
their candidates), ``_finish_kernel`` (one program per row: mode B rows rank their candidates;
a row still unresolved after the rounds, or every row when ``S = 1``, is finished there by the
same rounds looping over the whole row; pads, the published state, and the workspace is zeroed).
No program ever waits on another; no histogram and no sort: the output lists the selected
elements in ascending index order.
"""

from __future__ import annotations

import triton
import triton.language as tl

from flashrt_kernels.triton_helpers import to_f32

G: tl.constexpr = tl.constexpr(8)  # thresholds counted per round
KEY_MIN: tl.constexpr = tl.constexpr(-(2**31))  # below every key: count(>= KEY_MIN) = length
KEY_END: tl.constexpr = tl.constexpr(2**31)  # above every key: count 0 (int64 only)
FINITE_LO: tl.constexpr = tl.constexpr(-2139095040)  # order key of -FLT_MAX
FINITE_HI: tl.constexpr = tl.constexpr(2139095039)  # order key of +FLT_MAX


@triton.jit
def _order_key(x):
    """fp32 -> int32 order-preserving key; NaN is the maximum, -0.0 equals +0.0."""
    bits = x.to(tl.int32, bitcast=True)
    key = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    key = tl.where(key == -1, 0, key)
    return tl.where(x != x, 0x7FFFFFFF, key)


@triton.jit
def _key_value(key):
    """int32 order key of a finite value -> that fp32 value."""
    bits = tl.where(key < 0, key ^ 0x7FFFFFFF, key)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _load_keys(row_ptr, idx, m):
    return _order_key(to_f32(tl.load(row_ptr + idx, mask=m, other=0.0)))


@triton.jit
def _row_setup(LEN, b, n, k, HAS_LEN: tl.constexpr):
    length = n + b * 0  # a tensor even where n is specialized to a constant
    if HAS_LEN:
        length = tl.minimum(tl.maximum(tl.load(LEN + b), 0), n)
    return length, tl.minimum(length, k)


@triton.jit
def _clamp_key(th, lo, hi):
    """int64 keys clamped strictly inside ``(lo, hi)`` and into int32."""
    th = tl.minimum(tl.maximum(th, lo + 1), hi - 1)
    return tl.minimum(tl.maximum(th, KEY_MIN + 1), 2**31 - 1).to(tl.int32)


@triton.jit
def _curve(ka, ca, kb, cb, tgt):
    """Keys where the count, log-linear in value through (ka, ca) and (kb, cb) (ka < kb,
    ca > cb > 0), equals ``tgt`` (a vector): interpolation, or extrapolation up to 4x the span."""
    la = tl.log(tl.maximum(ca, 1.0))
    lb = tl.log(tl.maximum(cb, 0.5))
    frac = (la - tl.log(tl.maximum(tgt, 0.5))) / tl.maximum(la - lb, 1e-6)
    frac = tl.minimum(tl.maximum(frac, -4.0), 5.0)
    va = _key_value(tl.minimum(tl.maximum(ka, FINITE_LO), FINITE_HI).to(tl.int32))
    vb = _key_value(tl.minimum(tl.maximum(kb, FINITE_LO), FINITE_HI).to(tl.int32))
    return _order_key(va + frac * (vb - va)).to(tl.int64)


@triton.jit
def _refine(lo, clo, hi, chi, tgt):
    """Eight thresholds inside the exact bracket ``(lo, hi)`` (counts ``clo``, ``chi`` as fp32):
    ``lo + 1`` and ``hi - 1`` (a tie class at either end resolves at once), the key midpoint
    (bisection bounds the worst case), and five points where the count interpolated log-linearly
    between the ends is ``tgt`` x 0.75 .. 2.6 -- or, with one end unbounded, five points at
    geometrically growing key distances (4 .. 2^22) from the other end (bracket expansion)."""
    g = tl.arange(0, G)
    f = tl.where(g == 1, 0.75, tl.where(g == 2, 1.0, tl.where(g == 3, 1.3,
                 tl.where(g == 4, 1.8, 2.6))))  # fmt: skip
    interp = _curve(lo, clo, hi, chi, tgt * f)
    step = (1 << tl.maximum(4 * g - 2, 0)).to(tl.int64)  # 4, 64, .., 2^18; 2^22 in slot 6
    mid = tl.where(g == 6, (lo + hi) // 2, interp)
    interp = tl.where(hi >= KEY_END, lo + step, tl.where(lo <= KEY_MIN, hi - step, mid))
    th = tl.where(g == 0, lo + 1, tl.where(g == 7, hi - 1, interp))
    return _clamp_key(th, lo, hi)


@triton.jit
def _narrow(lo, clo, hi, chi, th, c, tgt):
    """The bracket after counting thresholds ``th`` (counts ``c``) against the target ``tgt``."""
    th = th.to(tl.int64)
    ge = c >= tgt
    lo2 = tl.maximum(lo, tl.max(tl.where(ge, th, lo), axis=0))
    clo2 = tl.minimum(clo, tl.min(tl.where(ge, c, clo), axis=0))
    hi2 = tl.minimum(hi, tl.min(tl.where(ge, hi, th), axis=0))
    chi2 = tl.maximum(chi, tl.max(tl.where(ge, chi, c), axis=0))
    return lo2, clo2, hi2, chi2


@triton.jit
def _sample_thresholds(row_ptr, length, kk, NS: tl.constexpr, STEPS: tl.constexpr):
    """Eight thresholds for a row with no hint: estimates of the keys whose counts are ``kk`` x
    (0.25, 0.5, 1, 1.4, 4, 0.7, 1.2, 2) -- eight searches at once (interpolation, kept inside
    the middle 80% of each bracket) over ``NS`` strided samples whose counts are scaled by
    length / NS. A count below one sample is extrapolated above the sample maximum (the count
    assumed to halve every 2^19 keys, about 6% in value)."""
    j = tl.arange(0, NS)
    pos = (j.to(tl.int64) * length) // NS
    m = pos < length
    keys = _load_keys(row_ptr, pos, m)
    smin = tl.min(tl.where(m, keys, 2**31 - 1), axis=0).to(tl.int64)
    smax = tl.max(tl.where(m, keys, KEY_MIN), axis=0).to(tl.int64)
    scale = length.to(tl.float32) / NS
    g = tl.arange(0, G)
    f = tl.where(
        g == 0,
        0.25,
        tl.where(
            g == 1,
            0.5,
            tl.where(
                g == 2,
                1.0,
                tl.where(
                    g == 3,
                    1.4,
                    tl.where(g == 4, 4.0, tl.where(g == 5, 0.7, tl.where(g == 6, 1.2, 2.0))),
                ),
            ),
        ),
    )
    tgt = kk.to(tl.float32) * f / scale  # in samples
    lo = smin + g * 0
    hi = smax + 1 + g * 0
    clo = tl.sum(m.to(tl.float32), axis=0) + f * 0.0
    chi = f * 0.0
    for _ in tl.static_range(STEPS):
        la = tl.log(tl.maximum(clo, 1.0))
        lb = tl.log(tl.maximum(chi, 0.5))
        frac = (la - tl.log(tl.maximum(tgt, 0.5))) / tl.maximum(la - lb, 1e-6)
        frac = tl.minimum(tl.maximum(frac, 0.1), 0.9)
        va = _key_value(tl.minimum(tl.maximum(lo, FINITE_LO), FINITE_HI).to(tl.int32))
        vb = _key_value(tl.minimum(tl.maximum(hi, FINITE_LO), FINITE_HI).to(tl.int32))
        th = _order_key(va + frac * (vb - va)).to(tl.int64)
        th = tl.minimum(tl.maximum(th, lo + 1), hi - 1)
        c = tl.sum(((keys[:, None] >= th[None, :]) & m[:, None]).to(tl.float32), axis=0)
        ge = (c >= tgt) & (hi > lo + 1)
        lt = (c < tgt) & (hi > lo + 1)
        lo = tl.where(ge, th, lo)
        clo = tl.where(ge, c, clo)
        hi = tl.where(lt, th, hi)
        chi = tl.where(lt, c, chi)
    beyond = smax + (524288.0 * tl.log2(1.0 / tl.maximum(tgt, 1e-6))).to(tl.int64)
    th = tl.where(tgt < 1.0, beyond, lo)
    return tl.minimum(tl.maximum(th, KEY_MIN + 1), 2**31 - 1).to(tl.int32)


@triton.jit
def _first_thresholds(row_ptr, HINT, STATE, b, length, kk, k, HINTED: tl.constexpr,
                      HAS_STATE: tl.constexpr, KP: tl.constexpr, STATE_WORDS: tl.constexpr,
                      NS: tl.constexpr):  # fmt: skip
    """Round 0. Without a hint: the sample's thresholds. With one: the smallest current key at
    the hinted positions (entries outside ``[0, length)`` ignored), which admits at least k keys
    when the hint holds k distinct live positions; the published K-th key when the state is
    valid (else that guess less 2^17, about 1.6% lower in value); and six ranks (31, 29, 27,
    25, 23, 20 from the top) of the current keys at 32 positions spread evenly over the hint.
    A hint from a drifted step admits several times k keys at the guess; the sample's ranks
    bracket the K-th key closer (the CUDA select counts the same ladder)."""
    if HINTED:
        slots = tl.arange(0, KP)
        h = tl.load(HINT + b * k + slots, mask=slots < k, other=-1)
        ok = (h >= 0) & (h < length)
        keys = _load_keys(row_ptr, tl.where(ok, h, 0), ok)
        gmin = tl.min(tl.where(ok, keys, 2**31 - 1), axis=0).to(tl.int64)
        kth = gmin - (1 << 17)
        if HAS_STATE:
            valid = tl.load(STATE + b * STATE_WORDS + 0) == 1
            kth = tl.where(valid, tl.load(STATE + b * STATE_WORDS + 1).to(tl.int64), kth)
        j = tl.arange(0, 32)
        hs = tl.load(HINT + b * k + (j * k) // 32)
        oks = (hs >= 0) & (hs < length)
        sample = tl.where(oks, _load_keys(row_ptr, tl.where(oks, hs, 0), oks), KEY_MIN + 1)
        ranked = tl.sort(sample, descending=True)
        g = tl.arange(0, G)
        rank = tl.where(g == 2, 31, tl.where(g == 3, 29, tl.where(g == 4, 27, tl.where(
            g == 5, 25, tl.where(g == 6, 23, 20)))))  # fmt: skip
        at = tl.max(tl.where(j[None, :] == rank[:, None], ranked[None, :], KEY_MIN), axis=1)
        th = tl.where(g == 0, gmin, tl.where(g == 1, kth, at.to(tl.int64)))
        th = tl.minimum(tl.maximum(th, KEY_MIN + 1), 2**31 - 1).to(tl.int32)
    else:
        th = _sample_thresholds(row_ptr, length, kk, NS, 5)
    return th


@triton.jit
def _bracket(TH, TC, b, length, kk, NR: tl.constexpr, RMAX: tl.constexpr,
             FIRST_PC: tl.constexpr):  # fmt: skip
    """The row's bracket from rounds ``[0, NR)`` and the flat slots (round * G + g) where ``lo``
    and ``hi`` were counted per program (rounds >= FIRST_PC; -1 when not)."""
    r = tl.arange(0, RMAX)[:, None]
    g = tl.arange(0, G)[None, :]
    live = (r + g * 0) < NR
    at = (b * RMAX + r) * G + g
    th = tl.load(TH + at, mask=live, other=0).to(tl.int64)
    tc = tl.load(TC + at, mask=live, other=0).to(tl.int64)
    ge = live & (tc >= kk)
    lt = live & (tc < kk)
    lo = tl.max(tl.max(tl.where(ge, th, KEY_MIN), axis=1), axis=0)
    clo = tl.min(tl.min(tl.where(ge, tc, length.to(tl.int64)), axis=1), axis=0)
    hi = tl.min(tl.min(tl.where(lt, th, KEY_END), axis=1), axis=0)
    chi = tl.max(tl.max(tl.where(lt, tc, 0), axis=1), axis=0)
    flat = r * G + g
    pc_ok = live & (r >= FIRST_PC)
    f_lo = tl.min(tl.min(tl.where(pc_ok & (th == lo), flat, 1 << 20), axis=1), axis=0)
    f_hi = tl.min(tl.min(tl.where(pc_ok & (th == hi), flat, 1 << 20), axis=1), axis=0)
    f_lo = tl.where(f_lo < (1 << 20), f_lo, -1)
    f_hi = tl.where(f_hi < (1 << 20), f_hi, -1)
    return lo, clo, hi, chi, f_lo, f_hi


@triton.jit
def _modes(lo, clo, hi, f_lo, f_hi, cap):
    mode_a = (hi == lo + 1) & (f_lo >= 0) & (f_hi >= 0)
    mode_b = (clo <= cap) & (~mode_a)
    return mode_a, mode_b


@triton.jit
def _count_kernel(
    SC, stride_s, LEN, HINT, STATE, TH, TC, PC,
    n, k, chunk, n_split, cap,
    ROUND: tl.constexpr, HAS_LEN: tl.constexpr, HINTED: tl.constexpr, HAS_STATE: tl.constexpr,
    RMAX: tl.constexpr, FIRST_PC: tl.constexpr, KP: tl.constexpr, STATE_WORDS: tl.constexpr,
    NS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Counting round ``ROUND``: every program counts its chunk at the row's eight thresholds
    (per-program counts into PC, totals into TC by atomics). A row already resolved writes
    its bracket's ``lo`` (with its exact count) as this round's thresholds instead."""
    b = tl.program_id(0)
    s = tl.program_id(1)
    row_ptr = SC + b.to(tl.int64) * stride_s
    length, kk = _row_setup(LEN, b, n, k, HAS_LEN)
    g = tl.arange(0, G)
    if ROUND == 0:
        lo = length.to(tl.int64) * 0 + KEY_MIN
        clo = length.to(tl.int64)
        active = clo > cap
        th = _first_thresholds(row_ptr, HINT, STATE, b, length, kk, k, HINTED, HAS_STATE, KP,
                               STATE_WORDS, NS)  # fmt: skip
    else:
        lo, clo, hi, chi, f_lo, f_hi = _bracket(TH, TC, b, length, kk, ROUND, RMAX, FIRST_PC)
        mode_a, mode_b = _modes(lo, clo, hi, f_lo, f_hi, cap)
        active = ~(mode_a | mode_b)
        th = _refine(lo, clo.to(tl.float32), hi, chi.to(tl.float32), kk.to(tl.float32))
    slot = (b * RMAX + ROUND) * G + g
    if active:
        start = s * chunk
        end = tl.minimum(start + chunk, length)
        acc = tl.zeros([BLOCK, G], dtype=tl.int32)
        lanes = tl.arange(0, BLOCK)
        for off in range(start, end, BLOCK):
            idx = off + lanes
            m = idx < end
            key = _load_keys(row_ptr, idx, m)
            acc += ((key[:, None] >= th[None, :]) & m[:, None]).to(tl.int32)
        pc = tl.sum(acc, axis=0)
        tl.store(PC + ((b * RMAX + ROUND) * n_split + s) * G + g, pc)
        tl.atomic_add(TC + slot, pc)
        tl.store(TH + slot, th, mask=g < tl.where(s == 0, G, 0))
    else:
        tl.store(TH + slot, lo.to(tl.int32) + g * 0, mask=g < tl.where(s == 0, G, 0))
        tl.store(TC + slot, clo.to(tl.int32) + g * 0, mask=g < tl.where(s == 0, G, 0))


@triton.jit
def _block_live(BM, b, stride_bm, off, end, thr, HAS_BMAX: tl.constexpr, BLOCK: tl.constexpr):
    """Lanes of ``[off, off + BLOCK)`` below ``end``; none when block maxima prove that no score
    of the block reaches key ``thr``."""
    lanes = off + tl.arange(0, BLOCK)
    live = lanes < end
    if HAS_BMAX:
        sub = off // 32 + tl.arange(0, BLOCK // 32)
        mx = tl.load(BM + b.to(tl.int64) * stride_bm + sub, mask=sub * 32 < end,
                     other=float("-inf"))  # fmt: skip
        top = tl.max(tl.where(sub * 32 < end, _order_key(mx), KEY_MIN), axis=0)
        live = live & ((lanes * 0 + (top >= thr).to(tl.int32)) != 0)
    return live


@triton.jit
def _emit_block(key, idx, m, t, krem, run, tie_run, OV, OI, bits_ptr, b, k):
    """Writes the lanes ``m`` of one block that are selected -- key > T, or key == T among the
    first ``krem`` ties of the row -- at output positions ``run`` + their rank in the block (index
    order); returns the advanced (run, tie_run)."""
    eqm = m & (key == t)
    rank = tie_run + tl.cumsum(eqm.to(tl.int32), axis=0) - 1
    sel = (m & (key > t)) | (eqm & (rank < krem))
    pos = run + tl.cumsum(sel.to(tl.int32), axis=0) - 1
    tl.store(OV + b * k + pos, tl.load(bits_ptr + idx, mask=sel), mask=sel)
    tl.store(OI + b * k + pos, idx, mask=sel)
    return run + tl.sum(sel.to(tl.int32), axis=0), tie_run + tl.sum(eqm.to(tl.int32), axis=0)


@triton.jit
def _collect_kernel(
    SC, stride_s, LEN, TH, TC, PC, NSEG, SEG, OV, OI, SCB, BM, stride_bm,
    n, k, chunk, n_split, cap, segcap,
    NR: tl.constexpr, HAS_LEN: tl.constexpr, RMAX: tl.constexpr, FIRST_PC: tl.constexpr,
    SP: tl.constexpr, HAS_BMAX: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Mode A rows: each program writes its chunk's share of the output (scores > T, then the
    lowest-index ties at T) at its exact offset. Mode B rows: each program compacts its
    chunk's scores >= lo, in index order, into its own segment."""
    b = tl.program_id(0)
    s = tl.program_id(1)
    row_ptr = SC + b.to(tl.int64) * stride_s
    bits_ptr = SCB + b.to(tl.int64) * stride_s
    length, kk = _row_setup(LEN, b, n, k, HAS_LEN)
    lo, clo, hi, chi, f_lo, f_hi = _bracket(TH, TC, b, length, kk, NR, RMAX, FIRST_PC)
    mode_a, mode_b = _modes(lo, clo, hi, f_lo, f_hi, cap)
    start = s * chunk
    end = tl.minimum(start + chunk, length)
    lanes = tl.arange(0, BLOCK)
    if mode_a:
        t = lo.to(tl.int32)
        krem = kk - chi.to(tl.int32)
        sp = tl.arange(0, SP)
        ms = sp < n_split
        r_lo = f_lo // G
        r_hi = f_hi // G
        c_lo = tl.load(PC + ((b * RMAX + r_lo) * n_split + sp) * G + f_lo % G, mask=ms, other=0)
        c_hi = tl.load(PC + ((b * RMAX + r_hi) * n_split + sp) * G + f_hi % G, mask=ms, other=0)
        eq = c_lo - c_hi
        ties_before = tl.cumsum(eq, axis=0) - eq
        take = tl.minimum(tl.maximum(krem - ties_before, 0), eq)
        before = sp < s
        out_run = tl.sum(tl.where(before, c_hi + take, 0), axis=0)
        tie_run = tl.sum(tl.where(before, eq, 0), axis=0)
        for off in range(start, end, BLOCK):
            idx = off + lanes
            m = _block_live(BM, b, stride_bm, off, end, t, HAS_BMAX, BLOCK)
            key = _load_keys(row_ptr, idx, m)
            out_run, tie_run = _emit_block(key, idx, m, t, krem, out_run, tie_run, OV, OI,
                                           bits_ptr, b, k)  # fmt: skip
    if mode_b:
        seg = SEG + (b * n_split + s).to(tl.int64) * segcap
        thr = lo.to(tl.int32)
        run = kk * 0
        for off in range(start, end, BLOCK):
            idx = off + lanes
            m = _block_live(BM, b, stride_bm, off, end, thr, HAS_BMAX, BLOCK)
            take = m & (_load_keys(row_ptr, idx, m) >= thr)
            pos = run + tl.cumsum(take.to(tl.int32), axis=0) - 1
            tl.store(seg + pos, idx, mask=take)
            run += tl.sum(take.to(tl.int32), axis=0)
        tl.store(NSEG + b * n_split + s, run)


@triton.jit
def _count_row(row_ptr, length, th, BLOCK: tl.constexpr):
    """Exact counts of the row's valid keys at thresholds ``th`` (int64), one program."""
    acc = tl.zeros([BLOCK, G], dtype=tl.int32)
    lanes = tl.arange(0, BLOCK)
    for off in range(0, length, BLOCK):
        idx = off + lanes
        m = idx < length
        key = _load_keys(row_ptr, idx, m)
        acc += ((key[:, None] >= th[None, :]) & m[:, None]).to(tl.int32)
    return tl.sum(acc, axis=0).to(tl.int64)


@triton.jit
def _finish_kernel(
    SC, stride_s, LEN, HINT, TH, TC, PC, NSEG, PFX, SEG, CK, CI, STATE, OV, OI, SCB,
    n, k, n_split, cap, segcap,
    NR: tl.constexpr, HAS_LEN: tl.constexpr, HINTED: tl.constexpr, HAS_STATE: tl.constexpr,
    RMAX: tl.constexpr, FIRST_PC: tl.constexpr, SP: tl.constexpr, LOG_SP: tl.constexpr,
    KP: tl.constexpr, KO: tl.constexpr, STATE_WORDS: tl.constexpr,
    NS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    row_ptr = SC + b.to(tl.int64) * stride_s
    bits_ptr = SCB + b.to(tl.int64) * stride_s
    length, kk = _row_setup(LEN, b, n, k, HAS_LEN)
    kk64 = kk.to(tl.int64)
    g = tl.arange(0, G)
    lo, clo, hi, chi, f_lo, f_hi = _bracket(TH, TC, b, length, kk, NR, RMAX, FIRST_PC)
    mode_a, mode_b = _modes(lo, clo, hi, f_lo, f_hi, cap)
    if NR == 0:  # no collecting pass ran: every row is finished here
        mode_a = kk < 0
        mode_b = kk < 0
    # rounds this row was counted in (a round is skipped once the row is resolved)
    rounds = kk * 0
    for r in tl.static_range(NR):
        if r >= FIRST_PC:
            if r == 0:
                rounds += (length > cap).to(tl.int32)
            else:
                l_, c_, h_, _x, fl_, fh_ = _bracket(TH, TC, b, length, kk, r, RMAX, FIRST_PC)
                a_, b_ = _modes(l_, c_, h_, fl_, fh_, cap)
                rounds += (~(a_ | b_)).to(tl.int32)
    tried_th = tl.load(TH + (b * RMAX) * G + g, mask=g < (G if NR > 0 else 0), other=0)
    tried_c = tl.load(TC + (b * RMAX) * G + g, mask=g < (G if NR > 0 else 0), other=0)
    n_tried = tl.where((NR > 0) & ((FIRST_PC > 0) | (length > cap)), 8, 0)
    loop_a = kk < 0
    if ~(mode_a | mode_b):
        # not resolved by the rounds (or S = 1): the same rounds over the whole row, here
        first = (kk * 0 + NR) == 0
        tgt = kk.to(tl.float32)
        while ~((hi == lo + 1) | (clo <= cap)):
            if first:
                th = _first_thresholds(row_ptr, HINT, STATE, b, length, kk, k, HINTED,
                                       HAS_STATE, KP, STATE_WORDS, NS)  # fmt: skip
            else:
                th = _refine(lo, clo.to(tl.float32), hi, chi.to(tl.float32), tgt)
            c = _count_row(row_ptr, length, th, BLOCK)
            if first:
                tried_th = th
                tried_c = c.to(tl.int32)
                n_tried = n_tried * 0 + 8
            lo, clo, hi, chi = _narrow(lo, clo, hi, chi, th, c, kk64)
            rounds += 1
            first = kk < 0
        loop_a = hi == lo + 1
        lanes = tl.arange(0, BLOCK)
        run = kk * 0
        if loop_a:  # T = lo: keep > T and the lowest-index ties, in index order
            t = lo.to(tl.int32)
            krem = kk - chi.to(tl.int32)
            tie_run = kk * 0
            for off in range(0, length, BLOCK):
                idx = off + lanes
                m = idx < length
                key = _load_keys(row_ptr, idx, m)
                run, tie_run = _emit_block(key, idx, m, t, krem, run, tie_run, OV, OI, bits_ptr,
                                           b, k)  # fmt: skip
        else:  # compact the scores >= lo into this row's first segment(s), then rank below
            seg = SEG + (b * n_split).to(tl.int64) * segcap
            thr = lo.to(tl.int32)
            for off in range(0, length, BLOCK):
                idx = off + lanes
                m = idx < length
                take = m & (_load_keys(row_ptr, idx, m) >= thr)
                pos = run + tl.cumsum(take.to(tl.int32), axis=0) - 1
                tl.store(seg + pos, idx, mask=take)
                run += tl.sum(take.to(tl.int32), axis=0)
            sp = tl.arange(0, SP)
            tl.store(NSEG + b * n_split + sp, tl.where(sp == 0, run, 0), mask=sp < n_split)
            tl.debug_barrier()
    t_key = lo.to(tl.int32)
    if (mode_b | (~(mode_a | loop_a))) & (kk > 0):
        # rank the compacted candidates: gather them in index order into CK / CI (a binary
        # search over the segments' prefix), narrow the bracket over them until T is exact,
        # then keep those > T and the first ties at T -- block by block, so registers stay small
        sp = tl.arange(0, SP)
        ns = tl.load(NSEG + b * n_split + sp, mask=sp < n_split, other=0)
        pfx = tl.cumsum(ns, axis=0) - ns
        tl.store(PFX + b * SP + sp, pfx, mask=sp < n_split)
        n_cand = tl.sum(ns, axis=0)
        tl.debug_barrier()
        lanes = tl.arange(0, BLOCK)
        base = SEG + (b * n_split).to(tl.int64) * segcap
        cbase = b.to(tl.int64) * cap
        for off in range(0, n_cand, BLOCK):
            j = off + lanes
            live = j < n_cand
            at = j * 0
            for i in tl.static_range(LOG_SP):
                probe = at + (1 << (LOG_SP - 1 - i))
                okp = live & (probe < n_split)
                v = tl.load(PFX + b * SP + probe, mask=okp, other=2**31 - 1)
                at = tl.where(okp & (v <= j), probe, at)
            first_slot = tl.load(PFX + b * SP + at, mask=live, other=0)
            cidx = tl.load(base + at.to(tl.int64) * segcap + (j - first_slot), mask=live, other=0)
            tl.store(CK + cbase + j, _load_keys(row_ptr, cidx, live), mask=live)
            tl.store(CI + cbase + j, cidx, mask=live)
        tl.debug_barrier()
        clo_c = clo
        lo_c = lo
        while hi > lo_c + 1:
            th = _refine(lo_c, clo_c.to(tl.float32), hi, chi.to(tl.float32), kk.to(tl.float32))
            acc = tl.zeros([BLOCK, G], dtype=tl.int32)
            for off in range(0, n_cand, BLOCK):
                j = off + lanes
                live = j < n_cand
                ck = tl.load(CK + cbase + j, mask=live, other=0)
                acc += ((ck[:, None] >= th[None, :]) & live[:, None]).to(tl.int32)
            c = tl.sum(acc, axis=0).to(tl.int64)
            lo_c, clo_c, hi, chi = _narrow(lo_c, clo_c, hi, chi, th, c, kk64)
        t_key = lo_c.to(tl.int32)
        krem = kk - chi.to(tl.int32)
        run = kk * 0
        tie_run = kk * 0
        for off in range(0, n_cand, BLOCK):
            j = off + lanes
            live = j < n_cand
            ck = tl.load(CK + cbase + j, mask=live, other=0)
            ci = tl.load(CI + cbase + j, mask=live, other=0)
            run, tie_run = _emit_block(ck, ci, live, t_key, krem, run, tie_run, OV, OI, bits_ptr,
                                       b, k)  # fmt: skip
    # pads past kk
    slots = tl.arange(0, KO)
    pad = (
        tl.full([KO], float("-inf"), tl.float32)
        .to(row_ptr.dtype.element_ty)
        .to(bits_ptr.dtype.element_ty, bitcast=True)
    )
    pm = (slots >= kk) & (slots < k)
    tl.store(OV + b * k + slots, pad, mask=pm)
    tl.store(OI + b * k + slots, slots * 0 - 1, mask=pm)
    if HAS_STATE:
        w = tl.arange(0, 32)  # STATE_WORDS <= 32
        row = tl.zeros([32], dtype=tl.int32)
        has = kk > 0
        row = tl.where(w == 0, has.to(tl.int32), row)
        row = tl.where(w == 1, tl.where(has, t_key, 0), row)
        row = tl.where(w == 2, tl.where(has, lo.to(tl.int32), 0), row)
        row = tl.where(w == 3, tl.where(has, clo.to(tl.int32), 0), row)
        row = tl.where(w == 4, n_tried, row)
        row = tl.where(w == 5, rounds, row)
        row = tl.where(w == 6, length, row)
        row = tl.where(w == 7, k, row)
        half = (STATE_WORDS - 8) // 2
        for i in tl.static_range(8):
            row = tl.where(w == 8 + i, tl.sum(tl.where(g == i, tried_th, 0), axis=0), row)
            row = tl.where(w == 8 + half + i, tl.sum(tl.where(g == i, tried_c, 0), axis=0), row)
        tl.store(STATE + b * STATE_WORDS + w, row, mask=w < STATE_WORDS)
    # the counting totals of this row go back to zero for the next call
    r2 = tl.arange(0, RMAX)[:, None]
    tl.store(TC + (b * RMAX + r2) * G + g[None, :], tl.zeros([RMAX, G], dtype=tl.int32))
