"""Exact batched top-K: deterministic order (see ``reference``), hint-free threshold-counting select, guess /
verify / refine with the previous step's indices, and consumers of producer hints (``hints``)."""

from flashrt_kernels.topk import hints, reference, state
from flashrt_kernels.topk.api import topk

__all__ = ["hints", "reference", "state", "topk"]
