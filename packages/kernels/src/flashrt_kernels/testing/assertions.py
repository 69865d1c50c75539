"""Assertions for numerics contracts, and poisoned output buffers.

``assert_exact``: bit for bit (NaN matches NaN of any payload; +0 and -0 differ).
``assert_faithful``: |actual - expected| <= atol + rtol * |expected| elementwise, the same NaN
positions, the same infinities.
"""

from __future__ import annotations

import torch

_INT_VIEW = {2: torch.int16, 4: torch.int32, 8: torch.int64, 1: torch.int8}


def _bits(t: torch.Tensor) -> torch.Tensor:
    if t.dtype.is_floating_point:
        return t.contiguous().view(_INT_VIEW[t.element_size()])
    return t


def _describe(
    mask: torch.Tensor, actual: torch.Tensor, expected: torch.Tensor, limit: int = 5
) -> str:
    idx = mask.nonzero()[:limit]
    parts = []
    for i in idx.tolist():
        key = tuple(i)
        parts.append(f"{key}: got {actual[key].item()!r}, expected {expected[key].item()!r}")
    return "; ".join(parts)


def _same_meta(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    if actual.shape != expected.shape:
        raise AssertionError(
            f"{what}: shape {tuple(actual.shape)} != expected {tuple(expected.shape)}"
        )
    if actual.dtype != expected.dtype:
        raise AssertionError(f"{what}: dtype {actual.dtype} != expected {expected.dtype}")


def assert_exact(actual: torch.Tensor, expected: torch.Tensor, what: str = "output") -> None:
    """Bitwise equality (any NaN equals any NaN)."""
    _same_meta(actual, expected, what)
    a = actual.detach().cpu()
    e = expected.detach().cpu()
    diff = _bits(a) != _bits(e)
    if a.dtype.is_floating_point:
        diff &= ~(torch.isnan(a) & torch.isnan(e))
    if diff.any():
        n = int(diff.sum())
        raise AssertionError(
            f"{what}: {n} of {diff.numel()} elements differ bitwise; first: {_describe(diff, a, e)}"
        )


def assert_faithful(
    actual: torch.Tensor,
    expected: torch.Tensor,
    *,
    rtol: float,
    atol: float = 0.0,
    what: str = "output",
) -> None:
    """Elementwise |actual - expected| <= atol + rtol * |expected| over finite expected values;
    NaN and infinities must sit in the same places."""
    _same_meta(actual, expected, what)
    a = actual.detach().cpu().double()
    e = expected.detach().cpu().double()
    nan_a, nan_e = torch.isnan(a), torch.isnan(e)
    if not torch.equal(nan_a, nan_e):
        bad = nan_a != nan_e
        raise AssertionError(f"{what}: NaN positions differ; first: {_describe(bad, a, e)}")
    inf_e = torch.isinf(e)
    bad_inf = inf_e & (a != e)
    if bad_inf.any():
        raise AssertionError(f"{what}: infinities differ; first: {_describe(bad_inf, a, e)}")
    finite = ~nan_e & ~inf_e
    err = (a - e).abs()
    bound = atol + rtol * e.abs()
    bad = finite & ~(err <= bound)
    if bad.any():
        worst = ((err - bound) * bad).argmax()
        worst_idx = tuple(int(i) for i in torch.unravel_index(worst, a.shape))
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.numel()} elements outside "
            f"atol={atol:g} + rtol={rtol:g}*|expected|; worst at {worst_idx}: got "
            f"{a[worst_idx].item()!r}, expected {e[worst_idx].item()!r}; first: {_describe(bad, a, e)}"
        )


def poison(t: torch.Tensor) -> torch.Tensor:
    """Fill ``t`` in place with a value no correct kernel writes by accident: NaN for floats, the
    most negative integer for integer types. Returns ``t``."""
    if t.dtype.is_floating_point:
        return t.fill_(float("nan"))
    if t.dtype == torch.bool:
        return t.fill_(True)
    return t.fill_(torch.iinfo(t.dtype).min)


def poisoned_empty(shape, dtype: torch.dtype, device) -> torch.Tensor:
    """A new poisoned buffer (see ``poison``)."""
    return poison(torch.empty(shape, dtype=dtype, device=device))
