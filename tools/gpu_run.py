#!/usr/bin/env python3
"""Run the GPU tests and benchmarks on a GPU machine that has no network and no uv.

    python3 tools/gpu_run.py --out RESULTS_DIR [--tests tests/kernels ...] [--bench rms_norm ...]
                             [--quick] [--max-examples N] [--pytest-args "..."] [--baseline DIR]

Puts every ``packages/*/src`` on ``PYTHONPATH`` (the machine's own torch / triton / cupy are used),
runs the ``gpu``-marked tests with pytest (JUnit XML and the log into RESULTS_DIR), runs the named
benchmarks (``all`` for every registered one; JSON and markdown per benchmark into RESULTS_DIR),
and prints a short summary table last.

``--baseline DIR`` runs the same benchmarks again, in the same call, from another copy of the
packages (``DIR/packages/*/src``, its own benchmark code included; results into
RESULTS_DIR/baseline), then prints each benchmark's rows side by side: matched on their integer
and string fields, every ``*_us`` column with the baseline's and baseline / ours (above 1: ours is
faster). Make the copy here from a git ref into an ignored folder, and carry it:
``mkdir -p build/base && git archive main packages | tar -x -C build/base``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _src_dirs(root: Path) -> list[str]:
    return sorted(str(p) for p in (root / "packages").glob("*/src"))


SRC_DIRS = _src_dirs(ROOT)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(SRC_DIRS + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_tests(paths: list[str], out: Path, extra: list[str]) -> dict:
    xml = out / "gpu-tests.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
           f"--junitxml={xml}", *paths, *extra]  # fmt: skip
    t0 = time.time()
    with open(out / "gpu-tests.log", "w") as log:
        proc = subprocess.run(cmd, cwd=ROOT, env=_env(), stdout=log, stderr=subprocess.STDOUT)
    summary = {"returncode": proc.returncode, "seconds": round(time.time() - t0, 1)}
    if xml.exists():
        suite = ET.parse(xml).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        summary.update(
            {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
        )
        summary["failed"] = [
            f"{c.get('classname')}::{c.get('name')}"
            for c in suite.iter("testcase")
            if c.find("failure") is not None or c.find("error") is not None
        ]
    tail = (out / "gpu-tests.log").read_text().splitlines()[-25:]
    print("\n".join(tail))
    return summary


def run_benchmarks(names: list[str], out: Path, quick: bool) -> list[tuple[str, str, float]]:
    sys.path[:0] = SRC_DIRS
    from flashrt_kernels.benchmarking import markdown_table, write_results
    from flashrt_kernels.registry import benchmarks, import_errors

    registered = benchmarks()
    done = []
    for module, err in import_errors().items():
        print(f"could not import {module}: {err}")
        done.append((module, f"error: {err}", 0.0))
    if names == ["all"]:
        names = list(registered)
    for name in names:
        if name not in registered:
            print(f"unknown benchmark {name!r}; registered: {list(registered)}")
            done.append((name, "unknown", 0.0))
            continue
        t0 = time.time()
        print(f"== bench {name} ...", flush=True)
        try:
            rows = registered[name].run(quick=quick)
        except Exception as err:  # report and go on with the next benchmark
            import traceback

            traceback.print_exc()
            done.append((name, f"error: {err}", time.time() - t0))
            continue
        write_results(name, rows, out)
        print(markdown_table(rows), flush=True)
        try:  # (a baseline copy of the packages may predate the plots)
            from flashrt_kernels.plot import write_plots
        except ImportError:
            pass
        else:
            write_plots(registered[name], rows, out)
        done.append((name, f"{len(rows)} rows", time.time() - t0))
    return done


def _key(row: dict) -> tuple:
    return tuple(
        (k, v) for k, v in row.items() if isinstance(v, (int, str)) and not isinstance(v, bool)
    )


def compare_rows(ours: list[dict], base: list[dict]) -> list[dict]:
    """Rows of one benchmark from two runs, matched on their int / str fields (shapes, names):
    each ``*_us`` column as ours, the baseline's and baseline / ours. Unmatched rows are left out."""
    by_key = {_key(r): r for r in base}
    out = []
    for row in ours:
        other = by_key.get(_key(row))
        if other is None:
            continue
        both = dict(_key(row))
        for k, v in row.items():
            if k.endswith("_us") and isinstance(v, float) and isinstance(other.get(k), float):
                both[k], both[f"{k} base"] = v, other[k]
                both[f"{k} x"] = other[k] / v if v > 0 else float("nan")
        out.append(both)
    return out


