"""The torch specification of the indexer decode step (float64 over the dequantized cache).

- ``row_lengths``: the per-query-row valid key count. A batch row of ``seq_len`` tokens whose last
  ``next_n`` tokens are being decoded (multi-token prediction) has, for its token ``i`` (0-based),
  ``(seq_len - next_n + i + 1) // compress_ratio`` valid compressed keys (causal, compressed).
- ``indexer_logits``: ``I[t, j] = sum_h w[t, h] * ReLU(q[t, h] . k[j])`` for ``j < len[t]``,
  ``-inf`` beyond, in float64 from the e4m3 query codes, the folded weights and the dequantized
  keys (the fast path's inputs exactly, so only its arithmetic differs).
- ``logits_magnitude``: ``M[t, j] = sum_h |w[t, h]| * sum_d |q[t, h, d] * k[j, d]|``, the scale the
  fast path's faithful bound is stated against.
- ``topk``: the deterministic top-K: the K highest-ranked scores (values descending, NaN above
  +inf, ties at the K-th value by lowest index) listed in ascending index order, ``-1`` indices
  (value ``-inf``) in the ``K - min(K, len)`` padding slots.
"""

from __future__ import annotations

import torch

from flashrt_dsv4_indexer.key_cache import dequantize_fp8, dequantize_pages


def row_lengths(seq_lens: torch.Tensor, next_n: int, compress_ratio: int) -> torch.Tensor:
    """int32 [B * next_n] valid key counts (see the module docstring)."""
    i = torch.arange(next_n, device=seq_lens.device, dtype=torch.int64)
    tok = seq_lens.long()[:, None] - next_n + i[None, :] + 1
    return (tok.clamp(min=0) // compress_ratio).reshape(-1).to(torch.int32)


def indexer_logits(
    q_codes: torch.Tensor,
    weights: torch.Tensor,
    key_codes: torch.Tensor,
    key_scales: torch.Tensor,
    key_format: str,
    block_table: torch.Tensor,
    lengths: torch.Tensor,
    width: int,
    magnitude: bool = False,
):
    """float64 logits [rows, width] (rows = B * next_n), and optionally the magnitude tensor."""
    rows, h, d = q_codes.shape
    b_rows = block_table.shape[0]
    next_n = rows // b_rows
    q = dequantize_fp8(q_codes)  # [rows, H, D]
    w = weights.double()
    lens = [int(x) for x in lengths.tolist()]
    out = torch.full((rows, width), float("-inf"), dtype=torch.float64, device=q_codes.device)
    mag = torch.zeros((rows, width), dtype=torch.float64, device=q_codes.device)
    for b in range(b_rows):
        n_b = max(lens[b * next_n : (b + 1) * next_n], default=0)
        if n_b == 0:
            continue
        k = dequantize_pages(key_codes, key_scales, key_format, block_table[b], n_b)  # [n, D]
        for i in range(next_n):
            t = b * next_n + i
            n = lens[t]
            if n == 0:
                continue
            s = q[t] @ k[:n].T  # [H, n]
            out[t, :n] = (w[t][:, None] * s.clamp(min=0)).sum(0)
            if magnitude:
                mag[t, :n] = (w[t].abs()[:, None] * (q[t].abs() @ k[:n].abs().T)).sum(0)
    return (out, mag) if magnitude else out


def topk(scores: torch.Tensor, k: int, lengths: torch.Tensor | None = None):
    """Deterministic top-K of [B, N] scores over each row's first ``lengths[b]`` entries."""
    b, n = scores.shape
    pos = torch.arange(n, device=scores.device)
    if lengths is None:
        lengths = torch.full((b,), n, dtype=torch.int32, device=scores.device)
    valid = pos[None, :] < lengths.long()[:, None]
    s = scores.float()
    # rank key: NaN first, then descending value; padding after every valid -inf.
    neg = torch.where(valid, -s, torch.full_like(s, float("inf")))
    neg = torch.where(torch.isnan(s) & valid, torch.full_like(s, float("-inf")), neg)
    order = torch.sort(neg, dim=1, stable=True).indices
    kk = min(k, n)
    idx = order[:, :kk]
    live = torch.arange(kk, device=scores.device)[None, :] < lengths.long()[:, None]
    idx = torch.sort(torch.where(live, idx, torch.full_like(idx, n))).values  # index order
    vals = torch.gather(s, 1, idx.clamp(max=max(n - 1, 0)))
    idx = torch.where(live, idx, torch.full_like(idx, -1)).to(torch.int32)
    vals = torch.where(live, vals, torch.full_like(vals, float("-inf")))
    if kk < k:
        pad_i = torch.full((b, k - kk), -1, dtype=torch.int32, device=scores.device)
        pad_v = torch.full((b, k - kk), float("-inf"), device=scores.device)
        idx, vals = torch.cat([idx, pad_i], 1), torch.cat([vals, pad_v], 1)
    return vals, idx


def emissions(logits: torch.Tensor, lengths: torch.Tensor, lines: torch.Tensor, seg_cap: int):
    """What the logits epilogue emits, from fp32 logits [rows, width] (entries past a row's length
    ignored): block maxima per 32 positions (-inf for a block with no valid position), exact
    counts of valid scores >= each of three lines (tightest first), the segment claims (segment 0:
    >= line 0, segment s: in [line s, line s-1)) and, per row and segment, the sorted indices the
    candidate list must hold when the segment did not overflow ``seg_cap``."""
    rows, width = logits.shape
    pos = torch.arange(width, device=logits.device)
    valid = pos[None, :] < lengths.long()[:, None]
    lv = torch.where(valid, logits, torch.full_like(logits, float("-inf")))
    block_max = lv.reshape(rows, width // 32, 32).amax(-1)
    ge = [valid & (logits >= lines[:, c : c + 1]) for c in range(3)]
    counts = torch.stack([g.sum(1) for g in ge], 1).to(torch.int32)
    segs = [ge[0]] + [ge[s] & ~ge[s - 1] for s in (1, 2)]
    claims = torch.stack([m.sum(1) for m in segs], 1).to(torch.int32)
    members = [[m[r].nonzero().flatten() for m in segs] for r in range(rows)]
    return block_max, counts, claims, members
