"""One launch instead of a partial pass and a reduce pass: the program that arrives last at its
output tile reduces the tile's partials in a fixed order and writes the output (no second launch,
no waiting program). Used by split-K GEMMs (``gemm``) and the split-KV attention tiles
(``attention.gqa_kernels``).

Each output tile owns an int32 ticket. A program stores its partial, then takes a ticket (one
atomic, release / acquire at GPU scope after a block barrier: every thread's store precedes it);
the program that draws ``split - 1`` resets the ticket to zero and reduces, reading the partials
past the L1. Since the order of the additions is fixed whoever arrives last, the bits are those
of a separate reduce launch in that order.

The tickets live in a zeroed buffer per (device, stream), kept zero by the launches themselves,
so a call is CUDA-graph safe once its buffer exists; calls on one stream are ordered, and calls
on different streams use different buffers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_TICKETS: dict[tuple, torch.Tensor] = {}
# Buffers outgrown by a larger call stay allocated: a CUDA graph captured with one still
# holds its address.
_OUTGROWN: list[torch.Tensor] = []
MIN_TICKETS = 1 << 14


def tickets(device: torch.device, count: int) -> torch.Tensor:
    """A zeroed int32 buffer of at least ``count`` tickets for the current stream of ``device``."""
    device = torch.device(device)
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (str(device), stream)
    buf = _TICKETS.get(key)
    if buf is None or buf.numel() < count:
        if buf is not None:
            _OUTGROWN.append(buf)
        buf = torch.zeros(max(count, MIN_TICKETS), dtype=torch.int32, device=device)
        _TICKETS[key] = buf
    return buf


@triton.jit
def arrived_last(T, tile, split):
    """Whether this program is the last of ``split`` to reach ``tile`` (its stores done first);
    the last one leaves the ticket at zero for the next call."""
    tl.debug_barrier()
    last = tl.atomic_add(T + tile, 1, sem="acq_rel") == split - 1
    if last:
        tl.atomic_xchg(T + tile, 0, sem="relaxed")
    return last
