#!/usr/bin/env python3
"""A/B of ActiveVLN presets against earlier kernel choices, in one process.

    PYTHONPATH=<packages/kernels/src:packages/activevln/src> python3 tools/ab_activevln.py OUT \
        --presets fast lossless --variants default narrow-linears [--episodes 16 --mean-frames 12]

For each preset and variant: the benchmark (3B shapes, random weights) with the variant's module
settings in place, restored afterwards. Variants:
- ``default``: the code as it is;
- ``narrow-linears``: ``few_rows.wide_pays`` answers False (every few-row linear on the 16-row
  tiles, the choice before the wide tiles of 2026-12-05);
- ``attention-1205``: the GQA split rule without ``QUERY_CHUNK_CAP`` and the wide tiles on 2
  stages (the geometry before 2026-12-06);
- ``attention-1206``: the GQA split rule of 2026-12-06's first change (4 keys a wide tile row,
  the query term at ``QUERY_CHUNK_CAP`` whatever the extent);
- ``pointer-kv``: K/V blocks through pointer loads only (no tensor descriptors: before
  2026-12-06's third change), in the wide and the query-invariant tiles;
- ``causal-node-steps``: the query-invariant tiles' causal blocks stepped once per node
  (``CAUSAL_TILE_STEPS`` off: before 2026-12-06's second session; the lossless preset's frame
  prefills);
- ``bool-masks``: steps send a bool ``[B, Q, Q]`` mask (``runtime.uses_bit_rows`` answers False:
  before the chain + tree bit rows);
- ``vision-ahead-N``: the preset with the option ``vision_ahead=N``;
- ``vision-stream-N``: the preset with ``vision_ahead=N`` on a stream of its own
  (``vision_stream=True``);
- ``tree-N``: the preset with ``grammar_tree_budget=N`` (the presets take 32);
- ``buckets-64``: the step graphs' token buckets 64 tokens apart at every size
  (``graphs.COARSER_PAST`` empty: less padding, more graphs); ``buckets-64-128``: 64 apart up to
  1024 tokens, 128 beyond.
Rows and replies are printed; everything goes to OUT/preset_ab.json.
"""

import argparse
import contextlib
import json
from pathlib import Path

from flashrt_activevln import bench, graphs, runtime
from flashrt_kernels.attention import splits
from flashrt_kernels.gemm import few_rows


@contextlib.contextmanager
def _patched(obj, **values):
    """Set attributes (or dict keys, for a dict) of ``obj`` for the block."""
    get = obj.__getitem__ if isinstance(obj, dict) else lambda k: getattr(obj, k)
    put = obj.__setitem__ if isinstance(obj, dict) else lambda k, v: setattr(obj, k, v)
    old = {k: get(k) for k in values}
    for k, v in values.items():
        put(k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            put(k, v)


def _attention_1205():
    stack = contextlib.ExitStack()
    stack.enter_context(_patched(splits.SPLITS, WIDE_KEYS_PER_ROW=4, QUERY_CHUNK_CAP=1 << 30,
                                 QUERY_CHUNK_FLOOR=1 << 30))  # fmt: skip
    stack.enter_context(_patched(splits.WIDE, num_stages=2))
    return stack


def _attention_1206():
    return _patched(splits.SPLITS, WIDE_KEYS_PER_ROW=4, QUERY_CHUNK_FLOOR=2048)


def _pointer_kv():
    stack = contextlib.ExitStack()
    stack.enter_context(_patched(splits.WIDE, TMA=False))
    stack.enter_context(_patched(splits.INVARIANT, TMA=False))
    return stack


# name -> (module settings in place for the run, option overrides)
VARIANTS = {
    "default": (contextlib.nullcontext, {}),
    "narrow-linears": (lambda: _patched(few_rows, wide_pays=lambda k, n, m: False), {}),
    "attention-1205": (_attention_1205, {}),
    "attention-1206": (_attention_1206, {}),
    "pointer-kv": (_pointer_kv, {}),
    "causal-node-steps": (lambda: _patched(splits.INVARIANT, CAUSAL_TILE_STEPS=False), {}),
    "bool-masks": (lambda: _patched(runtime, uses_bit_rows=lambda options: False), {}),
    "buckets-64": (lambda: _patched(graphs, COARSER_PAST=()), {}),
    "buckets-64-128": (lambda: _patched(graphs, COARSER_PAST=(16,)), {}),
    **{f"vision-ahead-{n}": (contextlib.nullcontext, {"vision_ahead": n}) for n in (0, 1, 2, 4)},
    **{
        f"vision-stream-{n}": (contextlib.nullcontext, {"vision_ahead": n, "vision_stream": True})
        for n in (2, 4, 8)
    },
    **{f"tree-{n}": (contextlib.nullcontext, {"grammar_tree_budget": n}) for n in (16, 24, 48, 63)},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--presets", nargs="+", default=["fast"])
    ap.add_argument("--variants", nargs="+", default=["default"], choices=sorted(VARIANTS))
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--mean-frames", type=int, default=12)
    args = ap.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    res = {}
    for preset_name in args.presets:
        for variant in args.variants:
            settings, overrides = VARIANTS[variant]
            with settings():
                r = bench.run(checkpoint=None, random_config="3b", episodes=args.episodes,
                              mean_frames=args.mean_frames, baseline_episodes=1,
                              baseline_frames=2, preset_name=preset_name, overrides=overrides,
                              dtype="bfloat16", device="cuda", hf=False, progress=False)  # fmt: skip
            name = f"{preset_name} {variant}"
            res[name] = r
            p = r["paths"]["preset"]
            scalars = {k: v for k, v in p.items() if not isinstance(v, (list, dict))}
            print(name, json.dumps(scalars), json.dumps(r.get("identical")), flush=True)
    with open(f"{args.out}/preset_ab.json", "w") as f:
        json.dump(res, f, default=str)


if __name__ == "__main__":
    main()
