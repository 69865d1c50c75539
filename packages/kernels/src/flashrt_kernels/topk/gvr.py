"""Guess, verify, refine: the exact select with the previous step's indices as a hint.

Guess: round 0 counts the smallest current score at the hinted positions (entries outside
``[0, length)`` ignored) and that key + 1, the published K-th key of the previous step and that
key + 1, the published accepted key (when ``state`` says valid), and the hinted key less about
0.2%, 1.6% and 12% in value (no sample is drawn: the hint is the guess). Verify: those eight counts are exact (one pass). Refine: the counts bracket the
K-th key; round 1 places eight more thresholds inside the bracket by log-count interpolation
(with the bracket ends + 1 / - 1 and the key midpoint: bisection bounds the worst case); a row the
rounds leave unresolved keeps refining in its finishing program, so exactness never depends on the
hint (see ``kernels``). The counts at the first eight thresholds are published in ``state``.
"""

from __future__ import annotations

from flashrt_kernels.topk import select as sel


def select(scores, k, lengths, hint, out_values, out_indices, state, split=None, seeds=None,
           block_maxima=None) -> None:  # fmt: skip
    sel.launch(scores, k, lengths, out_values, out_indices, state, hint, split, seeds,
               block_maxima)  # fmt: skip
