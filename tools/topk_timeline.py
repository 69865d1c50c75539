#!/usr/bin/env python3
"""Where a long top-K row's time goes: a timeline of one call's launches, replayed in a CUDA graph.

    python3 tools/topk_timeline.py [--cells B,N,K ...] [--reps 30] [--json OUT.json]

Rows longer than ``cuda_select.SHORT_MAX`` take several launches (docs/kernels/topk.md): the
bound (hint-free only), the counting pass, three step launches and the finishing block. This
compiles a copy of the CUDA source with ``%globaltimer`` stamps (nanoseconds, one clock for every
SM) at the launches' boundaries and inside the bound's ranking and the finishing block, read
by thread 0 of block 0 (or of the row's last block to arrive), launches it the way the backend
does (``cuLaunchKernelEx`` with programmatic dependent launch, through ``cuda.bindings``),
captures one call in a CUDA graph and replays it; each event
is printed in microseconds after the first launch's start (median over the replays), beside the
graph time per call of the same stamped source. fp32 ``ScoreChain`` rows (drift 0.02, the
``topk`` benchmark's chain); the hint is the exact top-k of the step before. The stamps are
placed by matching lines of ``select.cu`` (``stamped_source`` fails by name when one no longer
matches). Run it through ``tools/gpu_run.py``'s environment (every ``packages/*/src`` on
``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = sorted(str(p) for p in (ROOT / "packages").glob("*/src"))

from flashrt_kernels.topk import cuda_select  # noqa: E402

EVENTS = ["bound start", "bound last block", "bound maxima staged", "bound ranked",
          "count start (first block)", "count start (last block)", "count thresholds",
          "count last block", "count end", "step 1 start", "step 2 start", "step 3 start",
          "finish start", "finish gathered", "finish searched", "finish emitted",
          "finish end"]  # fmt: skip
SLOTS = len(EVENTS)
PRELUDE = rf"""
__device__ unsigned long long g_ev[{SLOTS}];
__device__ int g_step;
__device__ __forceinline__ unsigned long long now_ns() {{
    unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }}
#define EV(i) do {{ if (threadIdx.x == 0) g_ev[i] = now_ns(); }} while (0)
#define EV0(i) do {{ if (threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0) \
    g_ev[i] = now_ns(); }} while (0)
#define EVSYNC(i) do {{ __syncthreads(); if (threadIdx.x == 0 && blockIdx.x == 0 && \
    blockIdx.y == 0) \
    g_ev[i] = now_ns(); }} while (0)
"""
WAIT = "    grid_dependency_wait();\n"


def _kernel_span(src: str, name: str) -> tuple[int, int]:
    """[start, end) of kernel ``name``'s definition (its signature to its body's closing brace)."""
    m = re.search(r"__global__ void __launch_bounds__\([^)]*\) " + name + r"\(", src)
    if m is None:
        raise ValueError(f"topk_timeline: kernel {name} not found")
    depth, i = 0, src.index("{", m.end())
    while True:
        depth += {"{": 1, "}": -1}.get(src[i], 0)
        i += 1
        if depth == 0:
            return m.start(), i


def _patch(src: str, name: str, edits: list[tuple[str, str]]) -> str:
    a, b = _kernel_span(src, name)
    body = src[a:b]
    for old, new in edits:
        if body.count(old) != 1:
            raise ValueError(f"topk_timeline: expected one {old!r} in {name}")
        body = body.replace(old, new)
    return src[:a] + body + src[b:]


def _ev(name: str) -> int:
    return EVENTS.index(name)


LAST = "    if (!last_to_arrive(cr, S, scratch + 48)) return;\n"
STEP = (f"    if (threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0) "
        f"g_ev[{_ev('step 1 start')} + atomicAdd(&g_step, 1) % 3] = now_ns();\n")  # fmt: skip
# kernel -> (line of the source, the same with its stamps, the events those stamps write)
STAMPS = {
    "bound_kernel": [
        (WAIT, WAIT + f"    EV0({_ev('bound start')});\n", ["bound start"]),
        (LAST, LAST + f"    EV({_ev('bound last block')});\n", ["bound last block"]),
        ("    nnz = scratch[58];\n",
         f"    nnz = scratch[58];\n    EV({_ev('bound maxima staged')});\n",
         ["bound maxima staged"]),
        ("    if (threadIdx.x == 0) {\n        cr[C_LO] = (int)prefix;",
         f"    EV({_ev('bound ranked')});\n    if (threadIdx.x == 0) {{\n"
         "        cr[C_LO] = (int)prefix;", ["bound ranked"]),
    ],
    "count_kernel": [
        (WAIT, WAIT + f"    EV0({_ev('count start (first block)')});\n"
         f"    if (threadIdx.x == 0) atomicMax(&g_ev[{_ev('count start (last block)')}], now_ns());\n",
         ["count start (first block)", "count start (last block)"]),
        ("    int2* my = seg + ((long long)b * S + c) * segcap;\n",
         f"    EV0({_ev('count thresholds')});\n    int2* my = seg + ((long long)b * S + c) * segcap;\n",
         ["count thresholds"]),
        (LAST, LAST + f"    EV({_ev('count last block')});\n", ["count last block"]),
        ("        cr[C_ARRIVED] = 0;\n    }\n}",
         f"        cr[C_ARRIVED] = 0;\n    }}\n    EV({_ev('count end')});\n}}", ["count end"]),
    ],
    "step_kernel": [(WAIT, WAIT + STEP, ["step 1 start", "step 2 start", "step 3 start"])],
    "finish_kernel": [
        (WAIT, WAIT + f"    EV0({_ev('finish start')});\n", ["finish start"]),
        ("        SmemPairs src{keys, ix};\n",
         f"        EVSYNC({_ev('finish gathered')});\n        SmemPairs src{{keys, ix}};\n",
         ["finish gathered"]),
        ("        block_emit<DT>(src, total, t, ties, oi, ov, row, scratch, nullptr);\n",
         f"        EVSYNC({_ev('finish searched')});\n"
         "        block_emit<DT>(src, total, t, ties, oi, ov, row, scratch, nullptr);\n"
         f"        EVSYNC({_ev('finish emitted')});\n", ["finish searched", "finish emitted"]),
        ("    row_end<DT>(oi, ov, kk, k, ",
         f"    EVSYNC({_ev('finish end')});\n    row_end<DT>(oi, ov, kk, k, ", ["finish end"]),
    ],
}  # fmt: skip


def stamped_source() -> str:
    """The CUDA source with the timeline stamps; a ValueError names a line that no longer matches."""
    src = PRELUDE + cuda_select.source()
    for kernel, edits in STAMPS.items():
        src = _patch(src, kernel, [(old, new) for old, new, _ in edits])
    return src


class _Globals:
    """The stamped module's ``g_ev`` / ``g_step``, reset and read through a torch tensor."""

    def __init__(self, module):
        import torch
        from cuda.bindings import driver

        self.driver = driver
        self.ev = self._get(module, b"g_ev")
        self.step = self._get(module, b"g_step")
        self.buf = torch.zeros(SLOTS + 1, dtype=torch.int64, device="cuda")

    def _get(self, module, name: bytes) -> int:
        err, ptr, _ = self.driver.cuModuleGetGlobal(module, name)
        if int(err) != 0:
            raise RuntimeError(f"topk_timeline: cuModuleGetGlobal({name!r}) failed ({err})")
        return int(ptr)

    def reset(self) -> None:
        import torch

        torch.cuda.synchronize()
        self.buf.zero_()
        self.driver.cuMemcpyDtoD(self.ev, self.buf.data_ptr(), 8 * SLOTS)
        self.driver.cuMemcpyDtoD(self.step, self.buf.data_ptr(), 4)
        torch.cuda.synchronize()

    def read(self) -> list[int]:
        import torch

        torch.cuda.synchronize()
        self.driver.cuMemcpyDtoD(self.buf.data_ptr(), self.ev, 8 * SLOTS)
        torch.cuda.synchronize()
        return [int(x) for x in self.buf[:SLOTS].tolist()]


