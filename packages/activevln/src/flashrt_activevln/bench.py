"""`flashrt activevln bench`: the preset against the baselines a user would run, in one run.

Paths, each replaying synthetic R2R-geometry episodes (grammar-constrained greedy decoding, so
random weights give replies of the grammar's shape):
- the preset, over every episode (the throughput figure);
- the preset at B=1, over the first ``baseline_episodes`` (cut to ``baseline_frames`` frames
  each, if given): against HF at B=1, and the batch-invariance check (replies identical to the
  preset's at B=8 wherever every kernel is invariant to the batch's composition);
- the preset without the tree (``grammar_tree_budget=0``, everything else equal), over the
  same subset: the lossless check (greedy replies identical frame for frame where every kernel
  is invariant to the step's query count) and the decode-forwards saving;
- the plain path (the ``reference`` preset: B=1, no tree, torch ops), over the same subset;
- optionally HF transformers ``generate`` at B=1 over the same subset (``hf_baseline``).
Every engine first replays a short warm-up set (kernel compilation and library heuristics are
not timed), then, with ``cuda_graphs``, captures the graph of every token bucket and image count
its timed replay can meet (``Engine.capture_graphs``; its count and seconds are reported). The
baselines replay a subset because they are 10-100x slower per frame.
"""

from __future__ import annotations

import dataclasses
import gc
import time

import torch

from flashrt_activevln.data import synthetic_episodes
from flashrt_activevln.engine_setup import agreement, engine_for, run_replay
from flashrt_activevln.presets import preset

WARMUP = {"n": 2, "seed": 1, "mean_frames": 2, "min_frames": 2}


def run(
    checkpoint=None,
    random_config: str = "tiny",
    episodes: int = 64,
    mean_frames: int = 64,
    baseline_episodes: int = 4,
    baseline_frames: int | None = None,
    preset_name: str = "fast",
    overrides: dict | None = None,
    dtype: str = "bfloat16",
    device: str = "cpu",
    hf: bool = False,
    progress: bool = True,
) -> dict:
    """Runs every path; returns {"paths": {name: stats}, "identical": {...}, "settings": {...}}."""
    eps = synthetic_episodes(episodes, seed=0, mean_frames=mean_frames)
    subset = eps[: max(1, min(baseline_episodes, episodes))]
    if baseline_frames is not None:  # the preset replays them whole; compared: the common frames
        subset = [dataclasses.replace(e, frames=e.frames[:baseline_frames]) for e in subset]
    common = {"dtype": dtype, "constrain_to_grammar": True, "max_new_tokens": 24}
    common.update(overrides or {})
    options = {
        "preset": preset(preset_name, **common),
        "preset, B=1": preset(preset_name, **{**common, "batch_size": 1}),
        "preset, no tree": preset(preset_name, **{**common, "grammar_tree_budget": 0}),
        "plain": preset("reference", **{k: v for k, v in common.items() if k != "batch_size"}),
    }
    plan = {"preset": eps, "preset, B=1": subset, "preset, no tree": subset, "plain": subset}
    paths, replies, plain_engine = {}, {}, None
    for name, opt in options.items():
        engine = engine_for(checkpoint, random_config, opt, device)
        # the warm-up's pool has the timed set's size, so the timed replay keeps it (and graphs)
        capacity = engine.capacity(plan[name])
        run_replay(engine, synthetic_episodes(**WARMUP), capacity=capacity)
        t0 = time.perf_counter()
        ahead = engine.capture_graphs(plan[name], capacity)  # cuda_graphs: every bucket, now
        ahead_seconds = time.perf_counter() - t0
        engine.stats = type(engine.stats)()
        replies[name], paths[name] = run_replay(engine, plan[name], progress, name)
        paths[name].update(graphs_ahead=ahead, graphs_ahead_seconds=ahead_seconds)
        if name == "plain" and hf:
            plain_engine = engine
        del engine
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    if plain_engine is not None:
        from flashrt_activevln.hf_baseline import hf_model, replay_hf

        model = hf_model(plain_engine.model.cfg, plain_engine.model.w)
        tokens = {k: r.tokens for k, r in replies["plain"].items()}
        _, seconds = replay_hf(model, plain_engine.proc, subset, tokens)
        paths["HF generate"] = {
            "frames": len(seconds),
            "ms_per_frame_wall": 1000 * sum(seconds) / max(len(seconds), 1),
        }
    in_subset = {k: r for k, r in replies["preset"].items() if k in replies["plain"]}
    return {
        "paths": paths,
        "identical": {
            "preset vs preset, no tree": agreement(in_subset, replies["preset, no tree"]),
            "preset vs preset, B=1": agreement(in_subset, replies["preset, B=1"]),
            "preset vs plain": agreement(in_subset, replies["plain"]),
        },
        "settings": {
            "episodes": episodes,
            "baseline_episodes": len(subset),
            "baseline_frames": baseline_frames,
            "mean_frames": mean_frames,
            "preset": preset_name,
            "options": {k: repr(v) for k, v in options.items()},
            "device": torch.cuda.get_device_name() if device.startswith("cuda") else device,
        },
    }


def _wall_ms(stats: dict) -> float:
    if "ms_per_frame_wall" in stats:
        return stats["ms_per_frame_wall"]
    return 1000 / max(stats["frames_per_second_wall"], 1e-9)


def rows(result: dict) -> list[dict]:
    """One table row per path: frames, frames/s, ms per frame (wall, and by stage), forwards per
    reply, and the speed-up over the plain path and over HF ``generate``."""
    paths = result["paths"]
    plain_ms = _wall_ms(paths["plain"])
    hf_ms = _wall_ms(paths["HF generate"]) if "HF generate" in paths else None
    out = []
    for name, s in paths.items():
        ms = _wall_ms(s)
        row = {"path": name, "frames": s["frames"], "frames/s": f"{1000 / ms:.2f}",
               "ms/frame": f"{ms:.1f}"}  # fmt: skip
        for stage, v in s.get("ms_per_frame", {}).items():
            row[stage] = f"{v:.2f}"
        if "decode_forwards_per_reply" in s:
            row["forwards/reply"] = f"{s['decode_forwards_per_reply']:.2f}"
        if "draft_nodes_per_forward" in s:
            row["nodes/forward"] = f"{s['draft_nodes_per_forward']:.1f}"
        if s.get("graphs_ahead"):  # captured before the timed replay (not timed)
            row["graphs ahead (s)"] = f"{s['graphs_ahead']} ({s['graphs_ahead_seconds']:.1f})"
        if s.get("graph_captures"):  # new buckets captured inside the timed replay
            row["graphs (s)"] = f"{s['graph_captures']} ({s['capture_seconds']:.2f})"
        row["x plain"] = f"{plain_ms / ms:.2f}"
        if hf_ms is not None:
            row["x HF"] = f"{hf_ms / ms:.2f}"
        out.append(row)
    return out
