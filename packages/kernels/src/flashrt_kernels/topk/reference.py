"""Torch specification of the deterministic top-K (the order every backend reproduces bit for bit).

Selection of row ``b`` (over its valid prefix ``scores[b, :lengths[b]]``): the ``k`` elements that
rank highest, where values rank descending, NaN above +inf (as ``torch.topk`` ranks it), +inf
above every finite value, -inf lowest, ``-0.0`` equal to ``+0.0``, and among equal values (ties,
including all NaNs of a row, whatever their payload) the lower index ranks higher -- so the ties
kept at the K-th value are the lowest-indexed ones.

Order of the output: the selected elements in ascending index order (what a sparse-attention
gather wants, and what the kernels produce without sorting); ``sort_by_rank`` reorders a result
by rank (values descending, ties by index) when a sorted list is wanted. The values are the
input's own elements (their bits: a NaN payload or a ``-0.0`` survives). A row with fewer than
``k`` valid elements returns all of them, then pads with index ``-1`` and value ``-inf``
(``PAD_INDEX`` / ``PAD_VALUE``).

The rank is a total order on a 64-bit composite: the order-preserving signed 32-bit key of the
fp32 value (bf16 / fp16 are widened exactly) in the high word, ``2**32 - 1 - index`` in the low
word. ``order_key`` is that key; every kernel ranks by the same key.
"""

from __future__ import annotations

import torch

PAD_INDEX = -1
PAD_VALUE = float("-inf")
INT32_MAX = 2**31 - 1


def order_key(scores: torch.Tensor) -> torch.Tensor:
    """int32 key with ``key(a) < key(b)`` iff ``a`` ranks below ``b`` (NaN highest, -0.0 == 0.0)."""
    f = scores.float()
    bits = f.view(torch.int32)
    key = torch.where(bits < 0, bits ^ INT32_MAX, bits)
    key = torch.where(key == -1, torch.zeros_like(key), key)  # -0.0 -> +0.0
    return torch.where(torch.isnan(f), torch.full_like(key, INT32_MAX), key)


def composite_key(scores: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """int64 rank of every element (unique per row); positions past a row's length are int64 min."""
    b, n = scores.shape
    idx = torch.arange(n, device=scores.device, dtype=torch.int64)
    comp = (order_key(scores).long() << 32) | (0xFFFFFFFF - idx)[None, :]
    if lengths is not None:
        valid = idx[None, :] < lengths.long()[:, None]
        comp = torch.where(valid, comp, torch.full_like(comp, -(2**63)))
    return comp


def topk(
    scores: torch.Tensor, k: int, lengths: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(values [B, k] scores.dtype, indices [B, k] int32): the selection in ascending index order."""
    b, n = scores.shape
    comp = composite_key(scores, lengths)
    kk = min(k, n)
    top = torch.sort(comp, dim=1, descending=True).values[:, :kk]
    idx = 0xFFFFFFFF - (top & 0xFFFFFFFF)
    lens = torch.full((b,), n, device=scores.device) if lengths is None else lengths.long()
    live = torch.arange(kk, device=scores.device)[None, :] < lens.clamp(max=n)[:, None]
    idx = torch.where(live, idx, torch.full_like(idx, 2**40))  # pads sort last
    idx = torch.sort(idx, dim=1).values
    live = idx < 2**40
    safe = torch.where(live, idx, torch.zeros_like(idx))
    # values move as raw bits (torch's CPU gather of bfloat16 rewrites NaN payloads)
    bits = torch.int32 if scores.dtype == torch.float32 else torch.int16
    pad = torch.tensor(PAD_VALUE, dtype=scores.dtype).view(bits).item()
    raw = torch.gather(scores.view(bits), 1, safe) if n else scores.view(bits).new_empty((b, 0))
    raw = torch.where(live, raw, torch.full_like(raw, pad))
    idx = torch.where(live, idx, torch.full_like(idx, PAD_INDEX)).to(torch.int32)
    if kk < k:
        raw = torch.cat([raw, raw.new_full((b, k - kk), pad)], 1)
        idx = torch.cat([idx, idx.new_full((b, k - kk), PAD_INDEX)], 1)
    return raw.view(scores.dtype), idx


def sort_by_rank(values: torch.Tensor, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A selection reordered by rank: values descending, ties by ascending index, pads last."""
    comp = (order_key(values).long() << 32) | (0xFFFFFFFF - indices.long().clamp(min=0))
    comp = torch.where(indices >= 0, comp, torch.full_like(comp, -(2**63)))
    order = torch.sort(comp, dim=1, descending=True).indices
    bits = torch.int32 if values.dtype == torch.float32 else torch.int16
    raw = torch.gather(values.view(bits), 1, order)  # raw bits: NaN payloads survive
    return raw.view(values.dtype), torch.gather(indices, 1, order)
