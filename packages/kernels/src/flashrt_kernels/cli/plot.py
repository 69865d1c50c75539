"""``flashrt plot``: an SVG line plot of a results JSON's rows (``flashrt bench`` output, or any
JSON holding a list of row objects, bare or under ``"rows"``)."""

from __future__ import annotations

import json
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("plot", help="SVG line plot of a benchmark results JSON")
    p.add_argument("results", help="a JSON file: a list of rows, or an object with 'rows'")
    p.add_argument("--x", required=True, help="column on the horizontal axis")
    p.add_argument("--y", nargs="+", required=True, help="columns drawn as lines")
    p.add_argument("--by", nargs="*", default=[], help="columns that split rows into panels")
    p.add_argument("--where", action="append", default=[], metavar="COLUMN=VALUE",
                   help="keep only these rows (repeatable; VALUE* matches a prefix)")  # fmt: skip
    p.add_argument("--linear-x", action="store_true", help="linear x axis (default: log2)")
    p.add_argument("--linear-y", action="store_true", help="linear y axis (default: log2)")
    p.add_argument("--title", default="")
    p.add_argument("--out", help="SVG path (default: the results path with .svg)")
    p.set_defaults(func=run)


def load_rows(path: str | Path) -> list[dict]:
    data = json.loads(Path(path).read_text())
    rows = data.get("rows") if isinstance(data, dict) else data
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise ValueError(f"{path}: expected a list of row objects, bare or under 'rows'")
    return rows


def run(args) -> int:
    from flashrt_kernels.plot import line_plot, select

    where = {}
    for item in args.where:
        key, sep, value = item.partition("=")
        if not sep:
            print(f"flashrt plot: --where takes COLUMN=VALUE, got {item!r}")
            return 2
        where[key] = value
    try:
        rows = select(load_rows(args.results), where)
        svg = line_plot(rows, args.x, args.y, args.by, log_x=not args.linear_x,
                        log_y=not args.linear_y, title=args.title)  # fmt: skip
    except (OSError, ValueError) as err:
        print(f"flashrt plot: {err}")
        return 2
    out = Path(args.out) if args.out else Path(args.results).with_suffix(".svg")
    out.write_text(svg)
    print(f"wrote {out} ({len(rows)} rows)")
    return 0
