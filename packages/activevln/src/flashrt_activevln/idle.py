"""Where the GPU idles, read from a ``torch.profiler`` Chrome trace (``export_chrome_trace``).

Device activity is every kernel, copy and memset in the trace. An idle gap is the time between
the end of all earlier activity and the start of the next one, kept when it lasts at least
``min_gap_us``. Each gap is put down to what ended it:
- ``graph kernel``: a kernel of a CUDA graph (its correlation id is a ``cudaGraphLaunch``'s): the
  GPU waited for the host to submit the graph (launch cost grows with the graph's node count);
- ``pinned upload`` / ``pageable upload``: a host-to-device copy from pinned / pageable memory:
  the GPU waited for the host work that produced the data, or for a blocking pageable copy;
- ``eager kernel``: a kernel launched on its own: the GPU waited for the host to launch it;
- ``other copy``: any other copy or memset.

``graph_launches`` lists every ``cudaGraphLaunch``: its host time, the kernels it submitted and
how long after the call began the first of them started (which includes any wait for work
already queued on the stream).
"""

from __future__ import annotations

DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
CAUSES = ("graph kernel", "pinned upload", "pageable upload", "eager kernel", "other copy")


def _correlation(event: dict):
    return event.get("args", {}).get("correlation")


def _device_events(events: list[dict]) -> list[dict]:
    out = [e for e in events if e.get("ph") == "X" and e.get("cat") in DEVICE_CATEGORIES]
    return sorted(out, key=lambda e: e["ts"])


def _graph_calls(events: list[dict]) -> list[dict]:
    """The ``cudaGraphLaunch`` host calls, in time order."""
    calls = [e for e in events if e.get("ph") == "X" and e.get("name") == "cudaGraphLaunch"]
    return sorted(calls, key=lambda e: e["ts"])


def cause(event: dict, graph_ids: set) -> str:
    """What a gap ending at device ``event`` waited for (one of ``CAUSES``)."""
    if event.get("cat") == "kernel":
        return "graph kernel" if _correlation(event) in graph_ids else "eager kernel"
    name = event.get("name", "")
    if event.get("cat") == "gpu_memcpy" and "HtoD" in name:
        return "pageable upload" if "Pageable" in name else "pinned upload"
    return "other copy"


def idle_gaps(events: list[dict], min_gap_us: float = 5.0) -> dict:
    """{"span_us", "busy_us", "idle_us", "causes": {cause: {"gaps", "idle_us"}}} over the
    trace's device activity (all streams together); ``idle_us`` counts the gaps of at least
    ``min_gap_us`` (shorter ones count as busy)."""
    dev = _device_events(events)
    causes = {c: {"gaps": 0, "idle_us": 0.0} for c in CAUSES}
    if not dev:
        return {"span_us": 0.0, "busy_us": 0.0, "idle_us": 0.0, "causes": causes}
    graph_ids = {_correlation(e) for e in _graph_calls(events)} - {None}
    start, end, idle = dev[0]["ts"], dev[0]["ts"] + dev[0]["dur"], 0.0
    for e in dev[1:]:
        gap = e["ts"] - end
        if gap >= min_gap_us:
            c = causes[cause(e, graph_ids)]
            c["gaps"] += 1
            c["idle_us"] += gap
            idle += gap
        end = max(end, e["ts"] + e["dur"])
    span = end - start
    return {"span_us": span, "busy_us": span - idle, "idle_us": idle, "causes": causes}


def graph_launches(events: list[dict]) -> list[dict]:
    """Per ``cudaGraphLaunch`` in time order: host_us (the call), kernels (that it submitted)
    and first_kernel_us (from the call's start to its first kernel's start; None if none)."""
    kernels: dict = {}
    for e in _device_events(events):
        if e.get("cat") == "kernel":
            kernels.setdefault(_correlation(e), []).append(e)
    out = []
    for call in _graph_calls(events):
        ks = kernels.get(_correlation(call), [])
        first = min((k["ts"] for k in ks), default=None)
        out.append({
            "host_us": call["dur"], "kernels": len(ks),
            "first_kernel_us": None if first is None else first - call["ts"],
        })  # fmt: skip
    return out


def report(events: list[dict], min_gap_us: float = 5.0) -> str:
    """Markdown: the idle time by cause, then graph launches grouped by node count."""
    gaps = idle_gaps(events, min_gap_us)
    if not gaps["span_us"]:
        return "no device activity in the trace"
    span = gaps["span_us"]
    lines = [
        f"GPU idle {gaps['idle_us'] / 1000:.2f} ms of a {gaps['span_us'] / 1000:.2f} ms span "
        f"({gaps['idle_us'] / span:.0%}); gaps of at least {min_gap_us:g} us, by what ended them:",
        "",
        "| ended by | gaps | idle ms | share of the span |",
        "|---|---|---|---|",
    ]
    for name in CAUSES:
        c = gaps["causes"][name]
        lines.append(f"| {name} | {c['gaps']} | {c['idle_us'] / 1000:.2f} | "
                     f"{c['idle_us'] / span:.1%} |")  # fmt: skip
    launches = graph_launches(events)
    if launches:
        by_size: dict[int, list[dict]] = {}
        for g in launches:
            by_size.setdefault(g["kernels"], []).append(g)
        lines += ["", "| graph kernels | launches | host us per launch | first kernel after (us) |",
                  "|---|---|---|---|"]  # fmt: skip
        for size, group in sorted(by_size.items()):
            host = sorted(g["host_us"] for g in group)
            first = sorted(g["first_kernel_us"] for g in group if g["first_kernel_us"] is not None)
            span_first = f"{first[0]:.0f}-{first[-1]:.0f}" if first else "-"
            lines.append(f"| {size} | {len(group)} | {host[0]:.0f}-{host[-1]:.0f} | {span_first} |")
    return "\n".join(lines)
