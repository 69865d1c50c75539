"""M-RoPE positions of a token sequence (HF's get_rope_index for still images)."""

from __future__ import annotations

import torch


def mrope_positions(
    ids: list[int],
    grids: list[tuple[int, int, int]],
    image_token_id: int,
    merge: int,
    start: int = 0,
) -> tuple[torch.Tensor, int]:
    """positions [3, len(ids)] and the next free position. Text tokens carry one value on all
    three axes; the image tokens of grid (t, h, w) get (s + t_i, s + row, s + col) over the
    merged grid, and the text after an image restarts at s + max(h, w) / merge."""
    out = torch.empty(3, len(ids), dtype=torch.long)
    pos, i, g = start, 0, 0
    n = len(ids)
    while i < n:
        if ids[i] != image_token_id:
            out[:, i] = pos
            pos += 1
            i += 1
            continue
        t, h, w = grids[g]
        g += 1
        gh, gw = h // merge, w // merge
        count = t * gh * gw
        tt = torch.arange(t).view(t, 1, 1).expand(t, gh, gw).reshape(-1)
        hh = torch.arange(gh).view(1, gh, 1).expand(t, gh, gw).reshape(-1)
        ww = torch.arange(gw).view(1, 1, gw).expand(t, gh, gw).reshape(-1)
        out[:, i : i + count] = torch.stack([tt, hh, ww]) + pos
        pos += max(gh, gw)
        i += count
    if g != len(grids):
        raise ValueError(f"mrope_positions: {len(grids)} grids for {g} image spans")
    return out, pos
