#!/usr/bin/env python3
"""Per-kernel GPU time of one top-K call (hint-free and hinted), from ``torch.profiler``.

    python3 tools/profile_topk.py [--cells B,N,K ...] [--backends cuda triton] [--iters 20]

Prints, per cell, one table row per kernel (mean device microseconds per call) next to the CUDA
graph time of the whole call, so a slow cell shows which launch to work on. Run it through
``tools/gpu_run.py``'s environment (every ``packages/*/src`` on ``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = sorted(str(p) for p in (ROOT / "packages").glob("*/src"))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from flashrt_kernels.benchmarking import time_graph_us  # noqa: E402
from flashrt_kernels.testing.chains import ScoreChain  # noqa: E402
from flashrt_kernels.topk import cuda_select, select, topk  # noqa: E402

CELLS = ["1,8192,512", "1,131072,1024", "1,1048576,512", "8,262144,2048", "64,8192,512",
         "64,262144,2048"]  # fmt: skip


def _kernel_times(fn, iters: int) -> dict[str, float]:
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    acc: dict[str, float] = defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            acc[ev.name[:60]] += ev.device_time / iters
    return dict(acc)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cells", nargs="*", default=CELLS)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--backends", nargs="*", default=["cuda", "triton"])
    ap.add_argument(
        "--splits",
        nargs="*",
        type=int,
        default=[],
        help="also time the hint-free select at these programs-per-row counts",
    )
    args = ap.parse_args()
    print("| cell | path | kernel | us/call |\n|---|---|---|---|")
    for cell in args.cells:
        b, n, k = (int(v) for v in cell.split(","))
        chain = ScoreChain(b, n, drift=0.02, seed=1, device="cuda")
        prev = chain.step()[0]
        x = chain.step()[0]
        hint = topk(prev, k)[1]
        ov = torch.empty((b, k), device="cuda")
        oi = torch.empty((b, k), dtype=torch.int32, device="cuda")
        paths = {"torch.topk": functools.partial(torch.topk, x, k, sorted=False)}
        for be in args.backends:
            paths[f"{be} hint-free"] = functools.partial(topk, x, k, out_values=ov, out_indices=oi,
                                                         backend=be)  # fmt: skip
            paths[f"{be} hinted"] = functools.partial(topk, x, k, hint=hint, out_values=ov,
                                                      out_indices=oi, backend=be)  # fmt: skip
            launch = cuda_select.launch if be == "cuda" else select.launch
            for sp in args.splits:
                paths[f"{be} hint-free S={sp}"] = functools.partial(launch, x, k, None, ov, oi, None,
                                                                    None, sp)  # fmt: skip
        for name, fn in paths.items():
            graph_us = time_graph_us([fn], rep_ms=20)
            print(f"| {cell} | {name} | (CUDA graph, whole call) | {graph_us:.1f} |")
            if " S=" in name:
                continue
            times = _kernel_times(fn, args.iters)
            for kname, us in sorted(times.items(), key=lambda kv: -kv[1]):
                print(f"| {cell} | {name} | {kname} | {us:.1f} |")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
