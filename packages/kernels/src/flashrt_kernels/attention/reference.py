"""Torch specification of the attention family (plain torch, fp32 accumulation).

These functions define what the kernels compute; the kernels follow the same math in another
floating-point order (``faithful``, bounds in each kernel module). They are written for clarity,
not speed: the packed ones walk the segments on the host.

Shared conventions:
- K/V caches are ``[rows, capacity, kv_heads, head_dim]`` (one layer of a ``KVPool``); a batch row
  ``b`` reads pool row ``cache_rows[b]`` (``b`` itself when ``cache_rows`` is None).
- A row has ``cache_lens[b]`` committed tokens followed by its ``q_lens[b]`` new tokens, whose keys
  and values are already in the cache at positions ``cache_lens[b] ..`` (append before attend).
  Its live extent is ``cache_lens[b] + q_lens[b]``: nothing at or past it takes part.
- New query ``i`` sees every committed token, and new token ``j`` when ``j <= i`` (causal) or when
  ``tree_mask[b, i, j]`` (tree verification: its ancestors and itself). Bit rows (int64
  ``[B, q_max]``) with ``chain_lens``: ``unpack_tree_mask``.
- Query heads ``h * G .. h * G + G - 1`` share KV head ``h`` (``G = q_heads // kv_heads``).
- A query slot with no live query (``i >= q_lens[b]``), or a query that sees no key, outputs 0.
"""

from __future__ import annotations

import math

import torch


def unpack_tree_mask(bits: torch.Tensor, q_max: int,
                     chain_lens: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """``[B, q_max]`` int64 (bit ``j`` of ``[b, i]`` = node ``i`` sees node ``j``) -> bool
    ``[B, q_max, q_max]``. With ``chain_lens`` [B], row b's first ``c = chain_lens[b]`` tokens
    are a causal chain (query ``i < c`` sees ``j <= i``; its bits are ignored) and bit ``t`` of a
    later query's row is token ``c + t``: query ``i >= c`` sees the whole chain and the tokens
    ``c + t`` (``t < 64``) whose bits are set."""
    j = torch.arange(q_max, device=bits.device, dtype=torch.int64)
    c = torch.zeros(bits.shape[0], 1, 1, dtype=torch.int64, device=bits.device)
    if chain_lens is not None:
        c = chain_lens.to(device=bits.device, dtype=torch.int64)[:, None, None]
    t = j[None, None, :] - c
    seen = ((bits[..., None] >> t.clamp(0, 63)) & 1) != 0
    causal = (t < 0) | (j[None, :, None] < c)
    return torch.where(causal, j[None, None, :] <= j[None, :, None], seen & (t < 64))


def pack_tree_mask(mask: torch.Tensor) -> torch.Tensor:
    """Bool ``[B, q_max, q_max]`` (q_max <= 64) -> int64 ``[B, q_max]`` bit rows."""
    q_max = mask.shape[-1]
    if q_max > 64:
        raise ValueError(f"pack_tree_mask: at most 64 nodes fit in an int64 row, got {q_max}")
    weights = torch.ones(q_max, dtype=torch.int64, device=mask.device) << torch.arange(
        q_max, dtype=torch.int64, device=mask.device
    )
    return (mask.to(torch.int64) * weights).sum(-1)


def _attend(q, k, v, visible, scale):
    """q [H, M, d], k/v [H, N, d] (fp32), visible [M, N] or [H, M, N] -> [H, M, d] fp32."""
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    s = torch.where(visible, s, float("-inf"))
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isinf(m) & (m < 0), torch.zeros_like(m), m)
    p = torch.exp(s - m)
    denom = p.sum(-1, keepdim=True)
    o = torch.matmul(p, v)
    return torch.where(denom > 0, o / torch.where(denom > 0, denom, 1.0), 0.0)


def _decode_args(q, k_cache, cache_rows, tree_mask, scale, chain_lens=None):
    """The arguments both decode references read alike: (query heads per KV head, the scale,
    each batch row's pool row (int64), the tree mask as bool ``[B, q_max, q_max]`` or None)."""
    bsz, q_max, hq, d = q.shape
    g = hq // k_cache.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    rows = torch.arange(bsz, device=q.device) if cache_rows is None else cache_rows.long()
    if tree_mask is not None and tree_mask.dtype == torch.int64:
        tree_mask = unpack_tree_mask(tree_mask, q_max, chain_lens)
    return g, scale, rows, tree_mask


