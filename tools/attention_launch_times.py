#!/usr/bin/env python3
"""Where a decode or tree-verification call of ``gqa_attention``'s tiles spends its time: each
launch of one call (the narrow tiles, the wide tiles, the split combine) timed on the device by
the torch profiler over replays of a CUDA graph of that call, without PDL (so that no launch's
time includes waiting on the one before), beside the graph time of the call as the ``attention``
benchmark takes it (with PDL, over rotated input sets).

    python3 tools/attention_launch_times.py --out FILE.json [--heads 16/2] [--batch 8]
                                            [--nodes 1,24,64] [--lengths 64,2048,8192]
                                            [--src DIR]

Masks: random trees as bit rows (the benchmark's ``ours_bits_us``); one node is a decode step.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--heads", default="16/2")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--nodes", default="1,24,64")
    ap.add_argument("--lengths", default="64,2048,8192")
    ap.add_argument("--src", default=str(Path(__file__).resolve().parent.parent),
                    help="the packages of another copy (DIR/packages/*/src)")  # fmt: skip
    args = ap.parse_args()
    sys.path[:0] = sorted(str(p) for p in Path(args.src).glob("packages/*/src"))
    import torch
    from torch.profiler import ProfilerActivity, profile

    from flashrt_kernels.attention import bench, reference
    from flashrt_kernels.attention.gqa_kernels import launch_gqa_tiles
    from flashrt_kernels.benchmarking import environment, markdown_table

    hq, hkv = (int(v) for v in args.heads.split("/"))
    reps = 20
    rows = []
    for n in (int(v) for v in args.nodes.split(",")):
        for length in (int(v) for v in args.lengths.split(",")):
            sets, cl, ql, _ = bench._decode_sets(args.batch, length, n, hq, hkv, n > 1)
            row = {"heads": args.heads, "B": args.batch, "nodes": n, "L": length}
            row["graph_us"] = bench._ours_decode(sets, cl, ql, None, bits=n > 1)
            q, k, v, mask, out, ws = sets[0]
            bits = reference.pack_tree_mask(mask) if n > 1 else None

            def call(q=q, k=k, v=v, out=out, ws=ws, bits=bits, n=n, cl=cl, ql=ql):
                launch_gqa_tiles(q, k, v, out, cl, ql, q_starts=None, cache_rows=None, mask=bits,
                                 mask_mode=2 if n > 1 else 0, q_max=n, split=True, workspace=ws,
                                 scale=bench.D**-0.5, config={"PDL": False})  # fmt: skip

            call()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                call()
            for _ in range(5):
                graph.replay()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(reps):
                    graph.replay()
                torch.cuda.synchronize()
            events = [e for e in prof.events() if e.device_type.name == "CUDA"]
            per_call = len(events) // reps
            for i in range(per_call):
                same = [events[r * per_call + i] for r in range(reps)]
                name = f"{i}:{same[0].name.split('_kernel')[0]}_us"
                row[name] = sum(getattr(e, "device_time", 0.0) or e.cuda_time for e in same) / reps
            rows.append(row)
            print(json.dumps(row), flush=True)
            del sets
    print(markdown_table(rows))
    Path(args.out).write_text(json.dumps({"env": environment(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
