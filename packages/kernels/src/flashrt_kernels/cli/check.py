"""``flashrt check``: run every registered kernel property under the ``fuzz`` profile."""

from __future__ import annotations

import time

import torch

from flashrt_kernels.benchmarking import markdown_table


def register(sub) -> None:
    p = sub.add_parser("check", help="fuzz the kernels against their references")
    p.add_argument("ops", nargs="*", help="op names or op.property names (default: all)")
    p.add_argument("--examples", type=int, default=200, help="examples per property (default 200)")
    p.add_argument(
        "--scale",
        choices=("small", "real"),
        default=None,
        help="case sizes: small (CPU interpreter) or real (model shapes, GPU); default: real on a "
        "GPU, small on a CPU",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    import warnings

    from hypothesis import settings

    from flashrt_kernels.registry import import_errors, properties
    from flashrt_kernels.testing.profiles import register_profiles

    register_profiles()
    # numpy warns on inf / NaN arithmetic inside the Triton interpreter; the checks assert those
    warnings.filterwarnings("ignore", category=RuntimeWarning, module="triton.runtime.interpreter")
    scale = args.scale or ("real" if torch.cuda.is_available() else "small")
    if scale == "real" and not torch.cuda.is_available():
        print("flashrt check: --scale real needs a CUDA device; use --scale small on a CPU")
        return 2
    props = properties()
    selected = [p for q, p in props.items() if not args.ops or q in args.ops or p.op in args.ops]
    if not selected:
        print(f"flashrt check: nothing matches {args.ops}; registered: {', '.join(props)}")
        return 2
    fuzz = settings.get_profile("fuzz")
    rows, failed = [], 0
    for i, prop in enumerate(selected, 1):
        print(
            f"[{i}/{len(selected)}] {prop.qualname} ({scale}, {args.examples} examples) ...",
            flush=True,
        )
        test = settings(parent=fuzz, max_examples=args.examples)(prop.test(scale))
        t0 = time.time()
        try:
            test()
            result = "pass"
        except Exception as err:
            failed += 1
            result = "FAIL: " + (str(err).strip().splitlines() or [type(err).__name__])[0][:120]
        rows.append(
            {"op": prop.op, "property": prop.name, "scale": scale, "examples": args.examples,
             "seconds": round(time.time() - t0, 1), "result": result}
        )  # fmt: skip
    for module, err in import_errors().items():
        failed += 1
        rows.append({"op": module, "property": "import", "scale": scale, "examples": 0,
                     "seconds": 0.0, "result": f"FAIL: {err}"[:130]})  # fmt: skip
    print(markdown_table(rows))
    return 1 if failed else 0
