"""A/B of ActiveVLN presets with and without the few-row linear's wide tiles, in one process.

    PYTHONPATH=<packages/kernels/src:packages/activevln/src> python3 tools/ab_wide_tiles.py OUT fast lossless

For each preset: the benchmark (3B shapes, random weights, 16 episodes) with the default tile
choice, then with ``few_rows.wide_pays`` answering False (every call on the 16-row tiles, the
choice before the wide tiles); rows and replies are printed, everything goes to
OUT/preset_ab.json.
"""

import json
import sys

from flashrt_activevln import bench
from flashrt_kernels.gemm import few_rows

res = {}
wide_pays = few_rows.wide_pays
for preset_name in sys.argv[2:]:
    for name, pays in (("wide", wide_pays), ("narrow", lambda k, n, m: False)):
        few_rows.wide_pays = pays
        r = bench.run(
            checkpoint=None,
            random_config="3b",
            episodes=16,
            mean_frames=12,
            baseline_episodes=1,
            baseline_frames=2,
            preset_name=preset_name,
            overrides={},
            dtype="bfloat16",
            device="cuda",
            hf=False,
            progress=False,
        )
        name = f"{preset_name} {name}"
        res[name] = r
        p = r["paths"]["preset"]
        print(
            name,
            json.dumps({k: v for k, v in p.items() if not isinstance(v, (list, dict))}),
            json.dumps(r.get("identical")),
            flush=True,
        )
json.dump(res, open(sys.argv[1] + "/preset_ab.json", "w"), default=str)
