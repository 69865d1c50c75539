"""``flashrt bench``: run registered kernel benchmarks side by side with their baselines."""

from __future__ import annotations

import torch

from flashrt_kernels.benchmarking import markdown_table, write_results
from flashrt_kernels.plot import write_plots


def register(sub) -> None:
    p = sub.add_parser("bench", help="benchmark kernels against their baselines (GPU)")
    p.add_argument("names", nargs="*", help="benchmark or family names (default: all)")
    p.add_argument("--out", default="results/bench", help="folder for JSON and markdown")
    p.add_argument("--quick", action="store_true", help="fewer cases")
    p.set_defaults(func=run)


def run(args) -> int:
    from flashrt_kernels.registry import benchmarks

    registered = benchmarks()
    selected = [
        b
        for b in registered.values()
        if not args.names or b.name in args.names or b.family in args.names
    ]
    if not selected:
        print(f"flashrt bench: nothing matches {args.names}; registered: {', '.join(registered)}")
        return 2
    if not torch.cuda.is_available():
        print("flashrt bench: benchmarks time GPU kernels and need a CUDA device; none is present")
        return 2
    for i, b in enumerate(selected, 1):
        print(f"[{i}/{len(selected)}] {b.name}: {b.description} ...", flush=True)
        rows = b.run(quick=args.quick)
        js, md = write_results(b.name, rows, args.out)
        print(markdown_table(rows))
        print(f"wrote {js} and {md}")
        for path in write_plots(b, rows, args.out):
            print(f"wrote {path}")
    return 0
