"""One host-to-device upload per engine step.

A step's small inputs (token ids, positions, KV lengths, query lengths, the visibility mask, the
image-slot mask) are built on the host. ``Staging.upload`` packs their bytes back to back into
one reused pinned buffer, copies it to the device with a single non-blocking transfer into one
reused device buffer, and returns device views of the same shapes and dtypes. The host buffer is
not rewritten until the previous transfer has completed (an event, waited for only when a new
upload is asked for), so the upload never races the copy in flight. On a CPU device the tensors
are returned as they are.

The host-side copies are numpy's (one thread, plain memcpy), not torch's: a torch CPU copy of
more than about 32 KB runs as an intra-op parallel region, and under ``torch.profiler`` on the
H200 machine the first such region of a step stalled for 6-12 ms (40 ms of GPU idle time in 12
forwards, inside one 98 KB copy), which made the profile misreport where a step's time goes.
The benchmark without the profiler ran at the same speed either way (167.8 vs 165.8 frames/s).
"""

from __future__ import annotations

import time

import numpy as np
import torch

_ALIGN = 16  # bytes: every view starts aligned for any dtype


def layout(tensors: dict[str, torch.Tensor]) -> tuple[list[int], int]:
    """Byte offsets of the tensors packed back to back (each aligned) and the total size."""
    spans, offset = [], 0
    for t in tensors.values():
        spans.append(offset)
        offset += -(-t.numel() * t.element_size() // _ALIGN) * _ALIGN
    return spans, offset


def _bytes(t: torch.Tensor) -> np.ndarray:
    """A host tensor's bytes as a flat uint8 numpy array (a view when it is contiguous)."""
    return t.contiguous().view(-1).view(torch.uint8).numpy()


def pack(buf: torch.Tensor, tensors: dict[str, torch.Tensor], spans: list[int]) -> None:
    """Writes every tensor's bytes into the uint8 host ``buf`` at its offset (numpy copies)."""
    dst = buf.numpy()
    for start, t in zip(spans, tensors.values(), strict=True):
        src = _bytes(t)
        dst[start : start + src.size] = src


def views(buf: torch.Tensor, tensors: dict[str, torch.Tensor], spans: list[int]) -> dict:
    """Views of the uint8 ``buf`` with the tensors' names, dtypes and shapes."""
    out = {}
    for start, (name, t) in zip(spans, tensors.items(), strict=True):
        n = t.numel() * t.element_size()
        out[name] = buf[start : start + n].view(t.dtype).view(t.shape)
    return out


class Staging:
    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self._host: torch.Tensor | None = None
        self._dev: torch.Tensor | None = None
        self._done: torch.cuda.Event | None = None

    def _buffers(self, nbytes: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._host is None or self._host.numel() < nbytes:
            size = max(nbytes, 2 * (0 if self._host is None else self._host.numel()), 4096)
            self._host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
            self._dev = torch.empty(size, dtype=torch.uint8, device=self.device)
        return self._host, self._dev

    def upload(
        self, tensors: dict[str, torch.Tensor], dest: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        """Host tensors -> device tensors (same names, shapes, dtypes, contents): views of the
        staging device buffer, or of ``dest`` (a uint8 device tensor of at least the packed
        size, e.g. a CUDA graph's static inputs: then the same tensors in the same order give
        views at the same offsets every time)."""
        for name, t in tensors.items():
            if t.device.type != "cpu":
                raise ValueError(f"Staging.upload: {name!r} must be a host tensor, got {t.device}")
        if self.device.type == "cpu":
            return dict(tensors)
        spans, total = layout(tensors)
        if dest is not None and (dest.dtype != torch.uint8 or dest.numel() < total):
            raise ValueError(
                f"Staging.upload: dest must be a uint8 tensor of at least {total} bytes, got "
                f"{dest.dtype} x {dest.numel()}"
            )
        if self._done is not None:
            self._done.synchronize()  # the previous step's copy has left the host buffer
        host, dev = self._buffers(max(total, 1))
        if dest is not None:
            dev = dest
        pack(host, tensors, spans)
        dev[:total].copy_(host[:total], non_blocking=True)
        self._done = torch.cuda.Event()
        self._done.record()
        return views(dev, tensors, spans)


class StageClock:
    """Durations of a step's stages without a synchronization inside the step: marks are CUDA
    events on the current stream (read once the step's last mark has completed), or host clock
    readings on a CPU device. On the GPU a span is the stream's time between two marks: the
    stage's kernels, plus any time the stream waited for the host to submit them."""

    def __init__(self, device: torch.device | str):
        self.cuda = torch.device(device).type == "cuda"
        self.marks: list = []
        self.mark()

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def spans(self) -> list[float]:
        """Seconds between consecutive marks (waits for the last mark on the GPU: no wait once a
        host read issued after it has returned)."""
        if self.cuda:
            self.marks[-1].synchronize()
            pairs = zip(self.marks, self.marks[1:], strict=False)
            return [a.elapsed_time(b) / 1000 for a, b in pairs]
        return [b - a for a, b in zip(self.marks, self.marks[1:], strict=False)]
