#!/usr/bin/env python3
"""The GQA tiles' split rule for wide rows (tree verification, a frame's prompt beside trees),
timed under variants of its query term in one process: the ``attention`` benchmark's tree cells
(B = 8; 16/2 heads at L = 2k / 8k / 32k, 32/8 at 8k; 24 and 64 nodes; masks as bit rows) with
SDPA beside them, and the replay-shaped steps of ``attention_step_sweep`` (x 0.25 / 1 / 2).

    python3 tools/attention_split_ab.py --out FILE.json

Each variant is a ``config`` override of ``splits.geometry`` (the kernels take the rule's keys
as constexprs), so the same code runs with another split size for wide rows; a row's outputs are
faithful either way (the split merge is exact in its own order), only their bits move.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path[:0] = sorted(str(p) for p in Path(__file__).resolve().parent.parent.glob("packages/*/src"))

VARIANTS = {
    "default": {},
    "floor512": {"QUERY_CHUNK_FLOOR": 512},
    "floor256": {"QUERY_CHUNK_FLOOR": 256},
    "floor512_splits8": {"QUERY_CHUNK_FLOOR": 512, "QUERY_SPLITS": 8},
    "floor256_splits8": {"QUERY_CHUNK_FLOOR": 256, "QUERY_SPLITS": 8},
    "floor256_splits16": {"QUERY_CHUNK_FLOOR": 256, "QUERY_SPLITS": 16},
    "cap1024": {"QUERY_CHUNK_CAP": 1024},
    "floor512_cap1024": {"QUERY_CHUNK_FLOOR": 512, "QUERY_CHUNK_CAP": 1024},
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args()

    import torch

    from flashrt_kernels.attention import bench
    from flashrt_kernels.attention.splits import workspace_numel
    from flashrt_kernels.benchmarking import environment, markdown_table

    names = args.variants.split(",")
    rows = []
    for hq, hkv, length in ((16, 2, 2048), (16, 2, 8192), (16, 2, 32768), (32, 8, 8192)):
        for n in (24, 64):
            row = {"case": f"tree {n}", "heads": f"{hq}/{hkv}", "L": length}
            sets, cl, ql, _ = bench._decode_sets(8, length, n, hq, hkv, True)
            row["sdpa_us"] = bench._sdpa_decode(sets, length)
            for name in names:
                cfg = VARIANTS[name]
                need = workspace_numel(8, n, hq, hkv, bench.D, length + n, cfg)
                for s in range(len(sets)):
                    if sets[s][5].numel() < need:
                        sets[s] = (*sets[s][:5], torch.empty(need, device="cuda"))
                t = bench._ours_decode(sets, cl, ql, cfg, bits=True)
                row[f"{name}_us"] = t
                row[f"{name}_x_sdpa"] = row["sdpa_us"] / t
            rows.append(row)
            print(json.dumps(row), flush=True)
            del sets
    for scale in (0.25, 1.0, 2.0):
        sets, cl, ql, _, _, (bits, chains) = bench._step_sets(scale)
        hq, hkv = sets[0][0].shape[2], sets[0][1].shape[2]
        row = {"case": f"replay step x{scale}", "heads": f"{hq}/{hkv}", "L": int(cl.float().mean())}
        for name in names:
            row[f"{name}_us"] = bench.ours_step(sets, cl, ql, bits, chains, VARIANTS[name])
        rows.append(row)
        print(json.dumps(row), flush=True)
        del sets
    cols = ["case", "heads", "L", "sdpa_us"] + [f"{n}_us" for n in names]
    print(markdown_table(rows, cols))
    Path(args.out).write_text(json.dumps({"env": environment(), "variants": VARIANTS,
                                          "rows": rows}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