def gqa_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_lens: torch.Tensor,
    q_lens: torch.Tensor,
    *,
    cache_rows: torch.Tensor | None = None,
    tree_mask: torch.Tensor | None = None,
    scale: float | None = None,
    chain_lens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode / tree-verify attention: q ``[B, q_max, Hq, d]`` -> ``[B, q_max, Hq, d]``.

    ``tree_mask`` is bool ``[B, q_max, q_max]`` or bit-packed int64 ``[B, q_max]`` (after each
    row's causal chain of ``chain_lens`` tokens: ``unpack_tree_mask``); None = causal.
    Vectorized with ``torch.where`` so stale (even NaN) slots past the live extent cannot leak.
    """
    bsz, q_max = q.shape[:2]
    cap = k_cache.shape[1]
    g, scale, rows, tree_mask = _decode_args(q, k_cache, cache_rows, tree_mask, scale, chain_lens)
    dev = q.device
    k = k_cache[rows].float().repeat_interleave(g, dim=2)  # [B, cap, Hq, d]
    v = v_cache[rows].float().repeat_interleave(g, dim=2)
    cl = cache_lens.long()[:, None, None]
    ql = q_lens.long()[:, None, None]
    pos = torch.arange(cap, device=dev)[None, None, :]
    qi = torch.arange(q_max, device=dev)[None, :, None]
    j = pos - cl  # index of a new token, negative in the committed prefix
    if tree_mask is None:
        new_ok = j <= qi
    else:
        jc = j.clamp(0, max(q_max - 1, 0)).expand(bsz, q_max, cap)
        new_ok = torch.gather(tree_mask, 2, jc) if q_max else jc.bool()
    visible = (qi < ql) & (pos < cl + ql) & ((j < 0) | new_ok)  # [B, q_max, cap]
    live_pos = (pos < cl + ql).squeeze(1)[..., None, None]  # [B, cap, 1, 1]
    v = torch.where(live_pos, v, 0.0)
    k = torch.where(live_pos, k, 0.0)
    qf = q.float().permute(0, 2, 1, 3)  # [B, Hq, q_max, d]
    o = _attend(qf, k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3), visible[:, None], scale)
    return o.permute(0, 2, 1, 3).to(q.dtype)


def logical_slots(cache_len: int, q_len: int, node: int, tree_row: torch.Tensor | None):
    """Slots of node ``node``'s visible logical key sequence, in logical order: the committed
    ``0 .. cache_len - 1``, then its ancestors among the new nodes in slot order (``tree_row``,
    bool ``[q_max]``; None = causal), itself last."""
    if tree_row is None:
        new = torch.arange(node + 1)
    else:
        new = tree_row[:q_len].cpu().nonzero().flatten()
    return torch.cat([torch.arange(cache_len), cache_len + new])


def gqa_attention_invariant(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_lens: torch.Tensor,
    q_lens: torch.Tensor,
    *,
    cache_rows: torch.Tensor | None = None,
    tree_mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """``gqa_attention`` computed one query at a time over its gathered logical key sequence
    (``logical_slots``), float64: the same function, whose bits depend on nothing but the query
    and that sequence (the ``query_invariant`` contract on the reference backend)."""
    g, scale, rows, tree_mask = _decode_args(q, k_cache, cache_rows, tree_mask, scale)
    rows = rows.tolist()
    out = torch.zeros_like(q)
    for b, (cl, ql) in enumerate(zip(cache_lens.tolist(), q_lens.tolist(), strict=True)):
        for i in range(ql):
            tree_row = None if tree_mask is None else tree_mask[b, i]
            slots = logical_slots(cl, ql, i, tree_row).to(q.device)
            if slots.numel() == 0:
                continue
            k = k_cache[rows[b], slots].double().repeat_interleave(g, dim=1).transpose(0, 1)
            v = v_cache[rows[b], slots].double().repeat_interleave(g, dim=1).transpose(0, 1)
            s = torch.einsum("hd,hnd->hn", q[b, i].double(), k) * scale
            p = torch.softmax(s, dim=-1)
            out[b, i] = torch.einsum("hn,hnd->hd", p, v).to(q.dtype)
    return out


def packed_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cu_seqlens: torch.Tensor,
    cache_lens: torch.Tensor,
    *,
    cache_rows: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Packed varlen prefill: q ``[T, Hq, d]`` holds row ``b``'s new tokens at
    ``cu_seqlens[b] .. cu_seqlens[b + 1]``; each attends to its row's ``cache_lens[b]`` committed
    tokens and causally to the row's new tokens (already appended to the cache)."""
    cu = cu_seqlens.tolist()
    out = torch.zeros_like(q)
    for b in range(len(cu) - 1):
        n = cu[b + 1] - cu[b]
        if n == 0:
            continue
        qb = q[cu[b] : cu[b + 1]][None]
        row = None if cache_rows is None else cache_rows[b : b + 1]
        kc = k_cache if row is not None else k_cache[b : b + 1]
        vc = v_cache if row is not None else v_cache[b : b + 1]
        ql = torch.full((1,), n, dtype=torch.int32, device=q.device)
        out[cu[b] : cu[b + 1]] = gqa_attention(
            qb, kc, vc, cache_lens[b : b + 1], ql, cache_rows=row, scale=scale
        )[0]
    return out


def segmented_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    scale: float | None = None,
) -> torch.Tensor:
    """Non-causal attention inside each packed segment: q ``[T, Hq, d]``, k/v ``[T, Hkv, d]``;
    segment ``s`` is tokens ``cu_seqlens[s] .. cu_seqlens[s + 1]``. Tokens outside every segment
    output 0."""
    hq, d = q.shape[1], q.shape[2]
    g = hq // k.shape[1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    cu = cu_seqlens.tolist()
    out = torch.zeros_like(q)
    for s in range(len(cu) - 1):
        a, b = cu[s], cu[s + 1]
        if b <= a:
            continue
        qs = q[a:b].float().transpose(0, 1)
        ks = k[a:b].float().repeat_interleave(g, dim=1).transpose(0, 1)
        vs = v[a:b].float().repeat_interleave(g, dim=1).transpose(0, 1)
        visible = torch.ones(b - a, b - a, dtype=torch.bool, device=q.device)
        out[a:b] = _attend(qs, ks, vs, visible, scale).transpose(0, 1).to(q.dtype)
    return out


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rope_qk(q, k, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
    """Specification of ``rope_qk``: q [N, Hq, D] and k [N, Hk, D] rotated in fp32 by cos / sin
    [N, D], ``x.float() * cos + rotate_half(x.float()) * sin``, cast back to the dtype."""
    c, s = cos.float()[:, None], sin.float()[:, None]

    def rotate(x):
        xf = x.float()
        return (xf * c + rotate_half(xf) * s).to(x.dtype).contiguous()

    return rotate(q), rotate(k)


def rope_append(q, k, v, cos, sin, k_cache, v_cache, rows, slots, q_out, q_index, biases=None):
    """Specification of ``rope_append`` (in the tensors' dtype, torch's roundings): with
    ``biases`` each of q, k, v gets its bias added first; q and k [T, heads * D] are rotated,
    ``x * cos + rotate_half(x) * sin`` per head; the rotated q of token t goes to
    ``q_out[q_index[t]]``, its k and v to ``k_cache / v_cache[rows[t], slots[t]]``."""
    t, d = cos.shape
    if biases is not None:
        q, k, v = (x + b for x, b in zip((q, k, v), biases, strict=True))
    c, s = cos[:, None], sin[:, None]

    def rotate(x):
        x = x.reshape(t, x.shape[1] // d, d)
        return x * c + rotate_half(x) * s

    rows, slots = rows.long(), slots.long()
    q_out[q_index.long()] = rotate(q)
    k_cache[rows, slots] = rotate(k)
    v_cache[rows, slots] = v.reshape(t, v.shape[1] // d, d)
