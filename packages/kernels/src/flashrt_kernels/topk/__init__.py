"""Exact batched top-K: deterministic order (see ``reference``), a hint-free select (a CUDA C++
radix select through CuPy, ``cuda_select``; a Triton threshold-counting select, ``select``), guess /
verify / refine with the previous step's indices, and consumers of producer hints (``hints``)."""

from flashrt_kernels.topk import hints, reference, state
from flashrt_kernels.topk.api import topk

__all__ = ["hints", "reference", "state", "topk"]