def run_baseline(names: list[str], out: Path, quick: bool, baseline: Path) -> bool:
    """The benchmarks again from ``baseline``'s packages (a subprocess), then the comparisons."""
    import json

    from flashrt_kernels.benchmarking import markdown_table

    cmd = [sys.executable, str(Path(__file__).resolve()), "--src-root", str(baseline.resolve()),
           "--out", str(out / "baseline"), "--bench", *names] + (["--quick"] if quick else [])  # fmt: skip
    print(f"== baseline: the same benchmarks from {baseline}", flush=True)
    ok = subprocess.run(cmd, cwd=ROOT).returncode == 0
    for name in names:
        paths = out / f"{name}.json", out / "baseline" / f"{name}.json"
        if not all(p.exists() for p in paths):
            print(f"== compare {name}: no result on one side")
            ok = False
            continue
        ours, base = (json.loads(p.read_text())["rows"] for p in paths)
        rows = compare_rows(ours, base)
        (out / f"compare-{name}.json").write_text(json.dumps(rows, indent=1))
        print(f"== compare {name} (x = baseline / ours; {len(rows)} of {len(ours)} rows matched)")
        print(markdown_table(rows), flush=True)
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", required=True, help="folder for JSON, logs and tables")
    ap.add_argument("--tests", nargs="*", default=[], help="test paths (gpu-marked tests run)")
    ap.add_argument("--bench", nargs="*", default=[], help="benchmark names, or 'all'")
    ap.add_argument("--quick", action="store_true", help="fewer benchmark cases")
    ap.add_argument(
        "--max-examples", type=int, default=None, help="hypothesis examples per property"
    )
    ap.add_argument(
        "--pytest-args", default="", help="extra pytest arguments, one string (shell quoting)"
    )
    ap.add_argument("--baseline", default=None, help="another packages/ copy to compare against")
    ap.add_argument("--src-root", default=None, help=argparse.SUPPRESS)  # (--baseline's runs)
    args = ap.parse_args()
    if args.src_root:
        global SRC_DIRS
        SRC_DIRS = _src_dirs(Path(args.src_root))
    if args.baseline and not _src_dirs(Path(args.baseline)):
        ap.error(f"--baseline {args.baseline}: expected a folder holding packages/*/src")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    test_summary = None
    if args.tests:
        extra = shlex.split(args.pytest_args)
        if args.max_examples:
            extra.append(f"--max-examples={args.max_examples}")
        test_summary = run_tests(args.tests, out, extra)
    bench_summary = run_benchmarks(args.bench, out, args.quick) if args.bench else []
    base_ok = True
    if args.baseline and args.bench:
        names = [n for n, r, _ in bench_summary if not r.startswith(("error", "unknown"))]
        base_ok = run_baseline(names, out, args.quick, Path(args.baseline))
    print("\n== summary")
    print("| what | result | seconds |\n|---|---|---|")
    if test_summary is not None:
        res = ", ".join(
            f"{k} {test_summary.get(k, '?')}" for k in ("tests", "failures", "errors", "skipped")
        )
        print(f"| gpu tests | {res} | {test_summary['seconds']} |")
        for f in test_summary.get("failed", [])[:20]:
            print(f"| FAILED | {f} | |")
    for name, result, secs in bench_summary:
        print(f"| bench {name} | {result} | {secs:.1f} |")
    ok = (test_summary is None or test_summary["returncode"] == 0) and base_ok
    return (
        0 if ok and all(not r.startswith(("error", "unknown")) for _, r, _ in bench_summary) else 1
    )


if __name__ == "__main__":
    raise SystemExit(main())
