"""Frames loaded ahead of the step that needs them.

A replay knows which frame every row needs next: the next frame of its own episode, or the first
frame of the next waiting episode. ``FrameFeed`` loads those on worker threads while the GPU runs
the current step, so that the step itself only takes a ready frame: an image file is decoded
there (Pillow), and with ``pinned`` the frame is copied there into page-locked host memory, so
the step's upload is a non-blocking copy instead of a blocking one from pageable memory. With
``prepare`` (the CPU preprocessing path) the worker also runs the processor on the frame.

The frames are the same bytes ``load_frame`` gives; only where and when they are loaded
changes. Worker errors (a missing or unreadable file) are raised by ``take``.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch


def load_frame(frame) -> np.ndarray:
    """A frame (a uint8 H x W x 3 array, or an image file's path) as a uint8 array."""
    if isinstance(frame, np.ndarray):
        return frame
    from PIL import Image

    with Image.open(frame) as im:
        return np.array(im.convert("RGB"))


def pinned_copy(frame: np.ndarray) -> torch.Tensor:
    """The frame's bytes in a page-locked host tensor of its shape (non-blocking uploads)."""
    out = torch.empty(frame.shape, dtype=torch.uint8, pin_memory=True)
    np.copyto(out.numpy(), frame, casting="no")
    return out


@dataclass
class Loaded:
    """A loaded frame: its size and ``data``, the uint8 array (a pinned tensor with ``pinned``)
    or what ``prepare`` made of it."""

    height: int
    width: int
    data: object


class FrameFeed:
    """``want(episode, index)`` starts loading a frame (once; an index past the episode is
    ignored), ``take(episode, index)`` returns it (waiting for it, or loading it then if it was
    never wanted) and forgets it. Use as a context manager: leaving it stops the workers and
    drops the frames not taken."""

    def __init__(self, pinned: bool = False, prepare: Callable | None = None, workers: int = 2):
        self.pinned, self.prepare = pinned, prepare
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="flashrt-frames")
        self._loads: dict[tuple[int, int], Future] = {}

    def _load(self, source):
        frame = load_frame(source)
        if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
            raise ValueError(
                f"a frame must be uint8 H x W x 3, got {frame.dtype} {list(frame.shape)}"
            )
        h, w = frame.shape[:2]
        if self.prepare is not None:
            return Loaded(h, w, self.prepare(frame))
        return Loaded(h, w, pinned_copy(frame) if self.pinned else frame)

    def want(self, episode, index: int) -> None:
        key = (id(episode), index)
        if index < len(episode.frames) and key not in self._loads:
            self._loads[key] = self._pool.submit(self._load, episode.frames[index])

    def take(self, episode, index: int) -> Loaded:
        self.want(episode, index)
        return self._loads.pop((id(episode), index)).result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._loads.clear()

    def __enter__(self) -> FrameFeed:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
