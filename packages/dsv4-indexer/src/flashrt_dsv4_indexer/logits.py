"""Indexer logits over a paged, quantized key cache, with optional hint emissions, in Triton.

``I[t, j] = sum_h w[t, h] * ReLU(q[t, h] . k[j])`` for decode rows ``t = b * next_n + i``
(``next_n`` 1..4: the tokens of a multi-token-prediction step share the row's keys, each with its
own valid length, see ``reference.row_lengths``), over the keys of batch row ``b`` reached through
``block_table[b]``. One program walks ``TILES`` tiles of ``KEYS`` consecutive positions of one
batch row (a tile may span pages: each key's page comes from the block table) for all its ``next_n``
tokens: the row's queries are loaded once per program as the [D, next_n * H] operand of a
[KEYS, D] x [D, next_n * H] tensor-core dot per tile, so each key is read once and the head sum runs
along the dot's N dimension; the tiles' key loads are software-pipelined (``STAGES``: cp.async into
shared memory, two tiles in flight while one is scored).

Arithmetic: fp8 keys: ``tl.dot`` on e4m3 query and key codes (tensor cores), fp32 accumulation,
ReLU, head weights, a sum over heads in fp32, times the key's scale. MXFP4 keys of head dim 128
(the models') are decoded in registers to e4m3 with their four UE8M0 scales folded into the codes'
exponents up to one power of two a key (``quant.fp4_tiles.mxfp4_e4m3_decode``: exact), and take
the fp8 keys' e4m3 dot against the query codes (loaded in the tile's K order) and the key's factor
as its scale; a tile holding a key whose scales do not fold (spanning more than 11 binades, or all
under 2**-120: ``fp4_tiles.fold_factor``) is decoded to bf16 instead (exact, ``fp4_tiles.
dequant_tile``) against the bf16 image of the query codes. Other head dims always take the bf16
tile. Under the CPU interpreter all run as fp32 dots of the same decoded values (its
low-precision dots are unusable).

Contract (``faithful``): with ``M`` = ``reference.logits_magnitude`` (sum over heads of |w| times
sum over d of |q k|), ``|I - I_ref| <= RTOL[fmt] * M[t, j]`` where ``I_ref`` is the float64
reference over the same codes: ``2**-8`` for both formats (Hopper's fp8 MMA accumulates with a
reduced mantissa; the bf16 tiles' fp32 accumulation is tighter). Positions at or
past a row's length hold ``-inf`` when ``fill_padding`` (else they are not written). Emissions
(each a switch, each ``exact`` with respect to the logits written): per-32-position block maxima
over valid positions (``-inf`` for an empty block); counts of valid logits >= each of three lines
(``lines[t]`` tightest first); a candidate list of the valid logits >= the loosest line in three
segments (segment 0: >= line 0, segment s: in [line s, line s-1)), each of capacity ``seg_cap``,
with the claimed count per segment (a claim over ``seg_cap`` means the segment is void). Padding is
never counted nor listed. The list's order inside a segment is unspecified; its set is exact.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from flashrt_dsv4_indexer import reference
from flashrt_kernels.backends import maxnreg_kwargs, resolve_backend, triton_interpreter_active
from flashrt_kernels.checks import check_choice, check_int, check_out, check_tensor
from flashrt_kernels.quant.fp4_tiles import (
    dequant_tile,
    e4m3_value,
    fold_factor,
    mxfp4_e4m3_decode,
    mxfp4_e4m3_load,
    to_e4m3_tile_order,
    to_tile_order,
)

OP = "paged_indexer_logits"
IMPLEMENTED = ("triton", "reference")
RTOL = {"fp8": 2.0**-8, "fp4": 2.0**-8}
MAX_NEXT_N = 4


@triton.jit
def _load_blocks(BT_ROW, j, max_len, PAGE: tl.constexpr):
    """Cache block of each position ``j`` (block 0 past the row's end: those table entries may
    hold anything and are never used)."""
    return tl.load(BT_ROW + j // PAGE, mask=j < max_len, other=0).to(tl.int64)


@triton.jit
def _load_fp8_tile(KC, KS, slot, live, D: tl.constexpr, DOT_F32: tl.constexpr):
    """e4m3 codes [KEYS, D] (uint8 under the interpreter) and fp32 scales [KEYS] of the keys in
    cache slots ``slot`` (nothing read where not ``live``)."""
    d = tl.arange(0, D)
    if DOT_F32:
        codes = tl.load(KC + slot[:, None] * D + d[None, :], mask=live[:, None], other=0)
    else:  # e4m3 straight from memory: no conversion between the load and the dot
        kc = KC.to(tl.pointer_type(tl.float8e4nv), bitcast=True)
        codes = tl.load(kc + slot[:, None] * D + d[None, :], mask=live[:, None])
    return codes, tl.load(KS + slot, mask=live, other=0.0)


@triton.jit
def _bf16_tile(KC, KS, slot, live, D: tl.constexpr, DOT_F32: tl.constexpr):
    """MXFP4 keys in cache slots ``slot`` decoded to bf16 (fp32 under the interpreter), in
    ``fp4_tiles.tile_order``."""
    return dequant_tile(KC, KS, slot, live, 0, D // 2, D // 32, D, 32, True, DOT_F32)


@triton.jit
def _dot(a, b, DOT_F32: tl.constexpr):
    """A tile's tensor-core dot; under the interpreter an fp32 dot of the decoded values."""
    if DOT_F32:
        s = tl.dot(a, b, input_precision="ieee")
    else:
        s = tl.dot(a, b)
    return s


