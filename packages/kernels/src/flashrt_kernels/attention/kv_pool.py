"""A KV pool for many rows of different live lengths.

Layout (contiguous per row): for every layer, keys and values are ``[rows + 1, capacity, kv_heads,
head_dim]``; a row's tokens sit at positions ``0 .. length - 1`` of its own slab, so attention reads
one contiguous range per (row, head) and a split of the context is a plain position range. The
extra last row is scratch: writes for padded (not live) tokens are routed there, so every write is
one fixed-shape ``index_copy_`` without a host branch (CUDA-graph safe). Rows are never cleared:
the kernels never read a slot at or past a row's live extent, so stale data (even NaN) is harmless.

Operations (all on device tensors, no host synchronization):
- ``append``: write the new tokens of a turn (decode step, tree nodes or a prefill chunk) at
  ``lengths[b] + i``; only those tokens are copied, never the history.
- ``commit``: after tree verification, move the accepted nodes from their verify slots
  (``lengths[b] + node``) to their final consecutive positions (``lengths[b] + i``) and advance the
  row's length by the accepted count.
- ``acquire`` / ``release``: host-side free list of rows; a released row is handed to a new
  sequence with length 0 (its old tokens stay in place and are never read).

The length bookkeeping is the caller's: ``lengths`` is an int32 device tensor the caller owns
(one entry per pool row) and advances with ``advance``; the ops take the per-row lengths of the
rows in the batch as a tensor, so a batch can be any subset of rows in any order.
"""

from __future__ import annotations

import torch

from flashrt_kernels.checks import check_int, check_tensor

OP = "KVPool"
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


