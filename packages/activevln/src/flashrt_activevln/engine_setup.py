"""Building an engine from a checkpoint directory, and the fast-vs-reference comparison shared by
the demo, the benchmark and the replay command."""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch

from flashrt_activevln.model import Qwen25VL
from flashrt_activevln.presets import Options
from flashrt_activevln.processor import ActiveVLNProcessor
from flashrt_activevln.runtime import Engine, Episode
from flashrt_activevln.weights import load_checkpoint, load_tokenizer, write_random_checkpoint


def build_engine(checkpoint: str | Path, options: Options, device: str = "cpu") -> Engine:
    cfg, w = load_checkpoint(checkpoint, dtype=options.torch_dtype, device=device)
    proc = ActiveVLNProcessor(load_tokenizer(checkpoint), cfg)
    return Engine(Qwen25VL(cfg, w, Engine.ops_for(options)), proc, options)


def write_tiny_random_checkpoint(path: str | Path | None = None, seed: int = 1) -> Path:
    """The tiny config with the tiny tokenizer, random weights (std 0.3)."""
    from flashrt_activevln.tiny_tokenizer import build_tiny_tokenizer, tiny_config_for

    tok, n = build_tiny_tokenizer()
    cfg = tiny_config_for(tok, n)
    path = Path(path) if path is not None else Path(tempfile.mkdtemp(prefix="activevln_tiny_"))
    return write_random_checkpoint(path, cfg, seed=seed, std=0.3, tokenizer_json=tok.to_str())


def random_engine(config: str, options: Options, device: str = "cpu", seed: int = 1) -> Engine:
    """An engine over in-memory random weights: ``config`` "tiny" or "3b" (the real shapes, with
    the tiny word-level tokenizer whose special tokens sit at Qwen's ids)."""
    from flashrt_activevln.config import qwen25_vl_3b
    from flashrt_activevln.tiny_tokenizer import build_tiny_tokenizer, tiny_config_for
    from flashrt_activevln.weights import random_state

    if config == "tiny":
        tok, n = build_tiny_tokenizer()
        cfg, std = tiny_config_for(tok, n), 0.3
    elif config == "3b":
        tok, _ = build_tiny_tokenizer(qwen_ids=True)
        cfg, std = qwen25_vl_3b(), 0.02
    else:
        raise ValueError(f"random_engine: config must be 'tiny' or '3b', got {config!r}")
    w = random_state(cfg, seed, std, device=device, dtype=options.torch_dtype)
    proc = ActiveVLNProcessor(tok, cfg)
    return Engine(Qwen25VL(cfg, w, Engine.ops_for(options)), proc, options)


def engine_for(checkpoint, random_config: str, options: Options, device: str) -> Engine:
    """The checkpoint's engine, or (``checkpoint`` None) one over random ``random_config``
    weights."""
    if checkpoint is None:
        return random_engine(random_config, options, device)
    return build_engine(checkpoint, options, device)


class Progress:
    def __init__(self, total: int, enabled: bool, label: str):
        self.total, self.enabled, self.label, self.done = total, enabled, label, 0
        self.t0 = time.perf_counter()

    def __call__(self, _reply=None) -> None:
        self.done += 1
        if self.enabled and (self.done % 10 == 0 or self.done == self.total):
            rate = self.done / max(time.perf_counter() - self.t0, 1e-9)
            print(
                f"\r{self.label}: {self.done}/{self.total} frames, {rate:.1f}/s",
                end="",
                file=sys.stderr,
            )
            if self.done == self.total:
                print(file=sys.stderr)


def run_replay(
    engine: Engine,
    episodes: list[Episode],
    progress: bool = False,
    label: str = "",
    log=None,
    capacity: int | None = None,
):
    total = sum(len(e.frames) for e in episodes)
    bar = Progress(total, progress, label)

    def on_reply(r):
        bar(r)
        if log is not None:
            log(r)

    engine.on_reply = on_reply
    t0 = time.perf_counter()
    replies = engine.replay(episodes, capacity)
    wall = time.perf_counter() - t0
    stats = engine.stats.as_dict()
    stats["wall_seconds"] = wall
    stats["frames_per_second_wall"] = len(replies) / wall if wall else 0.0
    return {(r.episode, r.frame): r for r in replies}, stats


def agreement(a: dict, b: dict) -> tuple[int, int]:
    """(frames whose actions are identical, frames)."""
    same = sum(1 for k, r in a.items() if k in b and b[k].tokens == r.tokens)
    return same, len(a)


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"
