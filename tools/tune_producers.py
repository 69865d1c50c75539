#!/usr/bin/env python3
"""Sweep the row producers' launch shapes (rows a program, warps) on a GPU. No bit depends on
them (their sums are pairwise trees over fixed column segments), so only the time is compared.

    python3 tools/tune_producers.py --out RESULTS_DIR [--widths 1152 2048 4096 11008]

For each producer (LayerNorm -> INT8, RMSNorm + residual -> INT8 and -> NVFP4, SiLU-mul -> INT8)
and width, times every shape, and the NVFP4 producer's register-capped one where the code picks
it, at 1024, 4096 and 16384 rows (CUDA graphs over rotated inputs, as the `gemm_producers`
benchmark); prints the shape the code picks now and the one with the lowest summed time, each
with its floor fractions, and writes every timing to RESULTS_DIR/tune_producers.json.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = sorted(str(p) for p in (ROOT / "packages").glob("*/src"))

import torch  # noqa: E402
import triton  # noqa: E402

from flashrt_kernels.benchmarking import floor_us, rotation, time_graph_us  # noqa: E402
from flashrt_kernels.norm.rms_norm import column_split  # noqa: E402
from flashrt_kernels.quant import nvfp4_rows, rows  # noqa: E402

# the package binds the name layer_norm to the function; the module is wanted here
ln = importlib.import_module("flashrt_kernels.quant.layer_norm")

ROWS = (1024, 4096, 16384)
SHAPES = ((1, 1), (1, 2), (1, 4), (1, 8), (1, 16), (2, 4), (2, 8), (2, 16), (4, 8), (4, 16))


def _bf16(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)


def _layer_norm(n, k):
    a, b = column_split(k)
    w, bias = _bf16(k), _bf16(k)
    q, s = torch.empty(n, k, dtype=torch.int8, device="cuda"), torch.empty(n, device="cuda")
    xs = [_bf16(n, k) for _ in range(rotation(n * k * 3))]

    def call(x, shape):
        return lambda: ln._launch(x, w, bias, 1e-6, None, q, s, "int8", True, (a, b, *shape[:2]))

    return xs, call, n * k * 3 + n * 4, (*rows._producer_config(a + b), None)


def _rms(n, k, nvfp4):
    a, b = column_split(k)
    w = _bf16(k)
    ro = torch.empty(n, k, device="cuda", dtype=torch.bfloat16)
    if nvfp4:
        out = (torch.empty(n, k // 2, dtype=torch.uint8, device="cuda"),
               torch.empty(n, k // 16, dtype=torch.float8_e4m3fn, device="cuda"),
               torch.empty(n, device="cuda"))  # fmt: skip
        codes = n * k // 2 + n * k // 16
        module, attr, fn = nvfp4_rows, "producer_launch", nvfp4_rows.rms_norm_quantize_nvfp4
        current = nvfp4_rows.producer_launch(a + b)  # (rows, warps, maxnreg)
    else:
        out = (torch.empty(n, k, dtype=torch.int8, device="cuda"), torch.empty(n, device="cuda"))
        codes = n * k
        module, attr, fn = rows, "_producer_config", rows.rms_norm_quantize
        current = (*rows._producer_config(a + b), None)
    nbytes = n * k * 6 + codes + n * 4
    sets = [(_bf16(n, k), _bf16(n, k)) for _ in range(rotation(nbytes))]

    def call(pair, shape):
        def run():
            saved = getattr(module, attr)
            setattr(module, attr, lambda width: shape if nvfp4 else shape[:2])
            try:
                if nvfp4:
                    fn(pair[0], w, 1e-6, residual=pair[1], out=out, residual_out=ro)
                else:
                    fn(pair[0], w, 1e-6, "int8", residual=pair[1], out=out, residual_out=ro)
            finally:
                setattr(module, attr, saved)

        return run

    return sets, call, nbytes, current


def _silu(n, i):
    out = (torch.empty(n, i, dtype=torch.int8, device="cuda"), torch.empty(n, device="cuda"))
    nbytes = n * i * 5 + n * 4
    gus = [_bf16(n, 2 * i) for _ in range(rotation(nbytes))]

    def call(gu, shape):
        def run():
            saved = rows._producer_config
            rows._producer_config = lambda width: shape[:2]
            try:
                rows.silu_mul_quantize(gu, "int8", out=out)
            finally:
                rows._producer_config = saved

        return run

    return gus, call, nbytes, (*rows._producer_config(triton.next_power_of_2(i)), None)


PRODUCERS = {
    "layer_norm_int8": (_layer_norm, lambda k: sum(column_split(k))),
    "rms_norm_int8": (lambda n, k: _rms(n, k, False), lambda k: sum(column_split(k))),
    "rms_norm_nvfp4": (lambda n, k: _rms(n, k, True), lambda k: sum(column_split(k))),
    "silu_mul_int8": (_silu, triton.next_power_of_2),
}


def _shapes(name, width):
    """(rows a program, warps, maxnreg) with 4-64 elements a thread, uncapped (NVFP4: one row a
    program, two-row tiles spill; and the shape the code picks, which may cap the registers)."""
    for r, w in SHAPES:
        per_thread = width * r // (32 * w)
        if 4 <= per_thread <= 64 and not (name == "rms_norm_nvfp4" and r > 1):
            yield (r, w, None)
    if name == "rms_norm_nvfp4" and nvfp4_rows.producer_launch(width)[2] is not None:
        yield nvfp4_rows.producer_launch(width)


def _fracs(fracs, shape) -> str:
    return "/".join(f"{f:.2f}" for f in fracs.get(shape, []))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--widths", type=int, nargs="+", default=[1152, 2048, 4096, 11008])
    args = ap.parse_args()
    results, summary, t0 = [], [], time.time()
    for name, (make, padded) in PRODUCERS.items():
        for k in args.widths:
            totals, fracs, current = {}, {}, None
            for n in ROWS:
                inputs, call, nbytes, current = make(n, k)
                floor = floor_us(nbytes)
                for shape in _shapes(name, padded(k)):
                    us = time_graph_us([call(x, shape) for x in inputs], rep_ms=20)
                    totals[shape] = totals.get(shape, 0.0) + us
                    fracs.setdefault(shape, []).append(floor / us)
                    results.append({"producer": name, "cols": k, "rows": n, "rows_per_program":
                                    shape[0], "warps": shape[1], "maxnreg": shape[2], "us": us,
                                    "floor_frac": floor / us})  # fmt: skip
                del inputs
            best = min(totals, key=totals.get)
            cur = tuple(current)

            line = (f"{name:16s} cols {k:6d}: current {cur} {totals.get(cur, float('nan')):8.1f} us"
                    f" (floor {_fracs(fracs, cur)}); best {best} {totals[best]:8.1f} us (floor {_fracs(fracs, best)})"
                    f"  [{time.time() - t0:.0f} s]")  # fmt: skip
            print(line, flush=True)
            summary.append(line)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tune_producers.json").write_text(json.dumps({"rows": results, "summary": summary},
                                                        indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
