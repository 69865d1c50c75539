"""The per-row state a top-K call publishes for the next step: a caller-owned int32 buffer.

``state`` is an int32 tensor ``[B, STATE_WORDS]`` (contiguous, on the scores' device) that the
caller allocates once (``new_state``) and passes to every step of the same rows. Each call writes
every word of every row; a call reads it only as a *guess* (the previous K-th value is one more
candidate threshold), so a stale, foreign or garbage state never changes the result, only speed.

Words of a row (keys are ``reference.order_key`` of fp32 values: order-preserving signed int32,
NaN = 2**31 - 1; ``key_to_value`` turns one back into a float):

====  ================  ============================================================================
word  name              meaning
====  ================  ============================================================================
0     VALID             1 when the row was published by a completed call with >= 1 valid element
1     KTH_KEY           exact key of the row's K-th value (of its last valid one when length < K)
2     ACCEPTED_KEY      the lower end of the row's final bracket: every valid score with key >= it
                        was a candidate (-2**31 when the whole row was)
3     ACCEPTED_COUNT    exact number of valid scores with key >= ACCEPTED_KEY (>= min(k, length))
4     N_TRIED           thresholds of the first counting round published below (8, or 0 when the
                        row needed no counting: a short row, or seed lines that admitted it)
5     ROUNDS            counting passes the row needed (1: its first thresholds -- a good hint's
                        -- resolved it; 0: no counting at all)
6     LENGTH            the row's valid length used
7     K                 the k of the call
8+i   TRIED_KEY[i]      i < N_TRIED: the i-th threshold of the first round (or the i-th seed line)
8+MAX_TRIED+i  TRIED_COUNT[i]  exact number of valid scores with key >= TRIED_KEY[i]
====  ================  ============================================================================
"""

from __future__ import annotations

import struct

import torch

MAX_TRIED = 8
VALID, KTH_KEY, ACCEPTED_KEY, ACCEPTED_COUNT, N_TRIED, ROUNDS, LENGTH, K = range(8)
TRIED_KEY = 8
TRIED_COUNT = 8 + MAX_TRIED
STATE_WORDS = 8 + 2 * MAX_TRIED


def new_state(batch: int, device: torch.device | str = "cuda") -> torch.Tensor:
    """A fresh (invalid) state buffer for ``batch`` rows."""
    return torch.zeros((batch, STATE_WORDS), dtype=torch.int32, device=device)


def key_to_value(key: int) -> float:
    """The fp32 value of an order key (host-side helper for inspection and tests)."""
    bits = key if key >= 0 else key ^ 0x7FFFFFFF
    return struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]
