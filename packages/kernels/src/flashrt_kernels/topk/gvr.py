"""Guess / verify / refine with the previous step's indices (placeholder until the kernels land)."""

from __future__ import annotations

from flashrt_kernels.topk import radix


def select(scores, k, lengths, hint, out_values, out_indices, state) -> None:
    radix.select(scores, k, lengths, out_values, out_indices, state)
