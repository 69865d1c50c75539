"""Guess, verify, refine: the exact select with the previous step's indices as a hint.

Guess: the smallest current score at the hinted positions (entries outside ``[0, length)``
ignored), the published K-th and accepted keys of the previous step (when ``state`` says valid)
and the smaller of the first two. Verify: the first histogram pass also counts the valid scores
at or above each guess (exact counts, one pass). Refine: the tightest guess whose count lies in
``[k, CAP]`` is accepted and its scores are collected in the second pass, then ranked exactly by
the final sort; a row with no such guess (any miss: degenerate hint, stale state, too many ties)
runs the remaining radix passes, so exactness never depends on the hint. The counts at every
tried threshold are published in ``state``.
"""

from __future__ import annotations

import triton

from flashrt_kernels.topk import radix


def capacity(k: int) -> int:
    """Candidates a guess may admit: 4x the padded k, at least 2048, at most 4096."""
    return max(2048, min(4096, 4 * triton.next_power_of_2(k)))


def select(scores, k, lengths, hint, out_values, out_indices, state, split=None, seeds=None,
           block_maxima=None) -> None:  # fmt: skip
    radix.launch(scores, k, lengths, out_values, out_indices, state, hint,
                 max(capacity(k), triton.next_power_of_2(k)), split, seeds, block_maxima)  # fmt: skip