class KVPool:
    """Per-layer K/V storage: ``k[layer]`` / ``v[layer]`` are ``[rows + 1, capacity, Hkv, d]``."""

    def __init__(
        self,
        layers: int,
        rows: int,
        capacity: int,
        kv_heads: int,
        head_dim: int,
        *,
        dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str = "cpu",
    ) -> None:
        for name, value in (
            ("layers", layers),
            ("rows", rows),
            ("capacity", capacity),
            ("kv_heads", kv_heads),
            ("head_dim", head_dim),
        ):
            check_int(OP, name, value, low=1)
        if dtype not in DTYPES:
            raise TypeError(f"{OP}: dtype must be one of {DTYPES}, got {dtype}")
        self.rows, self.capacity = rows, capacity
        shape = (layers, rows + 1, capacity, kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.lengths = torch.zeros(rows, dtype=torch.int32, device=device)
        self._free = list(range(rows))

    @property
    def scratch_row(self) -> int:
        return self.rows

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(k, v)`` of layer ``i``: the caches the attention ops read."""
        return self.k[i], self.v[i]

    def acquire(self) -> int:
        """A free row (host bookkeeping) with length 0."""
        if not self._free:
            raise RuntimeError(f"{OP}: all {self.rows} rows are in use")
        row = self._free.pop(0)
        self.lengths[row] = 0
        return row

    def release(self, row: int) -> None:
        check_int(OP, "row", row, low=0, high=self.rows - 1)
        if row in self._free:
            raise ValueError(f"{OP}: row {row} is already free")
        self._free.append(row)

    def _slots(self, rows: torch.Tensor, positions: torch.Tensor, live: torch.Tensor):
        """Flat slot index ``row * capacity + position``; dead entries go to scratch slots."""
        scratch = self.rows * self.capacity + torch.arange(
            positions.shape[-1], device=positions.device
        ).remainder(self.capacity)
        flat = rows.long()[:, None] * self.capacity + positions.long()
        return torch.where(live, flat, scratch).reshape(-1)

    def append(
        self,
        layer: int,
        rows: torch.Tensor,
        k_new: torch.Tensor,
        v_new: torch.Tensor,
        counts: torch.Tensor,
    ) -> None:
        """Write ``k_new`` / ``v_new`` ``[B, n, Hkv, d]``: token ``i < counts[b]`` of batch row
        ``b`` goes to position ``lengths[rows[b]] + i`` of pool row ``rows[b]``. Lengths are not
        advanced (tree nodes are committed later; call ``advance`` for plain tokens)."""
        kc = self.k[layer]
        check_tensor(OP, "k_new", k_new, dtypes=(kc.dtype,), ndim=4, device=kc.device)
        check_tensor(OP, "v_new", v_new, dtypes=(kc.dtype,), shape=list(k_new.shape))
        bsz, n = k_new.shape[:2]
        check_tensor(OP, "rows", rows, dtypes=(torch.int32, torch.int64), shape=[bsz])
        check_tensor(OP, "counts", counts, dtypes=(torch.int32, torch.int64), shape=[bsz])
        i = torch.arange(n, device=kc.device)[None, :]
        start = self.lengths[rows.long()].long()[:, None]
        live = (i < counts.long()[:, None]) & (start + i < self.capacity)
        slots = self._slots(rows, start + i, live)
        self._write(layer, slots, k_new.reshape(bsz * n, *k_new.shape[2:]), v_new)

    def _write(self, layer, slots, k_flat, v_new):
        kf = self.k[layer].view(-1, *self.k.shape[-2:])
        vf = self.v[layer].view(-1, *self.v.shape[-2:])
        kf.index_copy_(0, slots, k_flat)
        vf.index_copy_(0, slots, v_new.reshape(k_flat.shape))

    def append_packed(
        self, layer: int, rows: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
        token_row: torch.Tensor, token_index: torch.Tensor,
    ) -> None:  # fmt: skip
        """Packed variant: ``k_new`` ``[T, Hkv, d]``; token ``t`` belongs to batch row
        ``token_row[t]`` (``-1``: padding, written to scratch) at new-token index
        ``token_index[t]``."""
        kc = self.k[layer]
        check_tensor(OP, "k_new", k_new, dtypes=(kc.dtype,), ndim=3, device=kc.device)
        check_tensor(OP, "v_new", v_new, dtypes=(kc.dtype,), shape=list(k_new.shape))
        live = token_row >= 0
        prow = rows.long()[token_row.long().clamp_min(0)]
        pos = self.lengths[prow].long() + token_index.long()
        live = live & (pos < self.capacity)
        slots = self._slots(prow[None], pos[None], live[None])
        self._write(layer, slots, k_new, v_new)

    def commit(
        self, layer: int, rows: torch.Tensor, accepted: torch.Tensor, counts: torch.Tensor
    ) -> None:
        """Move accepted tree nodes to their final positions: for ``i < counts[b]``, node
        ``accepted[b, i]`` (its verify slot ``lengths + accepted[b, i]``) goes to ``lengths + i``.
        The accepted nodes are gathered before anything is written, so the moves may overlap.
        Lengths are not advanced here (once per step for all layers: ``advance``)."""
        bsz, n = accepted.shape
        check_tensor(OP, "rows", rows, dtypes=(torch.int32, torch.int64), shape=[bsz])
        check_tensor(OP, "counts", counts, dtypes=(torch.int32, torch.int64), shape=[bsz])
        start = self.lengths[rows.long()].long()[:, None]
        i = torch.arange(n, device=accepted.device)[None, :]
        live = i < counts.long()[:, None]
        src = self._slots(rows, start + accepted.long().clamp_min(0), live)
        dst = self._slots(rows, start + i, live)
        kf = self.k[layer].view(-1, *self.k.shape[-2:])
        vf = self.v[layer].view(-1, *self.v.shape[-2:])
        kf.index_copy_(0, dst, kf.index_select(0, src))
        vf.index_copy_(0, dst, vf.index_select(0, src))

    def advance(self, rows: torch.Tensor, counts: torch.Tensor) -> None:
        """``lengths[rows[b]] += counts[b]`` (on device)."""
        self.lengths.index_add_(0, rows.long(), counts.to(torch.int32))
