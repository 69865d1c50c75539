"""Routing: which top-K tier a decode step uses, from the rows' live lengths and the batch.

The plan looks at the live compressed lengths of the rows in the step (never the engine's maximum
length: a short row in a long-context engine must not pay for machinery that only helps long rows)
and at the batch size:
- ``none`` (hint-free exact top-K) when the longest live row is short (below ``min_assist_n``) or
  no row has usable closed-loop state. The default threshold is past flashrt-kernels' CUDA select's
  one-block rows (``cuda_select.SHORT_MAX`` = 32768: one block per row searches the row in shared
  memory and takes no hint, so a hint there only costs its gather);
- ``list`` (candidate-list emission) for long rows at small batch (``n >= list_min_n`` and
  ``batch <= list_max_batch``): the list lets the top-K rank a small set;
- ``counts`` (seed-count emission) where ``batch * n >= counts_min_work`` (None: never);
- ``rungs`` (previous-step indices only, no emission) where ``batch * n <= rungs_max_work``;
- ``none`` otherwise: on decode chains whose queries drift between steps, the hinted CUDA select
  (with the sampled thresholds of its counting pass, 2026-12-06, docs/dsv4-indexer.md run 6)
  beat the hint-free one by 1.02-1.33x up to ``batch * n`` = 2M and lost from B = 16 at 256k.
  Since the hint-free select takes long rows at B <= 8 as thread-block clusters (run 8, the same
  day), the hinted one ties it at B = 1 (1.03-1.14x at 128k-256k in run 8, 0.96-1.05x in run 9)
  and no longer wins at B = 4 (0.95-1.00x) or B = 16 at 128k (0.97x), hence 2^18 (2^19 before
  run 6, 2^21 after it).
The ``list`` and ``counts`` tiers are off by default: measured on the H200 (docs/dsv4-indexer.md),
their consumers (flashrt-kernels' Triton select) were no faster than the hint-free top-K while
their emissions cost logits time (counts: +32-42%).
The CUDA-graph path fixes one plan per (batch, length bucket): ``bucket_length`` rounds the live
maximum up to a power of two, and the plan is computed from the bucket.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class RoutingPolicy:
    min_assist_n: int = 32768 + 1
    list_min_n: int = 65536
    # 0: the list tier is off by default. Measured on the H200 (docs/dsv4-indexer.md): its
    # emission costs 2.7-4.8x the plain logits kernel and the list consumer runs the exact path
    # too, so it lost (0.58x) on every cell it was picked; pass a policy to turn it on.
    list_max_batch: int = 0
    counts_min_work: int | None = None  # batch * n; None: the counts tier is off
    rungs_max_work: int | None = 1 << 18  # batch * n; None: rungs wherever assisted


DEFAULT_POLICY = RoutingPolicy()


def plan_tier(
    live_n: Sequence[int], *, warm_rows: int | None = None, policy: RoutingPolicy = DEFAULT_POLICY
) -> str:
    """The tier for one step whose rows have ``live_n`` compressed lengths (host ints)."""
    batch = len(live_n)
    if batch == 0:
        return "none"
    n = max(live_n)
    if n < policy.min_assist_n or warm_rows == 0:
        return "none"
    if n >= policy.list_min_n and batch <= policy.list_max_batch:
        return "list"
    if policy.counts_min_work is not None and batch * n >= policy.counts_min_work:
        return "counts"
    if policy.rungs_max_work is not None and batch * n > policy.rungs_max_work:
        return "none"
    return "rungs"


def bucket_length(n: int, floor: int = 256) -> int:
    """The power-of-two length bucket a graph is captured for."""
    b = floor
    while b < n:
        b *= 2
    return b


def plan_bucket(batch: int, n_bucket: int, policy: RoutingPolicy = DEFAULT_POLICY) -> str:
    """The fixed tier of a captured graph for ``batch`` rows of at most ``n_bucket`` keys."""
    return plan_tier([n_bucket] * batch, policy=policy)
