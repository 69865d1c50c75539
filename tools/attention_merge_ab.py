#!/usr/bin/env python3
"""The split merge in the tile launch (``MERGE``: the last split program of a tile to arrive merges
the partials) against the separate combine launch, in one process: the ``attention`` benchmark's
decode cells (q = 1, B = 1 / 4 / 8 / 16, L = 2k / 8k / 32k, 16/2 and 32/8 heads) and tree cells
(B = 8, 24 / 64 nodes as bit rows), and the replay-shaped steps of ``attention_step_sweep``, with
SDPA and the K/V-read floor beside the decode cells.

    python3 tools/attention_merge_ab.py --out FILE.json [--variants combine,merge,...] [--quick]

(the merge's cost is about one round trip to L2 a split for the tile's last program, so the
variants trade registers, pipelining, groups (``merge_g4``: the last of each 4 splits merges
them, the last group merges the groups) and the split count (``merge_t16`` halves the splits a
long row takes))

Each variant is a ``config`` override of ``splits.geometry``. Before timing, every variant's
output of the cell's first input set is checked against the combine's (faithful bound of
``gqa_attention``: the merge adds the same partials in another order, so bits may move).
Run it through ``tools/gpu_run.py``'s environment (every ``packages/*/src`` on ``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path[:0] = sorted(str(p) for p in Path(__file__).resolve().parent.parent.glob("packages/*/src"))

ON = {"MERGE": True}
VARIANTS = {
    "combine": {"MERGE": False},
    "merge": ON,
    "merge_s3": {**ON, "narrow": {"MERGE_STAGES": 3}, "wide": {"MERGE_STAGES": 3}},
    "merge_c16x16": {**ON, "narrow": {"MERGE_CHUNK": 16, "MERGE_COLS": 16}},
    "merge_t16": {**ON, "TARGET": 16},
    "merge_wide_c2": {**ON, "wide": {"MERGE_CHUNK": 2}},
    "merge_c1x128": {**ON, "narrow": {"MERGE_CHUNK": 1, "MERGE_COLS": 128}},
    "merge_s4": {**ON, "narrow": {"MERGE_STAGES": 4}, "wide": {"MERGE_STAGES": 4}},
    "merge_g4": {**ON, "narrow": {"MERGE_GROUP": 4}, "wide": {"MERGE_GROUP": 2}},
    "merge_g8": {**ON, "narrow": {"MERGE_GROUP": 8}},
}
DEFAULT = "combine,merge,merge_g4,merge_g8,merge_s3,merge_t16"


def _check(call_outs, names, v_max):
    """Each variant's output against the combine's, within the faithful bound (bf16)."""
    base = call_outs[0].float()
    for name, out in zip(names[1:], call_outs[1:], strict=True):
        err = (out.float() - base).abs()
        tol = 2.0**-6 * v_max + 2.0**-6 * base.abs()
        if out.isnan().any() or (err > tol).any():
            raise AssertionError(f"{name}: max error {float(err.max())} against the combine")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--variants", default=DEFAULT)
    ap.add_argument("--quick", action="store_true", help="L = 2k / 8k, B = 1 / 4 / 8 only")
    args = ap.parse_args()

    from flashrt_kernels.attention import bench
    from flashrt_kernels.attention.gqa_kernels import launch_gqa_tiles
    from flashrt_kernels.benchmarking import environment, floor_us, markdown_table

    names = ["combine"] + [n for n in args.variants.split(",") if n != "combine"]
    rows = []

    def emit(row):  # printed and saved as it comes (a timeout keeps the rows done)
        for name in names[1:]:
            row[f"x_{name}"] = row["combine_us"] / row[f"{name}_us"]
        if "floor_us" in row:
            row["floor_frac_best"] = row["floor_us"] / min(row[f"{n}_us"] for n in names)
        rows.append(row)
        print(json.dumps(row), flush=True)
        Path(args.out).write_text(json.dumps({"env": environment(), "variants": VARIANTS,
                                              "rows": rows}, indent=1))  # fmt: skip

    def timed_cells(sets, cl, ql, bits):
        outs = []
        q, k, v, mask, out, ws = sets[0]
        m = None if mask is None else bench.reference.pack_tree_mask(mask)
        for name in names:
            out.fill_(float("nan"))
            launch_gqa_tiles(q, k, v, out, cl, ql, q_starts=None, cache_rows=None, mask=m,
                             mask_mode=0 if m is None else 2, q_max=q.shape[1], split=True,
                             workspace=ws, scale=bench.D**-0.5, config=VARIANTS[name])  # fmt: skip
            outs.append(out.clone())
        _check(outs, names, float(sets[0][2].float().abs().max()))
        return {f"{n}_us": bench._ours_decode(sets, cl, ql, VARIANTS[n], bits=bits) for n in names}

    lengths = (2048, 8192) if args.quick else (2048, 8192, 32768)
    batches = (1, 4, 8) if args.quick else (1, 4, 8, 16)
    first = True
    for hq, hkv in bench.SHAPES:
        for bsz in batches:
            for length in lengths:
                sets, cl, ql, nbytes = bench._decode_sets(bsz, length - 1, 1, hq, hkv, False)
                if first:  # compile every variant once outside the timed cells
                    timed_cells(sets, cl, ql, False)
                    first = False
                row = {"case": "decode q=1", "heads": f"{hq}/{hkv}", "B": bsz, "L": length,
                       **timed_cells(sets, cl, ql, False),
                       "sdpa_us": bench._sdpa_decode(sets, length - 1),
                       "floor_us": floor_us(nbytes)}  # fmt: skip
                emit(row)
                del sets
    for hq, hkv, length in ((16, 2, 2048), (16, 2, 8192), (16, 2, 32768), (32, 8, 8192)):
        if args.quick and length > 8192:
            continue
        for n in (24, 64):
            sets, cl, ql, nbytes = bench._decode_sets(8, length, n, hq, hkv, True)
            row = {"case": f"tree {n} nodes", "heads": f"{hq}/{hkv}", "B": 8, "L": length,
                   **timed_cells(sets, cl, ql, True), "sdpa_us": bench._sdpa_decode(sets, length),
                   "floor_us": floor_us(nbytes)}  # fmt: skip
            emit(row)
            del sets
    for scale in (0.25, 1.0, 2.0):
        sets, cl, ql, _, _, (bits, chains) = bench._step_sets(scale)
        hq, hkv = sets[0][0].shape[2], sets[0][1].shape[2]
        row = {"case": f"replay step x{scale}", "heads": f"{hq}/{hkv}",
               "B": len(bench.STEP_QUERIES), "L": int(cl.float().mean())}  # fmt: skip
        for name in names:
            row[f"{name}_us"] = bench.ours_step(sets, cl, ql, bits, chains, VARIANTS[name])
        emit(row)
        del sets
    cols = ["case", "heads", "B", "L", "sdpa_us", "floor_us"] + [f"{n}_us" for n in names]
    cols += [f"x_{n}" for n in names[1:]]
    print(markdown_table(rows, cols))


if __name__ == "__main__":
    main()
