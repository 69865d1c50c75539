#!/usr/bin/env python3
"""Few-row linears of this tree against another copy of the packages, shape by shape, on the GPU.

    python3 tools/gemm_ab.py --baseline build/base --shapes 11008x2048 12288x4096 [--rows 1 16 64]
                             [--split-for 4096:2 8192:8] [--json OUT.json]

Each tree runs ``gemm.bench._few_rows_shape`` (the ``gemm`` benchmark's protocol: CUDA graphs over
rotated weight sets, cuBLAS and torch's int4 kernel beside ours) in its own process; the table
shows every timed column of both with baseline / ours (above 1: this tree is faster). cuBLAS
and torch int4 are in both runs: their ratio says how much the two processes' clocks differ.
``--split-for K:S ...`` (this tree only) replaces the few-row linears' split of K
(``few_rows.split_for``: S splits from K on, the largest K that applies; 1 below them), an
experiment: the split is part of the bits contract, a function of K alone, so it never changes
inside a run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COLUMNS = ("cublas_us", "bf16_us", "w8a16_int8_us", "w4a8_us", "w4a8_prologue_us", "torch_int4_us")


def _split_rule(rules: list[str]):
    steps = sorted(tuple(int(v) for v in r.split(":")) for r in rules)
    return lambda k: next((s for lo, s in reversed(steps) if k >= lo), 1)


def _measure(shapes, rows, split_for=None) -> list[dict]:
    import torch

    from flashrt_kernels.gemm import few_rows
    from flashrt_kernels.gemm.bench import _few_rows_shape

    if split_for:
        few_rows.split_for = _split_rule(split_for)

    out = []
    for k, n in shapes:
        out += _few_rows_shape(k, n, rows)
        print(f"  {k} -> {n} done", file=sys.stderr, flush=True)
        torch.cuda.empty_cache()
    return out


def _run_tree(tree: Path, args, split_for=None) -> list[dict]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(sorted(str(p) for p in (tree / "packages").glob("*/src")))
    cmd = [sys.executable, __file__, "--child", "--shapes", *args.shapes,
           "--rows", *map(str, args.rows)]  # fmt: skip
    if split_for:
        cmd += ["--split-for", *split_for]
    print(f"timing {tree} ...", file=sys.stderr, flush=True)
    res = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, check=True, text=True)
    return json.loads(res.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", type=Path, help="a copy of the repository (its packages/*/src)")
    ap.add_argument("--shapes", nargs="+", required=True, help="KxN, e.g. 11008x2048")
    ap.add_argument("--rows", nargs="+", type=int, default=[1, 16, 64])
    ap.add_argument("--split-for", nargs="+", metavar="K:S", help="this tree's split of K")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in s.lower().split("x")) for s in args.shapes]
    if args.child:
        print(json.dumps(_measure(shapes, tuple(args.rows), args.split_for)))
        return
    if args.baseline is None:
        ap.error("--baseline is required")
    ours, base = _run_tree(ROOT, args, args.split_for), _run_tree(args.baseline, args)
    if args.json:
        args.json.write_text(json.dumps({"ours": ours, "baseline": base}, indent=1))
    print("| K -> N | M | " + " | ".join(f"{c[:-3]} base / ours (x)" for c in COLUMNS) + " |")
    print("|---|---|" + "---|" * len(COLUMNS))
    for o, b in zip(ours, base, strict=True):
        cells = [f"{b[c]:.1f} / {o[c]:.1f} ({b[c] / o[c]:.2f})" for c in COLUMNS]
        print(f"| {o['K']} -> {o['N']} | {o['M']} | " + " | ".join(cells) + " |")
    cand = [c for c in ours[0] if c.startswith("w4a8[")]
    print("\nthis tree's W4A8 launch candidates, us (base's where it has them):")
    print("| K -> N | M | " + " | ".join(c[5:-4] for c in cand) + " |")
    print("|---|---|" + "---|" * len(cand))
    for o, b in zip(ours, base, strict=True):
        cells = [f"{o[c]:.1f}" + (f" ({b[c]:.1f})" if c in b else "") for c in cand]
        print(f"| {o['K']} -> {o['N']} | {o['M']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
