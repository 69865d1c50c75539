"""The selection step: the one place that decides which top-K runs for a routed tier.

Every tier returns the deterministic top-K (the K highest-ranked, ties by lowest index, listed in
ascending index order, ``-1`` pads) of the logits over each row's valid prefix, bit for bit: the
tiers differ only in the hints flashrt-kernels' top-K receives, each consumer being exact whatever
the hint holds:
- ``none``: ``topk.topk`` with no hint;
- ``rungs``: ``topk.topk(hint=...)`` with the previous step's indices (guess, verify, refine);
  through ``topk.topk`` so that ``backend="auto"`` runs the same backend as ``none`` (the CUDA
  select where CuPy runs: its hinted counting pass replaces the bound pass of long rows);
- ``counts``: ``hints.topk_seeded`` with the three emitted lines and their exact counts
  (``SeedLines``) plus the emitted block maxima (a Triton-only consumer);
- ``list``: ``hints.topk_from_list`` over the emitted candidate list: the three segments form one
  list whose unfilled slots are ``-1`` pads; ``claimed`` counts real entries only and the list is
  void when any segment overflowed (then it is not complete above its smallest entry).
``backend="reference"`` (and a missing flashrt-kernels top-K) runs ``reference.topk``.

Why ``rungs`` is not ``hints.topk_hinted``: that consumer always runs the Triton select, while
``topk.topk``'s ``auto`` prefers the CUDA select (per flashrt-kernels' benchmark 12.6 us against the
Triton select's 47 us at B=1, N=8192, K=512), so routing through it could make a routed step slower
than the hint-free one. (H200 run 5 of docs/dsv4-indexer.md: 15.6 us hint-free at B=1, N=8192.)
"""

from __future__ import annotations

import functools
import importlib

import torch

from flashrt_dsv4_indexer import reference

TIERS = ("none", "rungs", "counts", "list")


@functools.cache
def kernels_topk():
    """flashrt-kernels' top-K module, or None where it is not installed."""
    try:  # the subpackage by its full name: an attribute lookup could yield the function
        module = importlib.import_module("flashrt_kernels.topk")
    except ImportError:
        return None
    return module if callable(getattr(module, "topk", None)) else None


def candidate_list(em):
    """The emitted three-segment list as flashrt-kernels' ``CandidateList``."""
    from flashrt_kernels.topk.hints import CandidateList

    cap = em.seg_cap
    claimed = em.list_claims.clamp(max=cap).sum(1).to(torch.int32)
    void = (em.list_claims > cap).any(1)
    return CandidateList(em.list_values, em.list_indices, claimed, void)


def select(
    scores: torch.Tensor,
    k: int,
    lengths: torch.Tensor,
    *,
    tier: str = "none",
    prev_indices: torch.Tensor | None = None,
    emissions=None,
    out_values: torch.Tensor | None = None,
    out_indices: torch.Tensor | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """(values fp32 [B, k], indices int32 [B, k]) of ``scores`` [B, N] over ``lengths``."""
    if tier not in TIERS:
        raise ValueError(f"topk_stage.select: tier must be one of {TIERS}, got {tier!r}")
    mod = kernels_topk()
    if mod is not None and backend != "reference":
        from flashrt_kernels.topk import hints

        outs = dict(lengths=lengths, out_values=out_values, out_indices=out_indices)
        if tier == "counts" and emissions is not None:
            seeds = hints.SeedLines(emissions.lines, emissions.counts)
            return hints.topk_seeded(scores, k, seeds, block_maxima=emissions.block_max, **outs)
        if tier == "list" and emissions is not None:
            return hints.topk_from_list(scores, k, candidate_list(emissions), backend=backend,
                                        **outs)  # fmt: skip
        hint = prev_indices.contiguous() if tier != "none" and prev_indices is not None else None
        return mod.topk(scores, k, hint=hint, backend=backend, **outs)
    values, indices = reference.topk(scores, k, lengths)
    if out_values is not None:
        out_values.copy_(values)
        values = out_values
    if out_indices is not None:
        out_indices.copy_(indices)
        indices = out_indices
    return values, indices


def exact_reference(scores: torch.Tensor, k: int, lengths: torch.Tensor):
    """The order every tier must reproduce bit for bit (flashrt-kernels' reference when present)."""
    mod = kernels_topk()
    if mod is not None:
        try:
            from flashrt_kernels.topk import reference as kref

            return kref.topk(scores, k, lengths=lengths)
        except ImportError:
            pass
    return reference.topk(scores, k, lengths)


def list_admission(claims: torch.Tensor, seg_cap: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Which rows a candidate list can serve exactly, and with how many segments.

    ``claims`` int32 [R, 3] are the per-segment claimed counts (real entries only: the kernel never
    counts padding). A row is admitted with the fewest leading segments whose total reaches ``k``,
    provided none of those segments is void (claim over ``seg_cap``). A row whose list holds fewer
    than ``k`` real candidates is demoted to the exact path (ok False), never padded up to ``k``.
    """
    total = claims.long().cumsum(1)
    void = claims > seg_cap
    reach = total >= k
    n_seg = torch.where(reach.any(1), reach.int().argmax(1) + 1, torch.full_like(total[:, 0], 4))
    seg = torch.arange(3, device=claims.device)[None, :]
    void_used = (void & (seg < n_seg[:, None])).any(1)
    ok = reach.any(1) & ~void_used
    return ok, torch.where(ok, n_seg, torch.zeros_like(n_seg))
