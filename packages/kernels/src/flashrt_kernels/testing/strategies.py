"""Hypothesis strategies for kernel properties. They draw shapes, flags, dtypes and seeds, never
element data: tensors are built from the seed (``values.make_values``)."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

# Sizes around the block widths kernels tile by: where off-by-one masks break.
BOUNDARY_SIZES = (1, 2, 3, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257)


def sizes(low: int, high: int, boundaries: tuple[int, ...] = BOUNDARY_SIZES) -> st.SearchStrategy:
    """An int in [low, high], drawn half the time from the block boundaries inside the range."""
    inside = sorted({b for b in (*boundaries, low, high) if low <= b <= high})
    return st.one_of(st.sampled_from(inside), st.integers(low, high))


def dtypes(*allowed: torch.dtype) -> st.SearchStrategy:
    return st.sampled_from(allowed)


def seeds() -> st.SearchStrategy:
    return st.integers(0, 2**31 - 1)


def value_kinds(*allowed: str) -> st.SearchStrategy:
    from flashrt_kernels.testing.values import VALUE_KINDS

    for k in allowed:
        if k not in VALUE_KINDS:
            raise ValueError(f"unknown value kind {k!r}; known: {VALUE_KINDS}")
    return st.sampled_from(allowed or VALUE_KINDS)


def test_device() -> torch.device:
    """The device a property runs on: the GPU when there is one, else the CPU (interpreter)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


test_device.__test__ = False  # not a pytest test despite its name
