"""Pillow's bicubic resize and the Qwen2-VL rescale / normalize in two Triton launches.

The torch port (``resize.py``) multiplies every tap in int64 and reduces over the filter width,
which moves ~40 MB a pass at 4 frames of 640x480 (13% of the vision tower's time on an H100,
2026-12-07). Here each program computes a block of output pixels of one pass directly: the
``ksize`` taps of each pixel gathered as uint8, times the pass's fixed-point weights, summed in
int32 (as Pillow sums them: ``|weights|`` sum to about 1.2 x 2^22, so 255 times that stays below
2^31), then ``(sum + 2^21) >> 22`` clipped to 0..255. Integer sums do not depend on their order,
so the bytes are the torch port's (and Pillow's) on any device. The second pass writes float32
through a 256-entry table per channel made by ``resize.rescale_normalize`` itself, so the
normalization's bits are that function's. Contract: exact (the same bytes / float32 bits as
``resize.pillow_bicubic_resize`` + ``resize.rescale_normalize``).
"""

from __future__ import annotations

from functools import lru_cache

import torch
import triton
import triton.language as tl

from flashrt_activevln.resize import (
    OPENAI_CLIP_MEAN,
    OPENAI_CLIP_STD,
    PRECISION_BITS,
    _coeffs,
    rescale_normalize,
    vertical_first,
)

BLOCK = 256


@triton.jit
def _resample_kernel(
    Src, Dst, Starts, Weights, Table,
    C, H, W, OUT_H, OUT_W,
    s_n, s_c, s_h, s_w,
    KSIZE: tl.constexpr, KPAD: tl.constexpr, ALONG_W: tl.constexpr, TABLE: tl.constexpr,
    PREC: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Output pixels ``[N, C, OUT_H, OUT_W]`` (contiguous) of one pass over ``Src`` ``[N, C, H, W]``
    (uint8, any strides), along the width (``ALONG_W``) or the height; ``TABLE``: store
    ``Table[c, byte]`` (float32) instead of the byte."""
    n = tl.program_id(1).to(tl.int64)
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # the pixel within image n
    ok = i < C * OUT_H * OUT_W
    c = i // (OUT_H * OUT_W)
    y = (i // OUT_W) % OUT_H
    x = i % OUT_W
    if ALONG_W:
        o = x
        base = n * s_n + c * s_c + y * s_h
        step = s_w
        last = W - 1
    else:
        o = y
        base = n * s_n + c * s_c + x * s_w
        step = s_h
        last = H - 1
    k = tl.arange(0, KPAD)
    k_ok = k < KSIZE
    start = tl.load(Starts + o, mask=ok, other=0)
    pos = tl.minimum(start[:, None] + k[None, :], last)  # padded taps weigh 0
    taps = tl.load(Src + base[:, None] + pos.to(tl.int64) * step, mask=ok[:, None] & k_ok[None, :],
                   other=0)  # fmt: skip
    w = tl.load(Weights + o[:, None] * KSIZE + k[None, :], mask=ok[:, None] & k_ok[None, :],
                other=0)  # fmt: skip
    acc = tl.sum(taps.to(tl.int32) * w, axis=1) + (1 << (PREC - 1))
    byte = tl.minimum(tl.maximum(acc >> PREC, 0), 255)
    if TABLE:
        out = tl.load(Table + c * 256 + byte, mask=ok, other=0.0)
    else:
        out = byte.to(tl.uint8)
    tl.store(Dst + n * C * OUT_H * OUT_W + i, out, mask=ok)


@lru_cache(maxsize=64)
def _pass_tables(
    in_size: int, out_size: int, device: str
) -> tuple[torch.Tensor, torch.Tensor, int]:
    starts, weights, ksize = _coeffs(in_size, out_size)
    s = torch.tensor(starts, dtype=torch.int32, device=device)
    w = torch.tensor(weights, dtype=torch.int32, device=device).reshape(-1)
    return s, w, ksize


@lru_cache(maxsize=8)
def _normalize_table(device: str) -> torch.Tensor:
    """float32 [3, 256]: ``rescale_normalize`` of every byte value, per channel."""
    byte = torch.arange(256, dtype=torch.uint8).view(1, 1, 256).expand(3, 1, 256)
    return rescale_normalize(byte, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD).reshape(3, 256).to(device)


def _launch(src: torch.Tensor, out_h: int, out_w: int, along_w: bool, table: bool) -> torch.Tensor:
    n, c, h, w = src.shape
    size_in, size_out = (w, out_w) if along_w else (h, out_h)
    starts, weights, ksize = _pass_tables(size_in, size_out, str(src.device))
    dtype = torch.float32 if table else torch.uint8
    dst = torch.empty(n, c, out_h, out_w, dtype=dtype, device=src.device)
    norm = _normalize_table(str(src.device)) if table else dst
    grid = (triton.cdiv(c * out_h * out_w, BLOCK), n)
    _resample_kernel[grid](
        src, dst, starts, weights, norm, c, h, w, out_h, out_w, *src.stride(),
        KSIZE=ksize, KPAD=triton.next_power_of_2(ksize), ALONG_W=along_w, TABLE=table,
        PREC=PRECISION_BITS, BLOCK=BLOCK, num_warps=4, enable_fp_fusion=False,
    )  # fmt: skip
    return dst


def resize_normalize(frames: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """uint8 ``[N, 3, H, W]`` (any strides) -> float32 ``[N, 3, height, width]``: the bits of
    ``rescale_normalize(pillow_bicubic_resize(frames, height, width))``, in two launches (one
    where a side keeps its size)."""
    if frames.dtype != torch.uint8 or frames.dim() != 4 or frames.shape[1] != 3:
        raise ValueError(f"resize_normalize: frames must be uint8 [N, 3, H, W], got "
                         f"{frames.dtype} {list(frames.shape)}")  # fmt: skip
    _, _, h, w = frames.shape
    order = ("h", "w") if vertical_first(h, w, height, width) else ("w", "h")
    steps, cur_h, cur_w = [], h, w  # (out_h, out_w, along the width)
    for axis in order:
        if axis == "w" and width != cur_w:
            steps.append((cur_h, width, True))
            cur_w = width
        if axis == "h" and height != cur_h:
            steps.append((height, cur_w, False))
            cur_h = height
    if not steps:  # already the target size: the table alone
        table = _normalize_table(str(frames.device))
        return table[torch.arange(3, device=frames.device)[:, None, None], frames.long()]
    x = frames
    for i, (out_h, out_w, along_w) in enumerate(steps):
        x = _launch(x, out_h, out_w, along_w, table=i == len(steps) - 1)
    return x
