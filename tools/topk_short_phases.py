#!/usr/bin/env python3
"""Where a short top-K row's time goes: phase timing of the CUDA finishing block.

    python3 tools/topk_short_phases.py [--json OUT.json]

Rows of at most ``cuda_select.SHORT_MAX`` elements are one block's work (docs/kernels/topk.md).
This compiles a copy of the CUDA source with ``clock64`` stamps at the block's phase boundaries
(each after a ``__syncthreads``, read by thread 0 of block 0), runs fp32 rows at B = 1, and prints
microseconds per phase (clock rate from ``%globaltimer`` over the same span), then the CUDA-graph
time per call of the unmodified source at B = 1 / 64 on ``randn``, ReLU and all-zero rows. The
stamps are placed by matching lines of ``select.cu`` / ``select_block.cu``
(``stamped_source`` fails by name when one no longer matches). Run it through
``tools/gpu_run.py``'s environment (every ``packages/*/src`` on ``PYTHONPATH``), needs CuPy.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = sorted(str(p) for p in (ROOT / "packages").glob("*/src"))

from flashrt_kernels.topk import cuda_select  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from topk_timeline import _patch  # noqa: E402  (edits inside one kernel's definition)

PRELUDE = r"""
__device__ long long g_stamp[16];
__device__ long long g_wall[2];
#define STAMP(i) do { __syncthreads(); if (threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0) g_stamp[i] = clock64(); } while (0)
#define WALL(i) do { if (threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0) { long long t_; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_)); g_wall[i] = t_; } } while (0)
"""
# (line of the source, the same with a stamp): phases end at stamps 1..7
STAMPS = [
    (
        "    grid_dependency_wait();\n    int b = blockIdx.y;",
        "    grid_dependency_wait();\n    WALL(0);\n    STAMP(0);\n    int b = blockIdx.y;",
    ),
    (
        "    if (DT == 0) cp_async_wait_all();\n    __syncthreads();",
        "    if (DT == 0) cp_async_wait_all();\n    STAMP(1);",
    ),
    (
        "        find_bucket_warps(hist, HIST_BINS, kk, scratch + 64, scratch);\n",
        "        STAMP(2);\n        find_bucket_warps(hist, HIST_BINS, kk, scratch + 64, scratch);\n"
        "        STAMP(3);\n",
    ),
    (
        "            SmemPairs src{ck, ci};\n",
        "            STAMP(4);\n            SmemPairs src{ck, ci};\n",
    ),
    (
        "            emit_regions<DT>(ck, ci, t, ties, oi, ov, row, scratch);\n",
        "            STAMP(5);\n"
        "            emit_regions<DT>(ck, ci, t, ties, oi, ov, row, scratch);\n"
        "            STAMP(6);\n",
    ),
    (
        "    row_end<DT>(oi, ov, kk, k, ",
        "    STAMP(7);\n    WALL(1);\n    row_end<DT>(oi, ov, kk, k, ",
    ),
]
SHARED = 1  # STAMPS[1] is in load_short_row; the others in finish_kernel
PHASES = ["copy", "pass 0 histogram", "pass 0 bucket", "compaction", "passes 1-2", "emission",
          "pads"]  # fmt: skip


def stamped_source() -> str:
    """The CUDA source with the phase stamps; a ValueError names a line that no longer matches."""
    src = PRELUDE + cuda_select.source()
    line, stamped = STAMPS[SHARED]
    if src.count(line) != 1:
        raise ValueError(f"topk_short_phases: expected one match of {line!r} in the source")
    src = src.replace(line, stamped)
    return _patch(src, "finish_kernel", [e for i, e in enumerate(STAMPS) if i != SHARED])


def _use(src: str | None):
    """Route cuda_select's launches through a module built from ``src`` (None: the original)."""
    import cupy

    if src is None:
        cuda_select._module = _ORIGINAL
        cuda_select._kernel.cache_clear()
        return None
    names = [f"{f}<{d}>" for f in cuda_select.KERNELS for d in (0, 1, 2)]
    mod = cupy.RawModule(code=src, options=("-std=c++17",), name_expressions=names)
    cuda_select._module = lambda: mod
    cuda_select._kernel.cache_clear()
    return mod


_ORIGINAL = cuda_select._module


def phases(n: int, k: int, reps: int = 5) -> dict:
    import cupy
    import numpy as np
    import torch

    from flashrt_kernels.topk.api import topk

    mod = _use(stamped_source())
    stamps = cupy.ndarray((16,), cupy.int64, mod.get_global("g_stamp"))
    wall = cupy.ndarray((2,), cupy.int64, mod.get_global("g_wall"))
    x = torch.randn(1, n, device="cuda")
    runs = []
    for _ in range(reps):
        stamps[:] = 0
        topk(x, k, backend="cuda")
        torch.cuda.synchronize()
        s = stamps.get()[:8].astype(np.float64)
        ns = float(wall.get()[1] - wall.get()[0])
        if np.any(s == 0):
            raise RuntimeError("topk_short_phases: a phase was not stamped (not the short path?)")
        ghz = (s[7] - s[0]) / ns
        runs.append([ns / 1000, ghz] + list(np.diff(s) / ghz / 1000))
    med = np.median(np.array(runs[1:]), axis=0)  # the first run compiles and warms up
    _use(None)
    row = {"n": n, "k": k, "block_us": round(float(med[0]), 2), "ghz": round(float(med[1]), 3)}
    row.update({name: round(float(v), 2) for name, v in zip(PHASES, med[2:], strict=True)})
    return row


def graph_times(b: int, n: int, k: int, rows: str) -> dict:
    import torch

    from flashrt_kernels.benchmarking import time_graph_us
    from flashrt_kernels.topk import reference
    from flashrt_kernels.topk.api import topk

    xs = [torch.randn(b, n, device="cuda") for _ in range(16)]
    xs = [x.relu() for x in xs] if rows == "relu" else xs
    xs = [torch.zeros_like(x) for x in xs] if rows == "zeros" else xs
    ov = [torch.empty(b, k, device="cuda") for _ in xs]
    oi = [torch.empty(b, k, dtype=torch.int32, device="cuda") for _ in xs]

    def call(j):
        return lambda: topk(xs[j], k, out_values=ov[j], out_indices=oi[j])

    call(0)()
    want = reference.topk(xs[0], k)
    exact = torch.equal(oi[0], want[1]) and torch.equal(ov[0], want[0])
    us = time_graph_us([call(j) for j in range(len(xs))], rep_ms=50)
    return {"b": b, "n": n, "k": k, "rows": rows, "graph_us": round(us, 2), "exact": exact}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args()
    from flashrt_kernels.benchmarking import markdown_table

    rows = [phases(n, k) for n in (8192, 32768) for k in (512, 2048)]
    print(markdown_table(rows), flush=True)
    cells = [(1, 8192, "randn"), (64, 8192, "randn"), (1, 32768, "randn"), (64, 32768, "randn"),
             (1, 32768, "relu"), (1, 32768, "zeros")]  # fmt: skip
    times = [graph_times(b, n, 512, kind) for b, n, kind in cells]
    print(markdown_table(times), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"phases": rows, "graph": times}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