@triton.jit
def _paged_indexer_logits_kernel(
    Q, W, KC, KS, BT, LENS, OUT, BMAX, LINES, CNT, LVAL, LIDX, CLAIM,
    bt_stride, out_stride, bmax_stride, seg_cap, width, n_tiles,
    NEXT_N: tl.constexpr, NQ: tl.constexpr, H: tl.constexpr, D: tl.constexpr,
    PAGE: tl.constexpr, KEYS: tl.constexpr, TILES: tl.constexpr, STAGES: tl.constexpr,
    FP4: tl.constexpr, FOLD: tl.constexpr, DOT_F32: tl.constexpr, FILL_PAD: tl.constexpr,
    EMIT_MAX: tl.constexpr, EMIT_COUNTS: tl.constexpr, EMIT_LIST: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0).to(tl.int64)
    t0 = tl.program_id(1) * TILES
    qi = tl.arange(0, NQ)
    q_ok = qi < NEXT_N
    rows = b * NEXT_N + qi
    lens = tl.load(LENS + rows, mask=q_ok, other=0)
    max_len = tl.max(lens, 0)

    # the row's queries once per program, as the [D, NQ * H] operand of every tile's dot
    m = tl.arange(0, NQ * H)
    mq = m // H
    qrow = b * NEXT_N + mq
    q_at = Q + (qrow * H + m % H)[:, None] * D
    m_ok = (mq < NEXT_N)[:, None]
    qc = tl.load(q_at + tl.arange(0, D)[None, :], mask=m_ok, other=0)
    if FOLD:  # the K order of the decoded key tiles, permuted in registers
        qc = to_e4m3_tile_order(qc)
    elif FP4:
        qc = to_tile_order(qc)
    w = tl.load(W + qrow * H + m % H, mask=mq < NEXT_N, other=0.0)
    if DOT_F32:
        qt = tl.trans(e4m3_value(qc))
    elif FP4 and not FOLD:
        qt = tl.trans(e4m3_value(qc).to(tl.bfloat16))
    else:
        qt = tl.trans(qc.to(tl.float8e4nv, bitcast=True))

    kj = tl.arange(0, KEYS)
    c4 = tl.arange(0, 4)
    t_end = tl.minimum(t0 + TILES, n_tiles)
    t_live = tl.maximum(t0, tl.minimum(t_end, tl.cdiv(max_len, KEYS)))
    cnt = tl.zeros((NQ, 4), tl.int32)  # counts at the three lines, summed over the tiles
    for t in tl.range(t0, t_live, num_stages=STAGES):  # key loads pipelined (cp.async)
        j = t * KEYS + kj
        slot = _load_blocks(BT + b * bt_stride, j, max_len, PAGE) * PAGE + j % PAGE
        if FOLD:  # MXFP4 keys as e4m3, their scales folded (fp32 under the interpreter)
            kx, ks = mxfp4_e4m3_load(KC, KS, slot, j < max_len, D // 2, D // 32, DOT_F32)
            kt, ksc, bad = fold_factor(ks, j < max_len)
            if tl.max(bad.to(tl.int32), 0) > 0:  # keys that do not fold (rare): the tile in bf16
                qb = tl.load(q_at + tl.arange(0, D)[None, :], mask=m_ok, other=0)
                qb = e4m3_value(to_tile_order(qb))
                qbt = tl.trans(qb) if DOT_F32 else tl.trans(qb.to(tl.bfloat16))
                s = _dot(_bf16_tile(KC, KS, slot, j < max_len, D, DOT_F32), qbt, DOT_F32)
                ksc = tl.full((KEYS,), 1.0, tl.float32)
            else:
                s = _dot(mxfp4_e4m3_decode(kx, kt, DOT_F32), qt, DOT_F32)
        elif FP4:  # MXFP4 keys decoded in registers (bf16, or fp32 under the interpreter)
            s = _dot(_bf16_tile(KC, KS, slot, j < max_len, D, DOT_F32), qt, DOT_F32)
        else:
            kc, ksc = _load_fp8_tile(KC, KS, slot, j < max_len, D, DOT_F32)
            if DOT_F32:
                kc = e4m3_value(kc)
            s = _dot(kc, qt, DOT_F32)
        s = tl.maximum(s, 0.0)  # [KEYS, NQ * H]
        for i in tl.static_range(NEXT_N):
            row = b * NEXT_N + i
            logit = tl.sum(s * tl.where(mq == i, w, 0.0)[None, :], axis=1)
            if FOLD or not FP4:
                logit = logit * ksc
            valid = j < tl.load(LENS + row)
            optr = OUT + row * out_stride + j
            if FILL_PAD:
                tl.store(optr, tl.where(valid, logit, float("-inf")), mask=j < width)
            else:
                tl.store(optr, logit, mask=valid)
            if EMIT_MAX:
                lm = tl.where(valid, logit, float("-inf"))
                bm = tl.max(tl.reshape(lm, (KEYS // 32, 32)), axis=1)
                g = t * (KEYS // 32) + tl.arange(0, KEYS // 32)
                tl.store(BMAX + row * bmax_stride + g, bm, mask=g * 32 < width)
            if EMIT_COUNTS:
                lc = tl.load(LINES + row * 3 + c4, mask=c4 < 3, other=float("inf"))
                ge = valid[:, None] & (logit[:, None] >= lc[None, :])
                cnt += tl.where(qi[:, None] == i, tl.sum(ge.to(tl.int32), axis=0)[None, :], 0)
            if EMIT_LIST:
                for sg in tl.static_range(3):
                    sel = valid & (logit >= tl.load(LINES + row * 3 + sg))
                    if sg > 0:
                        sel = sel & (logit < tl.load(LINES + row * 3 + sg - 1))
                    si = sel.to(tl.int32)
                    n = tl.sum(si, 0)
                    if n > 0:  # most tiles hold no candidate: skip the claim
                        base = tl.atomic_add(CLAIM + row * 3 + sg, n)
                        at = base + tl.cumsum(si, 0) - 1
                        keep = sel & (at < seg_cap)
                        dst = row * (3 * seg_cap) + sg * seg_cap + at
                        tl.store(LVAL + dst, logit, mask=keep)
                        tl.store(LIDX + dst, j.to(tl.int32), mask=keep)
    if EMIT_COUNTS:
        cptr = CNT + rows[:, None] * 3 + c4[None, :]
        tl.atomic_add(cptr, cnt, mask=q_ok[:, None] & (c4 < 3)[None, :] & (cnt > 0))
    if FILL_PAD or EMIT_MAX:
        for t in range(t_live, t_end):  # tiles past every token's length: padding only
            j = t * KEYS + kj
            for i in tl.static_range(NEXT_N):
                row = b * NEXT_N + i
                if FILL_PAD:
                    tl.store(OUT + row * out_stride + j, tl.full((KEYS,), float("-inf"),
                             tl.float32), mask=j < width)  # fmt: skip
                if EMIT_MAX:
                    g = t * (KEYS // 32) + tl.arange(0, KEYS // 32)
                    tl.store(BMAX + row * bmax_stride + g,
                             tl.full((KEYS // 32,), float("-inf"), tl.float32),
                             mask=g * 32 < width)  # fmt: skip


@dataclass
class Emissions:
    """Caller-owned emission buffers (allocate once, reuse: CUDA-graph safe). Any may be None."""

    block_max: torch.Tensor | None = None  # fp32 [rows, width // 32]
    lines: torch.Tensor | None = None  # fp32 [rows, 3], tightest first (input)
    counts: torch.Tensor | None = None  # int32 [rows, 3]
    list_values: torch.Tensor | None = None  # fp32 [rows, 3 * seg_cap]
    list_indices: torch.Tensor | None = None  # int32 [rows, 3 * seg_cap]
    list_claims: torch.Tensor | None = None  # int32 [rows, 3]

    @staticmethod
    def allocate(rows: int, width: int, seg_cap: int, device, *, block_max=True, counts=True,
                 candidate_list=True) -> Emissions:  # fmt: skip
        e = Emissions(lines=torch.full((rows, 3), float("inf"), device=device))
        if block_max:
            e.block_max = torch.empty(rows, width // 32, device=device)
        if counts:
            e.counts = torch.zeros(rows, 3, dtype=torch.int32, device=device)
        if candidate_list:
            e.list_values = torch.empty(rows, 3 * seg_cap, device=device)
            e.list_indices = torch.empty(rows, 3 * seg_cap, dtype=torch.int32, device=device)
            e.list_claims = torch.zeros(rows, 3, dtype=torch.int32, device=device)
        return e

    @property
    def seg_cap(self) -> int:
        return 0 if self.list_values is None else self.list_values.shape[1] // 3

    def void(self) -> torch.Tensor:
        """bool [rows, 3]: the segment overflowed its capacity (its list entries are partial)."""
        return self.list_claims > self.seg_cap


def launch_config(batch: int, width: int, nq: int, h: int, sms: int, key_format: str = "fp8",
                  head_dim: int = 128) -> tuple[int, int, int, int, int | None]:  # fmt: skip
    """(keys per tile, tiles per program, num_warps, pipeline stages, register cap or None) from
    host shape ints only, so graph capture sees fixed choices. A tile is one [KEYS, D] x
    [D, next_n * H] dot (the head sum then runs along the dot's N dimension, inside a warp); a
    program walks up to 16 tiles of one row with their key loads pipelined, keeping at least 4
    programs per SM where the grid allows. fp4 keys decoded to bf16 (head dims other than 128)
    of one token over 64 heads: 2 stages and 128 registers a thread, four programs an SM instead
    of three (the decoding is latency-bound; 1.05-1.13x on an H100, docs/dsv4-indexer.md, run
    10). fp4 keys of head dim 128 decode to e4m3 and take the fp8 keys' choices: 3 stages, no
    cap (221 registers with the bf16 fallback's branch), 1.07-1.20x a 168 cap and 1.02-1.16x 2
    stages at 128 on an H100 (docs/dsv4-indexer.md, run 11)."""
    keys = 128 if nq * h <= 64 else 64
    n_tiles = triton.cdiv(width, keys)
    tiles = 16
    while tiles > 1 and batch * triton.cdiv(n_tiles, tiles) < 4 * sms:
        tiles //= 2
    warps = 4 if nq * h * keys <= 8192 else 8
    if key_format == "fp4" and head_dim != 128 and nq * h == 64:
        return keys, tiles, warps, 2, 128
    return keys, tiles, warps, 3, None


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _validate(q_codes, weights, key_codes, key_scales, key_format, block_table, lengths, out, em):
    check_choice(OP, "key_format", key_format, ("fp8", "fp4"))
    check_tensor(OP, "q_codes", q_codes, dtypes=(torch.uint8,), ndim=3, contiguous=True)
    rows, h, d = q_codes.shape
    dev = q_codes.device
    check_tensor(OP, "block_table", block_table, dtypes=(torch.int32,), ndim=2, device=dev)
    if block_table.stride(1) != 1:
        raise ValueError(f"{OP}: block_table must have unit stride in its last dimension")
    batch = block_table.shape[0]
    if batch == 0 or rows % batch or not 1 <= rows // batch <= MAX_NEXT_N:
        raise ValueError(
            f"{OP}: q_codes rows ({rows}) must be batch ({batch}) times next_n in 1..{MAX_NEXT_N}"
        )
    if h < 1 or h & (h - 1) or d % 32 or d < 32:
        raise ValueError(f"{OP}: heads must be a power of two and head_dim a multiple of 32")
    check_tensor(OP, "weights", weights, dtypes=(torch.float32,), shape=[rows, h], device=dev,
                 contiguous=True)  # fmt: skip
    page = key_codes.shape[1] if key_codes.dim() == 3 else 0
    check_choice(OP, "block size", page, (32, 64, 128))
    dk = d if key_format == "fp8" else d // 2
    check_tensor(OP, "key_codes", key_codes, dtypes=(torch.uint8,), shape=[None, page, dk],
                 device=dev, contiguous=True)  # fmt: skip
    if key_format == "fp8":
        want = dict(dtypes=(torch.float32,), shape=[key_codes.shape[0], page])
    else:
        want = dict(dtypes=(torch.uint8,), shape=[key_codes.shape[0], page, d // 32])
    check_tensor(OP, "key_scales", key_scales, device=dev, contiguous=True, **want)
    check_tensor(OP, "lengths", lengths, dtypes=(torch.int32,), shape=[rows], device=dev,
                 contiguous=True)  # fmt: skip
    width = block_table.shape[1] * page
    if out is not None:
        check_out(OP, "out", out, shape=(rows, width), dtype=torch.float32, device=dev)
    if em is None:
        return
    if em.block_max is not None:
        check_out(OP, "block_max", em.block_max, shape=(rows, width // 32), dtype=torch.float32,
                  device=dev)  # fmt: skip
    if em.counts is not None or em.list_values is not None:
        check_out(OP, "lines", em.lines, shape=(rows, 3), dtype=torch.float32, device=dev)
    if em.counts is not None:
        check_out(OP, "counts", em.counts, shape=(rows, 3), dtype=torch.int32, device=dev)
    if em.list_values is not None:
        cap = em.list_values.shape[-1] // 3 if em.list_values.dim() == 2 else 0
        check_int(OP, "list capacity per segment", cap, low=1)
        check_out(OP, "list_values", em.list_values, shape=(rows, 3 * cap), dtype=torch.float32,
                  device=dev)  # fmt: skip
        check_out(OP, "list_indices", em.list_indices, shape=(rows, 3 * cap), dtype=torch.int32,
                  device=dev)  # fmt: skip
        check_out(OP, "list_claims", em.list_claims, shape=(rows, 3), dtype=torch.int32,
                  device=dev)  # fmt: skip


def _reference_into(q_codes, weights, key_codes, key_scales, key_format, block_table, lengths,
                    out, em, fill_padding):  # fmt: skip
    width = out.shape[1]
    ref = reference.indexer_logits(
        q_codes, weights, key_codes, key_scales, key_format, block_table, lengths, width
    ).float()
    if fill_padding:
        out.copy_(ref)
    else:
        pos = torch.arange(width, device=out.device)
        out.copy_(torch.where(pos[None, :] < lengths.long()[:, None], ref, out))
    if em is None:
        return
    lines = em.lines if em.lines is not None else torch.full((out.shape[0], 3), float("inf"))
    bm, counts, claims, members = reference.emissions(ref, lengths, lines, max(1, em.seg_cap))
    if em.block_max is not None:
        em.block_max.copy_(bm)
    if em.counts is not None:
        em.counts.copy_(counts)
    if em.list_values is not None:
        em.list_claims.copy_(claims)
        cap = em.seg_cap
        for r, segs in enumerate(members):
            for s, idx in enumerate(segs):
                idx = idx[:cap]
                em.list_indices[r, s * cap : s * cap + idx.numel()] = idx.to(torch.int32)
                em.list_values[r, s * cap : s * cap + idx.numel()] = ref[r, idx]


def paged_indexer_logits_into(q_codes, weights, key_codes, key_scales, key_format, block_table,
                              lengths, out, em=None, fill_padding=True, backend="auto") -> None:  # fmt: skip
    """Writes ``out`` (and the emissions); inputs already validated. No allocation, no sync."""
    which = resolve_backend(OP, backend, q_codes.device, IMPLEMENTED)
    if em is not None:
        for t in (em.counts, em.list_claims):
            if t is not None:
                t.zero_()
    if which == "reference":
        _reference_into(q_codes, weights, key_codes, key_scales, key_format, block_table,
                        lengths, out, em, fill_padding)  # fmt: skip
        return
    rows, h, d = q_codes.shape
    batch, n_pages = block_table.shape
    next_n = rows // batch
    nq = triton.next_power_of_2(next_n)
    page = key_codes.shape[1]
    width = n_pages * page
    dev = q_codes.device
    sms = _sm_count(dev.index or 0) if dev.type == "cuda" else 8
    keys, tiles, warps, stages, max_regs = launch_config(batch, width, nq, h, sms, key_format, d)
    n_tiles = triton.cdiv(width, keys)
    em = em or Emissions()
    dummy_f, dummy_i = out, lengths
    grid = (batch, triton.cdiv(n_tiles, tiles))
    _paged_indexer_logits_kernel[grid](
        q_codes, weights, key_codes, key_scales, block_table, lengths, out,
        em.block_max if em.block_max is not None else dummy_f,
        em.lines if em.lines is not None else dummy_f,
        em.counts if em.counts is not None else dummy_i,
        em.list_values if em.list_values is not None else dummy_f,
        em.list_indices if em.list_indices is not None else dummy_i,
        em.list_claims if em.list_claims is not None else dummy_i,
        block_table.stride(0), out.stride(0),
        em.block_max.stride(0) if em.block_max is not None else 0, em.seg_cap, width, n_tiles,
        NEXT_N=next_n, NQ=nq, H=h, D=d, PAGE=page, KEYS=keys, TILES=tiles, STAGES=stages,
        FP4=key_format == "fp4", FOLD=key_format == "fp4" and d == 128,
        DOT_F32=triton_interpreter_active(), FILL_PAD=fill_padding,
        EMIT_MAX=em.block_max is not None, EMIT_COUNTS=em.counts is not None,
        EMIT_LIST=em.list_values is not None, num_warps=warps, enable_fp_fusion=True,
        **maxnreg_kwargs(max_regs),
    )  # fmt: skip


def paged_indexer_logits(
    q_codes: torch.Tensor,
    weights: torch.Tensor,
    key_codes: torch.Tensor,
    key_scales: torch.Tensor,
    block_table: torch.Tensor,
    lengths: torch.Tensor,
    *,
    key_format: str = "fp8",
    out: torch.Tensor | None = None,
    emissions: Emissions | None = None,
    fill_padding: bool = True,
    backend: str = "auto",
) -> torch.Tensor:
    """fp32 logits [B * next_n, pages * block_size] (see the module docstring for the contract).

    ``q_codes`` uint8 e4m3 [B * next_n, H, D]; ``weights`` fp32 [B * next_n, H] (query scales
    folded in); ``key_codes`` / ``key_scales`` the cache (``key_cache``); ``block_table`` int32
    [B, pages]; ``lengths`` int32 [B * next_n]. With ``out`` (and preallocated emissions) nothing
    is allocated: CUDA-graph safe.
    """
    _validate(q_codes, weights, key_codes, key_scales, key_format, block_table, lengths, out,
              emissions)  # fmt: skip
    if out is None:
        width = block_table.shape[1] * key_codes.shape[1]
        out = torch.empty(q_codes.shape[0], width, dtype=torch.float32, device=q_codes.device)
    paged_indexer_logits_into(q_codes, weights, key_codes, key_scales, key_format, block_table,
                              lengths, out, emissions, fill_padding, backend)  # fmt: skip
    return out


@torch.library.custom_op("flashrt::paged_indexer_logits", mutates_args=())
def _paged_indexer_logits_op(
    q_codes: torch.Tensor, weights: torch.Tensor, key_codes: torch.Tensor,
    key_scales: torch.Tensor, block_table: torch.Tensor, lengths: torch.Tensor,
    key_format: str, backend: str,
) -> torch.Tensor:  # fmt: skip
    return paged_indexer_logits(q_codes, weights, key_codes, key_scales, block_table, lengths,
                                key_format=key_format, backend=backend)  # fmt: skip


@_paged_indexer_logits_op.register_fake
def _(q_codes, weights, key_codes, key_scales, block_table, lengths, key_format, backend):
    width = block_table.shape[1] * key_codes.shape[1]
    return q_codes.new_empty((q_codes.shape[0], width), dtype=torch.float32)


@torch.library.custom_op("flashrt::paged_indexer_logits_out", mutates_args=("out",))
def _paged_indexer_logits_out_op(
    q_codes: torch.Tensor, weights: torch.Tensor, key_codes: torch.Tensor,
    key_scales: torch.Tensor, block_table: torch.Tensor, lengths: torch.Tensor,
    key_format: str, out: torch.Tensor, backend: str,
) -> None:  # fmt: skip
    paged_indexer_logits(q_codes, weights, key_codes, key_scales, block_table, lengths,
                         key_format=key_format, out=out, backend=backend)  # fmt: skip
