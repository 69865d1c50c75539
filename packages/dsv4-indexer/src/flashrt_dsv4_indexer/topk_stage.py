"""The selection step: the one place that decides which top-K runs for a routed tier.

Every tier returns the deterministic top-K (``reference.topk``'s order: values descending, ties by
ascending index, ``-1`` pads) of the logits over each row's valid prefix: the tiers differ only in
which hints the top-K receives. flashrt-kernels' ``topk.topk`` is used when it is installed; until
its hint consumers (block maxima, seed counts, candidate lists) are published in
``flashrt_kernels.topk.hints``, the ``counts`` and ``list`` tiers pass only the previous step's
indices, and the emissions are produced, checked and fed back to the closed loop but not consumed.
Without flashrt-kernels' top-K, the torch copy of the deterministic order runs (``reference.topk``).
"""

from __future__ import annotations

import functools

import torch

from flashrt_dsv4_indexer import reference

TIERS = ("none", "rungs", "counts", "list")


@functools.cache
def kernels_topk():
    """flashrt-kernels' top-K module, or None where it is not installed (yet)."""
    try:
        from flashrt_kernels import topk as module
    except ImportError:
        return None
    return module if hasattr(module, "topk") else None


def hint_consumers_available() -> bool:
    try:
        from flashrt_kernels.topk import hints  # noqa: F401
    except ImportError:
        return False
    return True


def select(
    scores: torch.Tensor,
    k: int,
    lengths: torch.Tensor,
    *,
    tier: str = "none",
    prev_indices: torch.Tensor | None = None,
    out_values: torch.Tensor | None = None,
    out_indices: torch.Tensor | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """(values fp32 [B, k], indices int32 [B, k]) of ``scores`` [B, N] over ``lengths``."""
    if tier not in TIERS:
        raise ValueError(f"topk_stage.select: tier must be one of {TIERS}, got {tier!r}")
    mod = kernels_topk()
    hint = prev_indices if tier != "none" else None
    if mod is not None and backend != "reference":
        return mod.topk(scores, k, lengths=lengths, out_values=out_values,
                        out_indices=out_indices, hint=hint, backend=backend)  # fmt: skip
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
