#!/usr/bin/env python3
"""Where an ActiveVLN replay step spends its time, on a GPU machine without uv.

    python3 tools/profile_activevln.py [--preset fast] [--option NAME=VALUE ...]
                                       [--episodes 8] [--mean-frames 6] [--random-config 3b]
                                       [--trace OUT.json]

Builds an engine over in-memory random weights (grammar-constrained decoding, as the
benchmark does), replays the timed set once to warm up (kernel compilation, cuBLAS heuristics,
and every CUDA graph the timed replay needs: its token buckets are then all captured), then
replays it again under ``torch.profiler`` and prints: frames/s and ms per frame by
stage, GPU busy time against wall time, the top operators by GPU time and by CPU time, and
where the GPU idled (``flashrt_activevln.idle``: the gaps by what ended them, and the CUDA
graph launches' host time by graph size).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = sorted(str(p) for p in (ROOT / "packages").glob("*/src"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--preset", default="fast")
    ap.add_argument("--option", action="append", default=[], help="NAME=VALUE override")
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--mean-frames", type=int, default=6)
    ap.add_argument("--random-config", default="3b", choices=["tiny", "3b"])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--trace", default=None, help="write a Chrome trace here")
    args = ap.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    from flashrt_activevln import idle
    from flashrt_activevln.cli import _parse_overrides
    from flashrt_activevln.data import synthetic_episodes
    from flashrt_activevln.engine_setup import random_engine, run_replay
    from flashrt_activevln.presets import preset

    overrides = {"constrain_to_grammar": True, "max_new_tokens": 24}
    overrides.update(_parse_overrides(args.option))
    opt = preset(args.preset, **overrides)
    t0 = time.perf_counter()
    engine = random_engine(args.random_config, opt, args.device)
    print(f"engine built in {time.perf_counter() - t0:.1f} s ({args.preset}: {opt})")
    episodes = synthetic_episodes(args.episodes, seed=0, mean_frames=args.mean_frames)
    t0 = time.perf_counter()
    ahead = engine.capture_graphs(episodes)
    print(f"{ahead} graphs captured ahead in {time.perf_counter() - t0:.1f} s")
    t0 = time.perf_counter()
    run_replay(engine, episodes)
    print(f"warm-up replay (the timed set): {time.perf_counter() - t0:.1f} s")
    engine.stats = type(engine.stats)()
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        _, stats = run_replay(engine, episodes)
        sync()
    events = prof.key_averages()
    gpu_us = sum(e.self_device_time_total for e in events)
    wall = stats["wall_seconds"]
    print(json.dumps({k: stats[k] for k in ("frames", "forwards", "ms_per_frame")}, indent=1))
    print(
        f"frames/s {stats['frames_per_second_wall']:.2f}; forwards/reply "
        f"{stats['decode_forwards_per_reply']:.2f}; GPU busy {gpu_us / 1e6:.2f} s of {wall:.2f} s "
        f"wall ({gpu_us / 1e6 / wall:.0%}); forwards {stats['forwards']}, "
        f"{1000 * wall / max(stats['forwards'], 1):.2f} ms wall per forward"
    )
    print(
        events.table(sort_by="self_device_time_total", row_limit=args.top, max_name_column_width=60)
    )
    print(events.table(sort_by="cpu_time_total", row_limit=args.top, max_name_column_width=60))
    with tempfile.TemporaryDirectory() as tmp:
        trace = args.trace or str(Path(tmp) / "trace.json")
        prof.export_chrome_trace(trace)
        with open(trace) as f:
            print(idle.report(json.load(f)["traceEvents"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
