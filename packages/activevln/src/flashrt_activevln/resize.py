"""A bit-exact torch port of Pillow's 8-bit bicubic resize, then the Qwen2-VL rescale/normalize.

Pillow (``Resample.c``) resizes in two separable passes, each with
fixed-point coefficients: the bicubic filter (a = -0.5, support 2 scaled by the downscale factor),
normalized to sum 1 in double, rounded half away from zero to 22 fractional bits; each output is
``clip8((1 << 21) + sum(pixel * coeff)) >> 22``, the intermediate image held as uint8. Pillow 13
runs the vertical pass first when it shrinks the height by more than twice what the horizontal
pass removes from the width (``in_h - out_h > max(0, 2 * (in_w - out_w))``), else horizontal
first; the order changes the bytes, so it is reproduced here. The same
integer arithmetic here gives the same bytes on any device. Coefficient tables depend only on the
sizes and are cached.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch

PRECISION_BITS = 22
OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def _bicubic(x: float) -> float:
    a = -0.5
    x = abs(x)
    if x < 1.0:
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1
    if x < 2.0:
        return (((x - 5) * x + 8) * x - 4) * a
    return 0.0


@lru_cache(maxsize=64)
def _coeffs(
    in_size: int, out_size: int
) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...], int]:
    """Per output pixel: first input index, fixed-point weights; and the table width."""
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support = 2.0 * filterscale
    ksize = int(math.ceil(support)) * 2 + 1
    starts, weights = [], []
    for xx in range(out_size):
        center = (xx + 0.5) * scale
        ss = 1.0 / filterscale
        xmin = max(int(center - support + 0.5), 0)
        xmax = min(int(center + support + 0.5), in_size) - xmin
        k = [_bicubic((x + xmin - center + 0.5) * ss) for x in range(xmax)]
        ww = sum_in_order(k)
        if ww != 0.0:
            k = [v / ww for v in k]
        fixed = [
            int(-0.5 + v * (1 << PRECISION_BITS)) if v < 0 else int(0.5 + v * (1 << PRECISION_BITS))
            for v in k
        ]
        starts.append(xmin)
        weights.append(tuple(fixed + [0] * (ksize - len(fixed))))
    return tuple(starts), tuple(weights), ksize


def sum_in_order(values: list[float]) -> float:
    """Left-to-right double sum (Pillow's order; math.fsum would round differently)."""
    total = 0.0
    for v in values:
        total += v
    return total


@lru_cache(maxsize=64)
def _tables(in_size: int, out_size: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    starts, weights, ksize = _coeffs(in_size, out_size)
    idx = torch.tensor(starts)[:, None] + torch.arange(ksize)
    w = torch.tensor(weights, dtype=torch.int64)
    idx = idx.clamp(max=in_size - 1)  # padded taps carry weight 0
    return idx.to(device), w.to(device)


def _pass(x: torch.Tensor, out_size: int, dim: int) -> torch.Tensor:
    """One Pillow pass along ``dim`` (-1: width, -2: height) of a uint8 tensor."""
    in_size = x.shape[dim]
    if in_size == out_size:
        return x
    idx, w = _tables(in_size, out_size, str(x.device))
    if dim == -2:
        x = x.transpose(-1, -2)
    taps = x[..., idx].to(torch.int64)  # [..., out, ksize]
    acc = (taps * w).sum(-1) + (1 << (PRECISION_BITS - 1))
    y = (acc >> PRECISION_BITS).clamp(0, 255).to(torch.uint8)
    return y.transpose(-1, -2) if dim == -2 else y


def pillow_bicubic_resize(frames: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """uint8 [..., C, H, W] -> uint8 [..., C, height, width], byte-identical to Pillow's
    ``Image.resize((width, height), BICUBIC)`` (Pillow 13) on each image."""
    if frames.dtype != torch.uint8:
        raise TypeError(f"pillow_bicubic_resize: frames must be uint8, got {frames.dtype}")
    if vertical_first(frames.shape[-2], frames.shape[-1], height, width):
        return _pass(_pass(frames, height, -2), width, -1)
    return _pass(_pass(frames, width, -1), height, -2)


def vertical_first(in_h: int, in_w: int, out_h: int, out_w: int) -> bool:
    dh = in_h - out_h
    return dh > 0 and dh > 2 * (in_w - out_w)


def rescale_normalize(
    frames: torch.Tensor, mean=OPENAI_CLIP_MEAN, std=OPENAI_CLIP_STD
) -> torch.Tensor:
    """uint8 [..., C, H, W] -> float32: float64 multiply by 1/255, cast to float32, then
    ``(x - mean) / std`` in float32 per channel (the slow processor's order)."""
    x = (frames.to(torch.float64) * (1 / 255)).to(torch.float32)
    m, s = _channel_constants(tuple(mean), tuple(std), str(x.device))
    return (x - m) / s


@lru_cache(maxsize=16)
def _channel_constants(mean: tuple, std: tuple, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 [C, 1, 1] mean and std on ``device``, uploaded once."""
    m = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1).to(device)
    s = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1).to(device)
    return m, s
