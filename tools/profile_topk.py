#!/usr/bin/env python3
"""Per-kernel GPU time of one top-K call (hint-free and hinted), from ``torch.profiler``.

    python3 tools/profile_topk.py [--cells B,N,K ...] [--backends cuda triton] [--iters 20]
    python3 tools/profile_topk.py --grid [--cells ...] [--json OUT.json] [--deadline-s 150]

Prints, per cell, one table row per kernel (mean device microseconds per call) next to the CUDA
graph time of the whole call, so a slow cell shows which launch to work on. ``--grid`` instead
times the ``topk/bench.py`` protocol (same chain, sets, rotation) on the cells (default: the
benchmark's grid, long rows first): torch.topk, ours hint-free and hinted, and the CUDA
backend's launches without programmatic dependent launch (``pdl=False``) as an A/B, one JSON row
per cell, stopping at the deadline. Run it through ``tools/gpu_run.py``'s environment (every
``packages/*/src`` on ``PYTHONPATH``).
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


def _grid_cells() -> list[str]:
    from flashrt_kernels.topk import bench

    cells = [(b, n, k) for b in bench.BATCHES for n in bench.LENGTHS for k in bench.KS
             if b * n <= bench.MAX_ELEMS]  # fmt: skip
    cells.sort(key=lambda c: (c[1] <= cuda_select.SHORT_MAX, c))  # long rows first
    return [f"{b},{n},{k}" for b, n, k in cells]


def _grid(cells: list[str], json_path: str | None, deadline_s: float) -> None:
    import json
    import time

    from flashrt_kernels.benchmarking import floor_us, rotation
    from flashrt_kernels.topk import bench, reference

    t0, rows = time.time(), []
    cols = ("torch_us", "ours_us", "hint_us", "nopdl_us", "nopdl_hint_us")
    print("| B | N | K | " + " | ".join(cols) + " | x_torch | x_hintfree | pdl_gain | exact |")
    print("|---" * (len(cols) + 7) + "|")
    for cell in cells:
        if time.time() - t0 > deadline_s:
            print(f"deadline: stopped before {cell}")
            break
        b, n, k = (int(v) for v in cell.split(","))
        sets = bench._sets(b, n, k, rotation(b * n * 4, limit=16))

        def ours(s, hint, pdl, k=k):
            if pdl is None:
                return lambda: topk(s[0], k, hint=hint, out_values=s[2], out_indices=s[3])
            return lambda: cuda_select.launch(s[0], k, None, s[2], s[3], None, hint, None, pdl)

        t = {
            "torch_us": time_graph_us(
                [functools.partial(torch.topk, s[0], k, sorted=False) for s in sets],
                rep_ms=bench.REP,
            ),
            "ours_us": time_graph_us([ours(s, None, None) for s in sets], rep_ms=bench.REP),
            "hint_us": time_graph_us([ours(s, s[1], None) for s in sets], rep_ms=bench.REP),
        }
        if n > cuda_select.SHORT_MAX:  # one launch otherwise: nothing to overlap
            t["nopdl_us"] = time_graph_us([ours(s, None, False) for s in sets], rep_ms=20)
            t["nopdl_hint_us"] = time_graph_us([ours(s, s[1], False) for s in sets], rep_ms=20)
        _, exact = bench._admitted_and_exact(sets, k)
        x, hint, ov, oi = sets[-1]
        want = reference.topk(x, k)
        for pdl in (False, True):
            for h in (None, hint):
                ov.fill_(float("nan"))
                cuda_select.launch(x, k, None, ov, oi, None, h, None, pdl)
                exact &= torch.equal(oi, want[1]) and torch.equal(
                    ov.view(torch.int32), want[0].view(torch.int32)
                )
        row = {"B": b, "N": n, "K": k, **t, "x_torch": t["torch_us"] / t["ours_us"],
               "x_hintfree": t["ours_us"] / t["hint_us"],
               "hint_x_torch": t["torch_us"] / t["hint_us"],
               "pdl_gain": t["nopdl_us"] / t["ours_us"] if "nopdl_us" in t else 1.0,
               "exact": bool(exact), "floor_us": floor_us(b * n * 4),
               "pdl": cuda_select.pdl_available()}  # fmt: skip
        row["floor_frac"] = row["floor_us"] / t["ours_us"]
        row["hint_floor_frac"] = row["floor_us"] / t["hint_us"]
        rows.append(row)
        vals = " | ".join(f"{t.get(c, float('nan')):.1f}" for c in cols)
        print(f"| {b} | {n} | {k} | {vals} | {row['x_torch']:.2f} | {row['x_hintfree']:.2f} | "
              f"{row['pdl_gain']:.2f} | {row['exact']} |", flush=True)  # fmt: skip
        if json_path:
            with open(json_path, "w") as f:
                json.dump(rows, f, indent=1)
        del sets


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
    ap.add_argument("--grid", action="store_true", help="time the benchmark protocol instead")
    ap.add_argument("--json", default=None, help="--grid: write the rows here")
    ap.add_argument("--deadline-s", type=float, default=1e9, help="--grid: stop after this")
    args = ap.parse_args()
    if args.grid:
        _grid(args.cells if args.cells != CELLS else _grid_cells(), args.json, args.deadline_s)
        return 0
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
            if be == "cuda":  # per-kernel times without overlap (a PDL kernel's time
                # includes its blocks' wait for the one before)
                for tag, h in (("hint-free", None), ("hinted", hint)):
                    paths[f"cuda {tag} no-pdl"] = functools.partial(
                        cuda_select.launch, x, k, None, ov, oi, None, h, None, False
                    )
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
