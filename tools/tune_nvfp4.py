#!/usr/bin/env python3
"""Tile sweep of ``nvfp4_linear`` on the GPU: which launch configuration is fastest per shape.

    python3 tools/tune_nvfp4.py [--json OUT.json] [--quick]

For the benchmark's shapes (2048 -> 22016, 4096 -> 6144, 4096 -> 24576, 12288 -> 4096) and
M = 1, 16, 64, 256, 2048, 8192, times every candidate tile (CUDA graph; at M <= 64 the NVFP4
weights and cuBLAS's bf16 ones rotated past the L2) next to ``nvfp4_launch_config``'s default
and cuBLAS bf16, checks each candidate's output against the default's within the faithful bound,
and prints one row per shape with the best candidate. Run it through ``tools/gpu_run.py``'s environment (every ``packages/*/src`` on
``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import sys
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = sorted(str(p) for p in (ROOT / "packages").glob("*/src"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from flashrt_kernels.benchmarking import markdown_table, rotation, time_graph_us  # noqa: E402
from flashrt_kernels.quant import quantize_rows_nvfp4  # noqa: E402

nv = importlib.import_module("flashrt_kernels.gemm.nvfp4_linear")


def candidates(m: int, n: int, k: int) -> list[dict]:
    out = []
    if m <= 64:
        bm = 16 if m <= 16 else (32 if m <= 32 else 64)
        splits = sorted({1, nv.nvfp4_launch_config(m, n, k)["SPLIT_K"]})
        for bn, bk, st, sp in itertools.product((32, 64, 128), (128, 256), (3, 4), splits):
            if k % bk == 0:
                out.append({"A_CODES": True, "SPLIT_K": sp, "BLOCK_M": bm, "BLOCK_N": bn,
                            "BLOCK_K": bk, "GROUP_M": 1, "num_warps": 4, "num_stages": st})  # fmt: skip
    else:
        tiles = [(128, 128, 8), (128, 256, 8), (64, 128, 4)]
        for (bm, bn, w), bk, st in itertools.product(tiles, (64, 128), (3, 4)):
            out.append({"A_CODES": False, "SPLIT_K": 1, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk,
                        "GROUP_M": 8, "num_warps": w, "num_stages": st})  # fmt: skip
        out.append({**out[0], "A_CODES": True})
    return out


def name(c: dict) -> str:
    a = "aloop" if c["A_CODES"] else "abf16"
    return (f"{a}_m{c['BLOCK_M']}n{c['BLOCK_N']}k{c['BLOCK_K']}"
            f"_w{c['num_warps']}s{c['num_stages']}_split{c.get('SPLIT_K', 1)}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true", help="two shapes, M = 16 and 2048")
    ap.add_argument("--rep-ms", type=int, default=40)
    args = ap.parse_args()
    shapes = ((4096, 6144), (4096, 24576)) if args.quick else (
        (2048, 22016), (4096, 6144), (4096, 24576), (12288, 4096))  # fmt: skip
    ms = (16, 2048) if args.quick else (1, 16, 64, 256, 2048, 8192)
    rows, detail = [], []
    for k, n in shapes:
        w_bf = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
        sets, bf_sets = [quantize_rows_nvfp4(w_bf)], [w_bf]
        for m in ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            a = quantize_rows_nvfp4(x)
            nsets = rotation(n * k // 2) if m <= 64 else 1
            while len(sets) < nsets:
                sets.append(quantize_rows_nvfp4(torch.randn_like(w_bf) / k**0.5))
            ws = sets[:nsets]
            # cuBLAS reads its bf16 weights past the L2 too (the same rotation rule, 2 bytes a value)
            nbf = rotation(2 * n * k) if m <= 64 else 1
            while len(bf_sets) < nbf:
                bf_sets.append(torch.randn_like(w_bf) / k**0.5)
            bfs = bf_sets[:nbf]
            y = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
            t_bf16 = time_graph_us([partial(F.linear, x, b) for b in bfs], rep_ms=args.rep_ms)
            default = nv.nvfp4_launch_config(m, n, k)
            ref = nv.nvfp4_linear(*a, *ws[0], config=default).double()
            tol = 2.0**-7 * ref.abs() + 2.0**-7 * ref.abs().max()
            times = {}
            for c in candidates(m, n, k):
                try:
                    got = nv.nvfp4_linear(*a, *ws[0], config=c).double()
                    if not ((got - ref).abs() <= tol).all():
                        print(f"  {name(c)}: output outside the bound", flush=True)
                        continue
                    times[name(c)] = time_graph_us(
                        [partial(nv.nvfp4_linear, *a, *w, out=y, config=c) for w in ws],
                        rep_ms=args.rep_ms,
                    )
                except Exception as e:  # a tile that does not fit (shared memory, registers)
                    print(f"  {name(c)}: {type(e).__name__}: {str(e)[:120]}", flush=True)
            t_def = time_graph_us(
                [partial(nv.nvfp4_linear, *a, *w, out=y) for w in ws], rep_ms=args.rep_ms
            )
            best = min(times, key=times.get)
            floor_us = (n * k // 2 + n * k // 16) / 3.35e6 if m <= 64 else float("nan")
            rows.append({
                "M": m, "K": k, "N": n, "cublas_bf16_us": t_bf16, "default": name(default),
                "default_us": t_def, "best": best, "best_us": times[best],
                "best_tflops": 2 * m * n * k / times[best] / 1e6,
                "x_cublas_best": t_bf16 / times[best], "nvfp4_weight_floor_us": floor_us,
            })  # fmt: skip
            detail.append({"M": m, "K": k, "N": n, "times": times})
            print(markdown_table(rows[-1:]), flush=True)
            if args.json:  # after every shape, so a run cut short keeps what it measured
                Path(args.json).write_text(json.dumps({"rows": rows, "detail": detail}, indent=1))
    print(markdown_table(rows))


if __name__ == "__main__":
    main()
