#!/usr/bin/env python3
"""The CUDA top-K's paths side by side, per cell: which one a row length and batch should take.

    python3 tools/topk_paths.py [--cells B,N,K ...] [--drift D] [--json OUT.json]

For each cell (fp32 ``ScoreChain`` rows, drift 0.02 unless ``--drift``: the ``topk`` benchmark's
chain; 0.2-0.35 are the DeepSeek indexer's decode chains, whose hints miss) this times,
as CUDA graphs over rotated input sets, every path ``cuda_select.launch`` can take for it: the
one-block rows (``N <= SHORT_MAX``), the multi-launch path hint-free and with the previous step's
selection as the hint (``clusters=False``; where ``step_helpers`` puts the steps inside the
finishing launch, also with them in launches of their own: ``steps``), and the thread-block clusters
(``clusters=True``, where ``cluster_plan`` allows: they take no hint), beside ``torch.topk``;
and checks each path's result bit for bit against the reference. ``auto`` / ``auto hinted`` name
the paths the backend picks for a hint-free / hinted call. Run it through ``tools/gpu_run.py``'s
environment (every ``packages/*/src`` on ``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = sorted(str(p) for p in (ROOT / "packages").glob("*/src"))

import torch  # noqa: E402

from flashrt_kernels.benchmarking import markdown_table, rotation, time_graph_us  # noqa: E402
from flashrt_kernels.testing.chains import ScoreChain  # noqa: E402
from flashrt_kernels.topk import cuda_select, reference  # noqa: E402

CELLS = ["1,8192,512", "1,32768,512", "8,32768,2048", "1,65536,1024", "1,131072,512",
         "1,131072,2048", "1,262144,512", "1,262144,2048", "8,131072,1024", "8,262144,2048",
         "16,131072,512", "16,262144,2048", "32,65536,1024", "64,32768,1024"]  # fmt: skip


def _paths(b: int, n: int) -> dict[str, dict]:
    """Path name -> launch keywords (hint: whether the call gets one)."""
    dev = torch.device("cuda")
    out = {}
    if n <= cuda_select.SHORT_MAX:
        out["one block"] = {"clusters": False, "hint": False}
    else:
        out["multi"] = {"clusters": False, "hint": False}
        out["multi hinted"] = {"clusters": False, "hint": True}
        s = cuda_select.plan(b, n, dev)[0]
        if cuda_select.step_helpers(b, s, dev):
            out["multi steps"] = {"clusters": False, "hint": False, "helpers": False}
            out["multi hinted steps"] = {"clusters": False, "hint": True, "helpers": False}
    if cuda_select.cluster_plan(b, n, dev) is not None:
        out["clusters"] = {"clusters": True, "hint": False}
    return out


def cell(b: int, n: int, k: int, drift: float) -> dict:
    dev = torch.device("cuda")
    sets = rotation(b * n * 4)
    chain = ScoreChain(b, n, drift=drift, seed=n + k)
    prev = chain.step()[0]
    xs, hints = [], []
    for _ in range(sets):
        x = chain.step()[0]
        hints.append(torch.topk(prev, k).indices.int().to(dev))
        xs.append(x.to(dev))
        prev = x
    ov = torch.empty(b, k, device=dev)
    oi = torch.empty(b, k, dtype=torch.int32, device=dev)
    plan = cuda_select.cluster_plan(b, n, dev)
    row = {"B": b, "N": n, "K": k, "cluster": "-" if plan is None else f"{plan[0]} x {plan[1]}"}
    row["torch_us"] = time_graph_us([lambda x=x: torch.topk(x, k) for x in xs])
    want = reference.topk(xs[-1].cpu(), k)
    for name, kw in _paths(b, n).items():

        def call(j, kw=kw):
            h = hints[j] if kw["hint"] else None
            cuda_select.launch(xs[j], k, None, ov, oi, None, h, None, True, kw["clusters"],
                               kw.get("helpers", True))  # fmt: skip

        row[f"{name}_us"] = time_graph_us([lambda j=j: call(j) for j in range(sets)])
        call(sets - 1)
        torch.cuda.synchronize()
        exact = torch.equal(oi.cpu(), want[1]) and torch.equal(
            ov.cpu().view(torch.int32), want[0].view(torch.int32)
        )
        row[f"{name}_exact"] = exact
    for name, hinted in (("auto", False), ("auto hinted", True)):
        chosen = cuda_select._use_clusters(b, n, dev, None, None, hinted)
        other = "one block" if n <= cuda_select.SHORT_MAX else "multi" + " hinted" * hinted
        row[name] = "clusters" if chosen else other
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cells", nargs="*", default=CELLS)
    ap.add_argument("--drift", type=float, default=0.02, help="ScoreChain drift between steps")
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args()
    rows = []
    for i, c in enumerate(args.cells):
        b, n, k = (int(v) for v in c.split(","))
        rows.append(cell(b, n, k, args.drift))
        print(f"[{i + 1}/{len(args.cells)}] {c}", file=sys.stderr, flush=True)
    cols = list(dict.fromkeys(key for r in rows for key in r))  # first seen, in order
    print(markdown_table(rows, cols))
    if args.json:
        env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "drift": args.drift}  # fmt: skip
        Path(args.json).write_text(json.dumps({"environment": env, "rows": rows}, indent=1))
    return 0 if all(v for r in rows for key, v in r.items() if key.endswith("_exact")) else 1


if __name__ == "__main__":
    raise SystemExit(main())
