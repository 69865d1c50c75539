#!/usr/bin/env python3
"""Run the GPU tests and benchmarks on a GPU machine that has no network and no uv.

    python3 tools/gpu_run.py --out RESULTS_DIR [--tests tests/kernels ...] [--bench rms_norm ...]
                             [--quick] [--max-examples N] [--pytest-args "..."]

Puts every ``packages/*/src`` on ``PYTHONPATH`` (the machine's own torch / triton / cupy are used),
runs the ``gpu``-marked tests with pytest (JUnit XML and the log into RESULTS_DIR), runs the named
benchmarks (``all`` for every registered one; JSON and markdown per benchmark into RESULTS_DIR),
and prints a short summary table last.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC_DIRS = sorted(str(p) for p in (ROOT / "packages").glob("*/src"))


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
        done.append((name, f"{len(rows)} rows", time.time() - t0))
    return done


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
    ap.add_argument("--pytest-args", default="", help="extra pytest arguments, one string")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    test_summary = None
    if args.tests:
        extra = args.pytest_args.split()
        if args.max_examples:
            extra.append(f"--max-examples={args.max_examples}")
        test_summary = run_tests(args.tests, out, extra)
    bench_summary = run_benchmarks(args.bench, out, args.quick) if args.bench else []
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
    ok = test_summary is None or test_summary["returncode"] == 0
    return (
        0 if ok and all(not r.startswith(("error", "unknown")) for _, r, _ in bench_summary) else 1
    )


if __name__ == "__main__":
    raise SystemExit(main())
