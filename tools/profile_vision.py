#!/usr/bin/env python3
"""The ActiveVLN vision tower alone, at the replay's frame size, on a GPU machine without uv.

    python3 tools/profile_vision.py [--preset fast] [--frames 1 2 4 6 8] [--height 480 --width 640]
                                    [--profile-frames 4] [--top 30]

Builds an engine over in-memory random 3B weights, then for each frame count replays the vision
graph (the GPU preprocessing and the tower, as the replay runs them: ``VisionGraphs.run_frames``
over pinned uint8 frames) and prints its time per call and per frame, with the tower's block
GEMMs' FLOPs over that time (a lower bound on their rate: the time also holds the
preprocessing, norms, rotary, attention and merger). Then it profiles ``--profile-frames``
frames a call and prints the kernels by device time, to tell the GEMMs' share from the rest.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = sorted(str(p) for p in (ROOT / "packages").glob("*/src"))


def block_gemm_flops(cfg, patches: int) -> int:
    """The vision blocks' linear FLOPs for ``patches`` patches (qkv, proj, gate|up, down)."""
    d, i = cfg.hidden_size, cfg.intermediate_size
    per_patch = d * 3 * d + d * d + d * 2 * i + i * d
    return 2 * patches * cfg.depth * per_patch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--preset", default="fast")
    ap.add_argument("--frames", type=int, nargs="+", default=[1, 2, 4, 6, 8])
    ap.add_argument("--height", type=int, default=480)
    ap.add_argument("--width", type=int, default=640)
    ap.add_argument("--profile-frames", type=int, default=4)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()

    import torch

    from flashrt_activevln.engine_setup import random_engine
    from flashrt_activevln.presets import preset

    if not torch.cuda.is_available():
        print("profile_vision: needs a CUDA GPU", file=sys.stderr)
        return 1
    eng = random_engine("3b", preset(args.preset), "cuda")
    cfg = eng.model.cfg.vision
    graphs = eng.vision_graphs
    gen = torch.Generator().manual_seed(0)
    n_max = max(args.frames + [args.profile_frames])
    frames = [torch.randint(0, 256, (args.height, args.width, 3), dtype=torch.uint8,
                            generator=gen).pin_memory() for _ in range(n_max)]  # fmt: skip
    print("| frames a call | ms a call | ms a frame | grid | block GEMMs TFLOP/s over the call |")
    print("|---|---|---|---|---|")
    for n in args.frames:
        for _ in range(3):  # capture, then warm
            _, grid = graphs.run_frames(frames[:n])
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.reps):
            graphs.run_frames(frames[:n])
        end.record()
        torch.cuda.synchronize()
        ms = start.elapsed_time(end) / args.reps
        flops = block_gemm_flops(cfg, n * grid[0] * grid[1] * grid[2])
        print(f"| {n} | {ms:.3f} | {ms / n:.3f} | {tuple(grid)} | {flops / ms * 1e-9:.0f} |",
              flush=True)  # fmt: skip
    activity = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activity) as prof:
        for _ in range(5):
            graphs.run_frames(frames[: args.profile_frames])
        torch.cuda.synchronize()
    print(f"\nkernels of 5 calls of {args.profile_frames} frames, by device time:")
    print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=args.top,
                                    max_name_column_width=70))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
