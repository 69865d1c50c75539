"""Hint formats a producer (e.g. a logits GEMM epilogue) writes and the top-K consumes.

Every consumer is exact whatever the hint holds: a hint only decides how much work is skipped;
a hint that cannot prove the result (a miss) sends the row to the exact path. All tensors are on
the scores' device; ``B`` rows of ``N`` scores with valid prefixes ``lengths`` (None: all N).

1. Previous indices (``hint`` of ``topk``): int32 ``[B, k]``, any values. Entries outside
   ``[0, length)`` are ignored; duplicates, zeros or the bottom-K are allowed (they only make the
   guessed thresholds worse). The gathered values give candidate thresholds; one pass counts every
   threshold; the tightest threshold whose exact count is in ``[k, capacity]`` is accepted.

2. ``BlockMaxima``: float32 ``[B, ceil(N / 32)]``; entry ``j`` is >= every valid score of positions
   ``[32 j, 32 j + 32)`` (the producer writes the exact maximum; NaN when the block holds a NaN;
   -inf for a block with no valid position). An upper bound is enough for exactness: a block whose
   maximum ranks below the threshold is skipped (it cannot hold a candidate).

3. ``SeedLines``: ``lines`` float32 ``[B, L]`` and ``counts`` int32 ``[B, L]``: ``counts[b, l]`` is
   the exact number of valid scores of row ``b`` with ``score >= lines[b, l]`` (NaN counts as
   above every line). Admission is a lookup: the line with the smallest count in ``[k, capacity]``
   becomes the threshold without a counting pass; a row with no such line goes to the exact path.

4. ``CandidateList``: ``values`` float32 ``[B, C]``, ``indices`` int32 ``[B, C]``, ``claimed`` int32
   ``[B]``, ``void`` bool ``[B]``. The producer promises: unless ``void[b]``, the list of row ``b``
   holds every valid score of the row that is >= the smallest real entry it holds (the list is
   complete above its own line) and ``claimed[b]`` is the number of real entries. Real entries
   have ``0 <= index < length`` and ``values[b, i] == scores[b, index]``; the rest are sentinel pads
   (index -1, any value) and never count. A row is admitted when it is not void and holds at least
   ``k`` real entries; it is then ranked from the list alone (no rescan of the row). A void row or
   one with fewer than ``k`` real entries is demoted to the exact path (never padded up to k).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flashrt_kernels.checks import check_tensor

BLOCK = 32  # positions per block maximum


@dataclass(frozen=True)
class BlockMaxima:
    maxima: torch.Tensor  # float32 [B, ceil(N / 32)]


@dataclass(frozen=True)
class SeedLines:
    lines: torch.Tensor  # float32 [B, L], any order
    counts: torch.Tensor  # int32 [B, L], exact count of valid scores >= the line


@dataclass(frozen=True)
class CandidateList:
    values: torch.Tensor  # float32 [B, C]
    indices: torch.Tensor  # int32 [B, C], -1 for sentinel pads
    claimed: torch.Tensor  # int32 [B], real entries
    void: torch.Tensor  # bool [B], the producer overflowed: the list is incomplete


MAX_LINES = 8  # seed lines consumed per row (the first eight; more are ignored)


def _outs(scores, k, out_values, out_indices):
    b = scores.shape[0]
    if out_values is None:
        out_values = torch.empty((b, k), dtype=scores.dtype, device=scores.device)
    if out_indices is None:
        out_indices = torch.empty((b, k), dtype=torch.int32, device=scores.device)
    return out_values, out_indices


def _check_common(op, scores, k, lengths, out_values, out_indices, state, block_maxima):
    from flashrt_kernels.topk.api import _validate

    _validate(scores, k, lengths, out_values, out_indices, None, state)
    b, n = scores.shape
    if block_maxima is not None:
        check_tensor(op, "block_maxima", block_maxima, dtypes=(torch.float32,),
                     shape=[b, (n + BLOCK - 1) // BLOCK], device=scores.device,
                     last_dim_contiguous=True)  # fmt: skip


def topk_hinted(scores, k, hint, *, block_maxima=None, lengths=None, out_values=None,
                out_indices=None, state=None):  # fmt: skip
    """``topk`` with the previous indices and (optionally) block maxima; exact (Triton)."""
    from flashrt_kernels.topk import select

    _check_common("topk_hinted", scores, k, lengths, out_values, out_indices, state, block_maxima)
    check_tensor("topk_hinted", "hint", hint, dtypes=(torch.int32,), shape=[scores.shape[0], k],
                 device=scores.device, contiguous=True)  # fmt: skip
    out_values, out_indices = _outs(scores, k, out_values, out_indices)
    select.launch(scores, k, lengths, out_values, out_indices, state, hint,
               block_maxima=block_maxima)  # fmt: skip
    return out_values, out_indices


def topk_seeded(scores, k, seeds: SeedLines, *, block_maxima=None, lengths=None,
                out_values=None, out_indices=None, state=None):  # fmt: skip
    """Exact top-k admitted by seed lines (no counting pass): the lines and their exact counts
    take the place of the first counting round, so a row with a line whose count is in
    ``[k, capacity]`` is collected at once; the others refine from the lines' bracket (exact
    either way). Triton only."""
    from flashrt_kernels.topk import reference, select

    op = "topk_seeded"
    _check_common(op, scores, k, lengths, out_values, out_indices, state, block_maxima)
    b = scores.shape[0]
    check_tensor(op, "lines", seeds.lines, dtypes=(torch.float32,), shape=[b, None],
                 device=scores.device)  # fmt: skip
    check_tensor(op, "counts", seeds.counts, dtypes=(torch.int32,),
                 shape=list(seeds.lines.shape), device=scores.device)  # fmt: skip
    n_lines = min(MAX_LINES, seeds.lines.shape[1])
    n = scores.shape[1]
    full = torch.full((b,), n, device=scores.device) if lengths is None else lengths.clamp(0, n)
    # unused slots: a key below every score (its exact count is the length), or line 0 again
    keys = torch.full((b, MAX_LINES), -(2**31) + 1, dtype=torch.int32, device=scores.device)
    counts = full.to(torch.int32)[:, None].repeat(1, MAX_LINES)
    if n_lines:
        keys[:] = reference.order_key(seeds.lines[:, :1])
        counts[:] = seeds.counts[:, :1]
        keys[:, :n_lines] = reference.order_key(seeds.lines[:, :n_lines])
        counts[:, :n_lines] = seeds.counts[:, :n_lines]
    out_values, out_indices = _outs(scores, k, out_values, out_indices)
    select.launch(scores, k, lengths, out_values, out_indices, state, None,
               seeds=(keys, counts), block_maxima=block_maxima)  # fmt: skip
    return out_values, out_indices


def list_admitted(cands: CandidateList, k: int, lengths: torch.Tensor | None, n: int):
    """bool [B]: not void, the real entries (0 <= index < length) number ``claimed`` and >= k."""
    idx = cands.indices.long()
    length = n if lengths is None else lengths.long().clamp(0, n)[:, None]
    real = ((idx >= 0) & (idx < length)).sum(1)
    return ~cands.void & (real == cands.claimed.long()) & (real >= k)


def topk_from_list(scores, k, cands: CandidateList, *, lengths=None, out_values=None,
                   out_indices=None, backend="auto"):  # fmt: skip
    """Exact top-k: admitted rows are ranked from the list alone (its values and indices, no
    rescan); the others take the exact path. No host sync: both are computed and selected per
    row on the device (the exact path runs for every row)."""
    from flashrt_kernels.topk import reference
    from flashrt_kernels.topk.api import topk

    op = "topk_from_list"
    _check_common(op, scores, k, lengths, out_values, out_indices, None, None)
    b, n = scores.shape
    check_tensor(op, "values", cands.values, dtypes=(scores.dtype, torch.float32), ndim=2,
                 device=scores.device)  # fmt: skip
    c = cands.values.shape[1]
    check_tensor(op, "indices", cands.indices, dtypes=(torch.int32,), shape=[b, c],
                 device=scores.device)  # fmt: skip
    check_tensor(op, "claimed", cands.claimed, dtypes=(torch.int32,), shape=[b],
                 device=scores.device)  # fmt: skip
    check_tensor(op, "void", cands.void, dtypes=(torch.bool,), shape=[b], device=scores.device)
    ok = list_admitted(cands, k, lengths, n)
    idx = cands.indices.long()
    length = n if lengths is None else lengths.long().clamp(0, n)[:, None]
    real = (idx >= 0) & (idx < length)
    comp = (reference.order_key(cands.values).long() << 32) - 1 - idx
    comp = torch.where(real, comp, torch.full_like(comp, -(2**63)))
    kk = min(k, c)
    ranked = torch.sort(comp, dim=1, descending=True)
    top = ranked.values[:, :kk]
    lv_idx = (((top >> 32) + 1) << 32) - 1 - top  # garbage only in rows that are not admitted
    order = torch.argsort(torch.where(top > -(2**63), lv_idx, 2**40), dim=1)  # index order
    lv_idx = torch.gather(lv_idx, 1, order)
    # the k values of an admitted row, as the scores' own bits (a gather of k, not a rescan)
    bits = torch.int32 if scores.dtype == torch.float32 else torch.int16
    safe = torch.where(ok[:, None], lv_idx, torch.zeros_like(lv_idx)).clamp(0, max(n - 1, 0))
    lv_raw = torch.gather(scores.view(bits), 1, safe) if n else safe.to(bits)
    ev, ei = topk(scores, k, lengths=lengths, out_values=out_values, out_indices=out_indices,
                  backend=backend)  # fmt: skip
    if kk:
        raw = ev.view(bits)
        raw[:, :kk] = torch.where(ok[:, None], lv_raw, raw[:, :kk])
        ei[:, :kk] = torch.where(ok[:, None], lv_idx.int(), ei[:, :kk])
    return ev, ei
