"""Closed-loop top-K state keyed by request (never by batch slot).

A request id maps to a state slot for the request's whole life: the state follows the request when
the engine moves it to another batch slot, is reset when the request finishes, and a new request
starts cold even in a batch slot a finished one freed (keying by slot would hand it the stale
state, marked valid). The state is seeded at the prefill -> decode handoff from the last context
token's selection.

Per slot (device tensors, so a captured graph gathers and scatters them): ``valid`` (int32),
``kth`` (the exact K-th value of the last selection), ``top`` (its largest value), ``lines``
(three threshold lines, tightest first, for the next step's emissions), ``counts`` (the exact
counts the last step measured at its lines) and ``prev`` (its top-K indices, the next hint).

Line placement (``place_lines``): fit the slope of log2(count) against threshold from the last
step's (line, count) pairs and place the lines at ``TARGETS`` x K counts through the exact K-th
value; when the fit is unusable (too few distinct counts, non-negative slope, or a line spread that
is degenerate relative to the scores' own spread) fall back to wide guards below the K-th value,
scaled by the spread of the selected values (never pinned at an absolute floor). Cold rows get
``+inf`` lines (nothing emitted) and ``-1`` hints: the exact hint-free path.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

TARGETS = (1.25, 2.0, 4.0)  # count targets of the three lines, in units of K
GUARDS = (0.25, 1.0, 4.0)  # fallback: lines at kth - guard * spread


@functools.cache
def _constants(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    logt = torch.log2(torch.tensor(TARGETS, dtype=torch.float64))
    return logt.to(device), torch.tensor(GUARDS, dtype=torch.float64).to(device)


def place_lines(lines, counts, kth, top, k: int, valid) -> torch.Tensor:
    """Next lines [R, 3] (tightest first) from the last lines/counts [R, 3], the K-th and top
    values [R] and the validity [R] (vectorized, no host sync)."""
    x = lines.double()
    y = torch.log2(counts.double().clamp(min=1.0))
    xm, ym = x.mean(1, keepdim=True), y.mean(1, keepdim=True)
    var = ((x - xm) ** 2).sum(1)
    slope = ((x - xm) * (y - ym)).sum(1) / var.clamp(min=1e-300)
    kd, td = kth.double(), top.double()
    spread = torch.maximum(td - kd, 1e-3 * kd.abs()).clamp(min=1e-30)
    distinct = (counts[:, 0] != counts[:, 2]) & (counts > 0).sum(1).ge(2)
    usable = (
        torch.isfinite(x).all(1)
        & torch.isfinite(slope)
        & (slope < 0)
        & distinct
        & (var.sqrt() > 1e-3 * spread)
    )
    logt, guards = _constants(str(lines.device))
    fitted = kd[:, None] + logt[None, :] / slope[:, None]
    wide = kd[:, None] - guards[None, :] * spread[:, None]
    # a fitted line must stay within the guards' reach below kth (and below kth itself)
    fitted = torch.minimum(torch.maximum(fitted, wide[:, 2:3]), kd[:, None])
    out = torch.where(usable[:, None], fitted, wide)
    out = torch.where(torch.isfinite(kd)[:, None], out, torch.full_like(out, float("inf")))
    out = torch.where(valid.bool()[:, None], out, torch.full_like(out, float("inf")))
    return out.float()


class RequestState:
    """request id -> state slot map plus the per-slot device state."""

    def __init__(self, max_requests: int, k: int, device) -> None:
        self.k, self.max_requests = k, max_requests
        dev = torch.device(device)
        self.valid = torch.zeros(max_requests, dtype=torch.int32, device=dev)
        self.kth = torch.zeros(max_requests, device=dev)
        self.top = torch.zeros(max_requests, device=dev)
        self.lines = torch.full((max_requests, 3), float("inf"), device=dev)
        self.counts = torch.zeros(max_requests, 3, dtype=torch.int32, device=dev)
        self.prev = torch.full((max_requests, k), -1, dtype=torch.int32, device=dev)
        self._slot: dict[object, int] = {}
        self._warm: set[int] = set()
        self._free = list(range(max_requests - 1, -1, -1))

    def __contains__(self, request_id) -> bool:
        return request_id in self._slot

    def slots(self, request_ids: Sequence[object]) -> list[int]:
        """State slots of ``request_ids``, giving unknown ids fresh cold slots."""
        if len(set(request_ids)) != len(request_ids):
            raise ValueError("RequestState: request_ids must be distinct within a step")
        out = []
        for rid in request_ids:
            if rid not in self._slot:
                if not self._free:
                    raise RuntimeError(f"RequestState: more than {self.max_requests} live requests")
                s = self._free.pop()
                self._reset(s)
                self._slot[rid] = s
            out.append(self._slot[rid])
        return out

    def warm_count(self, slots: Sequence[int]) -> int:
        """How many of ``slots`` hold a seeded state (host bookkeeping, no device read)."""
        return sum(1 for s in slots if s in self._warm)

    def _reset(self, s: int) -> None:
        self._warm.discard(s)
        self.valid[s] = 0
        self.lines[s] = float("inf")
        self.counts[s] = 0
        self.prev[s] = -1

    def finish(self, request_ids: Sequence[object]) -> None:
        """Forget finished requests; their slots are reset before any reuse."""
        for rid in request_ids:
            s = self._slot.pop(rid, None)
            if s is not None:
                self._reset(s)
                self._free.append(s)

    def update(self, slot_index: torch.Tensor, values, indices, counts=None) -> None:
        """After a selection: values/indices [R, K] of the requests' last token rows,
        ``slot_index`` int64 [R] (device). Places the next lines. Graph-safe."""
        k = self.k
        v = values.float()  # the selection is in index order: its K-th value is its minimum
        kth = torch.where(v.isnan(), torch.full_like(v, float("inf")), v).amin(1)
        top = v.amax(1)  # NaN when the row holds one
        valid = torch.isfinite(kth) & (indices[:, k - 1] >= 0)
        last_lines = self.lines[slot_index]
        last_counts = counts if counts is not None else torch.zeros_like(self.counts[slot_index])
        new_lines = place_lines(last_lines, last_counts, kth, top, k, valid)
        self.valid[slot_index] = valid.to(torch.int32)
        self.kth[slot_index] = kth
        self.top[slot_index] = top
        self.lines[slot_index] = new_lines
        self.counts[slot_index] = last_counts
        self.prev[slot_index] = indices

    def mark_warm(self, slots: Sequence[int]) -> None:
        self._warm.update(slots)
