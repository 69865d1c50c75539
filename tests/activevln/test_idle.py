"""The trace reader behind tools/profile_activevln.py's idle report (synthetic traces)."""

from flashrt_activevln.idle import graph_launches, idle_gaps, report


def _dev(cat, name, ts, dur, corr):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur,
            "args": {"correlation": corr}}  # fmt: skip


def _trace():
    return [
        _dev("kernel", "eager_a", 0.0, 10.0, 1),
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaGraphLaunch",
            "ts": 12.0,
            "dur": 30.0,
            "args": {"correlation": 2},
        },  # fmt: skip
        _dev("kernel", "graph_k0", 40.0, 10.0, 2),  # gap 30: the graph's submission
        _dev("kernel", "graph_k1", 52.0, 8.0, 2),  # gap 2: under the threshold, busy
        _dev("kernel", "side_stream", 53.0, 2.0, 3),  # inside graph_k1: no gap
        _dev("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 80.0, 10.0, 4),  # gap 20
        _dev("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 100.0, 5.0, 5),  # gap 10
        _dev("kernel", "eager_b", 205.0, 5.0, 6),  # gap 100
        _dev("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", 216.0, 4.0, 7),  # gap 6
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 300.0, "dur": 50.0},  # host only
    ]


def test_gaps_are_put_down_to_what_ended_them():
    g = idle_gaps(_trace(), min_gap_us=5.0)
    assert g["span_us"] == 220.0
    c = g["causes"]
    assert c["graph kernel"] == {"gaps": 1, "idle_us": 30.0}
    assert c["pinned upload"] == {"gaps": 1, "idle_us": 20.0}
    assert c["pageable upload"] == {"gaps": 1, "idle_us": 10.0}
    assert c["eager kernel"] == {"gaps": 1, "idle_us": 100.0}
    assert c["other copy"] == {"gaps": 1, "idle_us": 6.0}
    assert g["idle_us"] == 166.0 and g["busy_us"] == 54.0  # the 2 us gap counts as busy
    assert idle_gaps(_trace(), min_gap_us=50.0)["idle_us"] == 100.0


def test_graph_launches_and_report():
    (launch,) = graph_launches(_trace())
    assert launch == {"host_us": 30.0, "kernels": 2, "first_kernel_us": 28.0}
    text = report(_trace())
    assert "GPU idle 0.17 ms of a 0.22 ms span (75%)" in text
    assert "| eager kernel | 1 | 0.10 | 45.5% |" in text
    assert "| 2 | 1 | 30-30 | 28-28 |" in text
    assert report([]) == "no device activity in the trace"