def _use_stamped():
    """Route cuda_select's launches (NVRTC, PDL) through the stamped source; its globals."""
    stamped = stamped_source()
    cuda_select.source = lambda: stamped
    cuda_select.compiler = lambda: "nvrtc"
    cuda_select._nvrtc_module.cache_clear()
    cuda_select._kernel.cache_clear()
    return _Globals(cuda_select._nvrtc_module(0)._module)


def timeline(b: int, n: int, k: int, hinted: bool, g: _Globals, reps: int) -> dict:
    import numpy as np
    import torch

    from flashrt_kernels.benchmarking import time_graph_us
    from flashrt_kernels.testing.chains import ScoreChain
    from flashrt_kernels.topk import reference
    from flashrt_kernels.topk.api import topk

    chain = ScoreChain(b, n, drift=0.02, seed=1, device="cuda")
    prev, _ = chain.step()
    x, _ = chain.step()
    hint = reference.topk(prev.cpu(), k)[1].to("cuda") if hinted else None
    ov = torch.empty(b, k, device="cuda")
    oi = torch.empty(b, k, dtype=torch.int32, device="cuda")

    def call():
        topk(x, k, hint=hint, out_values=ov, out_indices=oi, backend="cuda")

    call()
    want = reference.topk(x.cpu(), k)
    exact = torch.equal(oi.cpu(), want[1]) and torch.equal(ov.cpu(), want[0])
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    runs = []
    for _ in range(reps + 1):
        g.reset()
        graph.replay()
        ev = np.array(g.read(), dtype=np.float64)
        t0 = ev[_ev("bound start") if not hinted else _ev("count start (first block)")]
        runs.append(np.where(ev > 0, (ev - t0) / 1000.0, np.nan))
    med = np.nanmedian(np.array(runs[1:]), axis=0)
    row = {"B": b, "N": n, "K": k, "path": "hinted" if hinted else "hint-free", "exact": exact,
           "graph_us": round(time_graph_us([call], rep_ms=20), 2)}  # fmt: skip
    row.update(
        {e: (None if np.isnan(v) else round(float(v), 2)) for e, v in zip(EVENTS, med, strict=True)}
    )
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cells", nargs="*", default=["1,1048576,512", "1,1048576,2048",
                                                   "1,131072,1024", "8,262144,2048"])  # fmt: skip
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args()
    from flashrt_kernels.benchmarking import markdown_table

    g = _use_stamped()
    rows = []
    for cell in args.cells:
        b, n, k = (int(v) for v in cell.split(","))
        for hinted in (False, True):
            rows.append(timeline(b, n, k, hinted, g, args.reps))
            print(rows[-1], flush=True)
    cols = ["B", "N", "K", "path", "exact", "graph_us", *EVENTS]
    print(markdown_table(rows, cols))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
