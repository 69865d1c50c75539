"""Replay sets on disk, synthetic R2R-geometry sets, and JSONL logs.

Folder layout (one sub-folder per episode, replayed in sorted order)::

    DATA/
      <episode id>/
        instruction.txt          the instruction, UTF-8, one paragraph
        rgb/000.png, 001.png...  the ordered RGB frames (.png, .jpg or .jpeg), one per reply

This matches the public R2R trajectory dumps (``rgb/000.jpg ...``) with the instruction beside
them. ``write_synthetic`` writes such a folder: seeded 640x480 frames (smooth colour fields with
noise, so the resize sees real texture) and episode lengths like R2R's (4089 frames over 64
episodes: mean about 64).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from flashrt_activevln.runtime import Episode

FRAME_SUFFIXES = (".png", ".jpg", ".jpeg")
WORDS = (
    "walk past the kitchen and turn left at the hallway then stop near the door",
    "go up the stairs and enter the bedroom then wait by the table",
    "exit the bathroom turn right and walk down the hallway until you reach the sofa",
    "walk through the living room and stop at the stairs",
)


def read_replay_set(root: str | Path) -> list[Episode]:
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"replay set {root}: not a folder")
    episodes = []
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        ins = d / "instruction.txt"
        frames = sorted(p for p in (d / "rgb").glob("*") if p.suffix.lower() in FRAME_SUFFIXES)
        if not ins.is_file() or not frames:
            raise ValueError(f"replay set {root}: episode {d.name} needs instruction.txt and rgb/*")
        episodes.append(Episode(d.name, ins.read_text().strip(), frames))
    if not episodes:
        raise ValueError(f"replay set {root}: no episode folders")
    return episodes


def synthetic_frame(rng: np.random.Generator, height: int = 480, width: int = 640) -> np.ndarray:
    """A seeded uint8 [H, W, 3] frame: a plane wave per channel plus integer noise uniform in
    [-20, 20] (std ~11.8), in float32 (about 6 ms at 640x480: the benchmark's default replay
    of ~4000 frames is built in ~25 s)."""
    yy = np.arange(height, dtype=np.float32)[:, None]
    xx = np.arange(width, dtype=np.float32)[None, :]
    f = rng.uniform(0.005, 0.05, size=(3, 2)).astype(np.float32)
    ph = rng.uniform(0, 6.28, size=3).astype(np.float32)
    img = np.empty((height, width, 3), dtype=np.float32)
    for c in range(3):
        np.sin(f[c, 0] * yy + f[c, 1] * xx + ph[c], out=img[..., c])
    img *= 100
    img += 127
    img += rng.integers(-20, 21, (height, width, 3), dtype=np.int8)
    return np.clip(img, 0, 255, out=img).astype(np.uint8)


def synthetic_episodes(
    n: int, seed: int = 0, mean_frames: int = 64, height: int = 480, width: int = 640,
    min_frames: int = 1, max_frames: int = 120,
) -> list[Episode]:  # fmt: skip
    """In-memory synthetic episodes (frames as arrays), lengths ~ normal(mean, mean / 3)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        k = int(np.clip(round(rng.normal(mean_frames, mean_frames / 3)), min_frames, max_frames))
        ins = WORDS[i % len(WORDS)] + "."
        out.append(
            Episode(f"ep{i:04d}", ins, [synthetic_frame(rng, height, width) for _ in range(k)])
        )
    return out


def write_replay_set(root: str | Path, episodes: list[Episode]) -> Path:
    from PIL import Image

    root = Path(root)
    for ep in episodes:
        d = root / ep.id / "rgb"
        d.mkdir(parents=True, exist_ok=True)
        (root / ep.id / "instruction.txt").write_text(ep.instruction + "\n")
        for j, f in enumerate(ep.frames):
            Image.fromarray(np.asarray(f)).save(d / f"{j:03d}.png")
    return root


def write_synthetic(root: str | Path, n: int = 64, seed: int = 0, **kw) -> Path:
    return write_replay_set(root, synthetic_episodes(n, seed, **kw))


class JsonlLog:
    """One JSON object per reply: episode, frame, row, reply text, tokens, actions, forwards."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = self.path.open("w")

    def __call__(self, reply) -> None:
        rec = {
            "episode": reply.episode,
            "frame": reply.frame,
            "row": reply.row,
            "reply": reply.text,
            "tokens": reply.tokens,
            "actions": [list(a) for a in reply.actions],
            "forwards": reply.forwards,
        }
        self._fh.write(json.dumps(rec) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()
