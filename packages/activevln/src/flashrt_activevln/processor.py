"""The ActiveVLN processor: prompt template (R2R / RxR), tokenization, smart_resize and image
preprocessing into the vision tower's ``pixel_values``.

Two image paths with the same bytes out:
- ``preprocess_cpu``: Pillow + numpy, the exact steps of transformers' slow (PIL)
  Qwen2VLImageProcessor (bicubic resize, float64 rescale, float32 normalize, patchify);
- ``gpu_preprocess`` / ``gpu_preprocess_batch``: the same pipeline as torch integer / float ops
  on any device (see ``resize.py``; on a CUDA device two Triton launches with the same bits,
  ``resize_kernel.py``), one frame or a batch of frames of one size at a time; bit-identical to
  the CPU path.
Per turn, token ids and relative M-RoPE positions are cached by (first turn?, instruction,
frame size), so a cached turn costs no tokenization.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from flashrt_activevln.config import ModelConfig
from flashrt_activevln.model.positions import mrope_positions
from flashrt_activevln.resize import (
    OPENAI_CLIP_MEAN,
    OPENAI_CLIP_STD,
    pillow_bicubic_resize,
    rescale_normalize,
)
from flashrt_activevln.resize_kernel import resize_normalize

MIN_PIXELS = 1024
MAX_PIXELS = 76800
SYSTEM = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
FIRST_PREFIX = "[Initial Observation]:"
NEXT_PREFIX = "After that, the observation is:"
TASK = (
    "Instruction: {instruction}Decide your next action. You can take up to 3 actions at a time, "
    "separated by ','. "
)
IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"


def smart_resize(
    height: int,
    width: int,
    factor: int = 28,
    min_pixels: int = MIN_PIXELS,
    max_pixels: int = MAX_PIXELS,
) -> tuple[int, int]:
    """Sides rounded to multiples of ``factor`` with the area kept in [min_pixels, max_pixels]."""
    if min(height, width) <= 0 or max(height, width) / min(height, width) > 200:
        raise ValueError(f"smart_resize: bad frame size {height}x{width}")
    h = round(height / factor) * factor
    w = round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def user_turn_text(instruction: str, first: bool) -> str:
    """One user turn and the assistant header; earlier replies end with <|im_end|>, so later
    turns start with the newline that follows it."""
    head = SYSTEM if first else "\n"
    prefix = FIRST_PREFIX if first else NEXT_PREFIX
    return (
        f"{head}<|im_start|>user\n{prefix}{IMAGE}{TASK.format(instruction=instruction)}"
        "<|im_end|>\n<|im_start|>assistant\n"
    )


@dataclass(frozen=True)
class Turn:
    ids: tuple[int, ...]
    positions: torch.Tensor  # [3, len(ids)] relative to the turn's start position
    span: int  # positions the turn advances
    grid: tuple[int, int, int]


class ActiveVLNProcessor:
    def __init__(
        self,
        tokenizer,
        cfg: ModelConfig,
        min_pixels: int = MIN_PIXELS,
        max_pixels: int = MAX_PIXELS,
    ):
        self.tok = tokenizer
        self.cfg = cfg
        self.min_pixels, self.max_pixels = min_pixels, max_pixels
        self._turns: dict = {}
        v = cfg.vision
        self.factor = v.patch_size * v.spatial_merge_size

    def grid(self, height: int, width: int) -> tuple[int, int, int]:
        h, w = smart_resize(height, width, self.factor, self.min_pixels, self.max_pixels)
        p = self.cfg.vision.patch_size
        return (1, h // p, w // p)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=True)

    def turn(self, instruction: str, first: bool, height: int, width: int) -> Turn:
        key = (instruction, first, height, width)
        hit = self._turns.get(key)
        if hit is not None:
            return hit
        grid = self.grid(height, width)
        n_img = grid[0] * grid[1] * grid[2] // self.cfg.vision.merge_unit
        img = self.cfg.image_token_id
        ids = []
        for t in self.encode(user_turn_text(instruction, first)):
            ids.extend([img] * n_img if t == img else [t])
        pos, span = mrope_positions(ids, [grid], img, self.cfg.vision.spatial_merge_size)
        turn = Turn(tuple(ids), pos, span, grid)
        self._turns[key] = turn
        return turn

    def preprocess_cpu(self, frame: np.ndarray) -> tuple[torch.Tensor, tuple[int, int, int]]:
        """uint8 HxWx3 -> (pixel_values [n, patch_dim] float32, grid): Pillow path."""
        from PIL import Image

        grid = self.grid(frame.shape[0], frame.shape[1])
        p = self.cfg.vision.patch_size
        img = Image.fromarray(np.ascontiguousarray(frame, dtype=np.uint8))
        img = img.resize((grid[2] * p, grid[1] * p), resample=Image.Resampling.BICUBIC)
        x = np.moveaxis(np.array(img), -1, 0)
        x = (x.astype(np.float64) * (1 / 255)).astype(np.float32)
        mean = np.array(OPENAI_CLIP_MEAN, dtype=np.float32)
        std = np.array(OPENAI_CLIP_STD, dtype=np.float32)
        x = ((x.T - mean) / std).T
        return patchify(torch.from_numpy(np.ascontiguousarray(x)), self.cfg), grid

    def gpu_preprocess(self, frame: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int, int]]:
        """uint8 HxWx3 tensor on any device -> the same bytes as ``preprocess_cpu``."""
        return self.gpu_preprocess_batch(frame[None])

    def gpu_preprocess_batch(
        self, frames: torch.Tensor
    ) -> tuple[torch.Tensor, tuple[int, int, int]]:
        """uint8 [n, H, W, 3] (frames of one size) on any device -> (the n frames' pixel_values
        back to back, ``[n * patches, patch_dim]``, the grid of one): each frame's bytes are
        ``preprocess_cpu``'s; one resize / normalize / patchify for all of them."""
        if frames.dim() != 4 or frames.shape[-1] != 3 or frames.dtype != torch.uint8:
            raise ValueError(
                f"gpu_preprocess_batch: frames must be uint8 [n, H, W, 3], got "
                f"{frames.dtype} {list(frames.shape)}"
            )
        grid = self.grid(frames.shape[1], frames.shape[2])
        p = self.cfg.vision.patch_size
        chw = frames.permute(0, 3, 1, 2)
        if chw.is_cuda:  # the same bits in two Triton launches (resize_kernel.py)
            x = resize_normalize(chw, grid[1] * p, grid[2] * p)
        else:
            x = rescale_normalize(pillow_bicubic_resize(chw, grid[1] * p, grid[2] * p))
        return patchify(x, self.cfg), grid


def patchify(x: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """float32 [C, H, W] (or [n, C, H, W]: the frames' patches back to back) -> [patches,
    C * T * P * P] in the processor's order (merged units row-major, 2x2 patches inside, the
    still frame repeated over the temporal patch)."""
    v = cfg.vision
    x = x.reshape(-1, *x.shape[-3:])
    n, c, h, w = x.shape
    p, m, t = v.patch_size, v.spatial_merge_size, v.temporal_patch_size
    gh, gw = h // p, w // p
    x = x.reshape(n, c, gh // m, m, p, gw // m, m, p).permute(0, 2, 5, 3, 6, 1, 4, 7)
    x = x[:, :, :, :, :, :, None].expand(-1, -1, -1, -1, -1, -1, t, -1, -1)
    return x.reshape(n * gh * gw, c * t * p * p)
