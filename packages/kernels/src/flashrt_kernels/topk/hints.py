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
