"""Benchmark harness: timing through CUDA graphs with rotated inputs, measured ceilings, floors,
and result tables.

Protocol (every family's benchmark follows it): each timed callable is captured in a CUDA graph
that calls it once per input set, over enough input sets to exceed the L2 several times when one
set is smaller than that; the graph is replayed under ``triton.testing.do_bench`` and the median per
call is reported. Baselines are timed the same way in the same run. The floor of a case is the
larger of its bytes over the measured copy bandwidth and its FLOPs over a stated peak.
"""

from __future__ import annotations

import functools
import json
import math
import platform
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

L2_BYTES = 60 * 2**20  # H200; only used to size input rotation


@functools.cache
def copy_bandwidth_bytes_per_s() -> float:
    """Device-to-device copy bandwidth (bytes read + written per second), measured once."""
    import triton.testing

    n = 512 * 2**20
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=200, return_mode="median")
    return 2 * n / (ms * 1e-3)


def rotation(bytes_per_call: int, limit: int = 64) -> int:
    """How many input sets to cycle through so the sets together exceed 3x the L2."""
    return max(2, min(limit, math.ceil(3 * L2_BYTES / max(1, bytes_per_call))))


def time_graph_us(calls: Sequence[Callable[[], Any]], *, rep_ms: int = 100) -> float:
    """Median microseconds per call of ``calls`` (one per input set), replayed as one CUDA graph."""
    import triton.testing

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in calls:  # warm-up: compile and autotune outside the capture
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in calls:
            fn()
    ms = triton.testing.do_bench(graph.replay, warmup=25, rep=rep_ms, return_mode="median")
    return ms * 1e3 / len(calls)


def floor_us(bytes_moved: float, flops: float = 0.0, peak_flops: float | None = None) -> float:
    t = bytes_moved / copy_bandwidth_bytes_per_s()
    if flops and peak_flops:
        t = max(t, flops / peak_flops)
    return t * 1e6


def environment() -> dict[str, Any]:
    import triton

    env = {
        "date": time.strftime("%Y-%m-%d"),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(
            gpu=props.name,
            sms=props.multi_processor_count,
            capability=f"{props.major}.{props.minor}",
            copy_bandwidth_tb_s=round(copy_bandwidth_bytes_per_s() / 1e12, 3),
        )
    return env


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if v == 0 or 0.01 <= abs(v) < 1e5:
            return f"{v:.2f}" if abs(v) < 100 else f"{v:.1f}"
        return f"{v:.3g}"
    return str(v)


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    if not rows:
        return "(no rows)\n"
    columns = list(columns or rows[0].keys())
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r.get(c, "")) for c in columns) + " |")
    return "\n".join(lines) + "\n"


def write_results(name: str, rows: list[dict[str, Any]], out_dir: str | Path) -> tuple[Path, Path]:
    """Write ``<name>.json`` (rows + environment) and ``<name>.md`` (the table) to ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    env = environment()
    js = out / f"{name}.json"
    md = out / f"{name}.md"
    js.write_text(json.dumps({"benchmark": name, "environment": env, "rows": rows}, indent=1))
    header = ", ".join(f"{k} {v}" for k, v in env.items())
    md.write_text(f"### {name}\n\n{header}\n\n{markdown_table(rows)}")
    return js, md
