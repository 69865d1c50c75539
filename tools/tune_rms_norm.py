#!/usr/bin/env python3
"""Sweep RMSNorm launch configurations (rows per program, warps) on a GPU; prints, per width, the
configuration with the lowest total time over the row counts, and writes every timing as JSON.

    python3 tools/tune_rms_norm.py --out RESULTS_DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = sorted(str(p) for p in (ROOT / "packages").glob("*/src"))

import torch  # noqa: E402

from flashrt_kernels.benchmarking import rotation, time_graph_us  # noqa: E402
from flashrt_kernels.norm.rms_norm import _launch_triton, launch_config  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    results = []
    for cols in (1152, 1280, 2048, 4096):
        block_a, block_b, _, _ = launch_config(cols)
        width = block_a + block_b
        totals = {}
        for rows_per in (1, 2, 4):
            for warps in (4, 8):
                if width * rows_per // (32 * warps) < 1:
                    continue
                cfg = (rows_per, warps)
                total = 0.0
                for residual in (False, True):
                    for rows in (1024, 16384):
                        nbytes = rows * cols * 2 * (4 if residual else 2)
                        sets = []
                        for _ in range(rotation(nbytes)):
                            x = torch.randn(rows, cols, dtype=torch.bfloat16, device="cuda")
                            r = torch.randn_like(x) if residual else None
                            sets.append(
                                (
                                    x,
                                    r,
                                    torch.empty_like(x),
                                    torch.empty_like(x) if residual else None,
                                )
                            )
                        w = torch.randn(cols, dtype=torch.bfloat16, device="cuda")
                        calls = [
                            (
                                lambda s=s, w=w, cfg=cfg: _launch_triton(
                                    s[0], w, 1e-6, s[1], s[2], s[3], config=cfg
                                )
                            )
                            for s in sets
                        ]
                        us = time_graph_us(calls, rep_ms=40)
                        total += us
                        results.append(
                            {
                                "cols": cols,
                                "rows": rows,
                                "residual": residual,
                                "rows_per_program": rows_per,
                                "warps": warps,
                                "us": us,
                            }
                        )
                totals[cfg] = total
        best = min(totals, key=totals.get)
        print(
            f"cols {cols}: best {best} total {totals[best]:.1f} us; current {launch_config(cols)[2:]} total {totals.get(launch_config(cols)[2:], float('nan')):.1f} us"
        )
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "tune_rms_norm.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
