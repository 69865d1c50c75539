"""``flashrt demo``, the main job: every installed model package's demo on its built-in default
(a tiny configuration, a random checkpoint written and read back by the real loader, the fast path
against the reference path), plus a kernel self-check, in one table."""

from __future__ import annotations

import time

import torch

from flashrt_kernels.benchmarking import markdown_table
from flashrt_kernels.cli.main import plugins


def register(sub) -> None:
    p = sub.add_parser("demo", help="run every installed model package's demo (the main job)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=run)


def kernel_self_check() -> dict:
    """RMSNorm through the fast backend against its reference, on this machine's device."""
    from flashrt_kernels.norm import reference, rms_norm
    from flashrt_kernels.norm.rms_norm import RTOL
    from flashrt_kernels.testing import assert_faithful, make_values

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    x = make_values("normal", (8, 256), torch.bfloat16, 1, device)
    r = make_values("normal", (8, 256), torch.bfloat16, 2, device)
    w = make_values("normal", (256,), torch.bfloat16, 3, device)
    y, new_r = rms_norm(x, w, 1e-6, residual=r, backend="triton")
    y_ref, r_ref = reference.rms_norm(x.cpu(), w.cpu(), 1e-6, r.cpu())
    assert torch.equal(new_r.cpu(), r_ref)
    assert_faithful(y, y_ref, rtol=RTOL[torch.bfloat16])
    where = "GPU" if device.type == "cuda" else "CPU, Triton interpreter"
    return {"package": "flashrt-kernels", "what": "rms_norm triton vs reference", "result": "pass",
            "detail": f"8x256 bf16 with residual ({where})"}  # fmt: skip


def run(args) -> int:
    rows = []
    t0 = time.time()
    try:
        rows.append(kernel_self_check())
    except Exception as err:
        rows.append({"package": "flashrt-kernels", "what": "rms_norm triton vs reference",
                     "result": "FAIL", "detail": str(err)[:200]})  # fmt: skip
    rows[0]["seconds"] = round(time.time() - t0, 1)
    for name, load in plugins("flashrt.demos"):
        if not args.quiet:
            print(f"running {name} demo ...", flush=True)
        start = time.time()
        try:
            pkg_rows = load()(progress=not args.quiet)
        except Exception as err:
            pkg_rows = [
                {
                    "package": name,
                    "what": "demo",
                    "result": "FAIL",
                    "detail": f"{type(err).__name__}: {err}"[:200],
                }
            ]
        for r in pkg_rows:
            r.setdefault("seconds", round(time.time() - start, 1))
        rows.extend(pkg_rows)
    print(markdown_table(rows, ["package", "what", "result", "detail", "seconds"]))
    return 1 if any(str(r["result"]).upper() == "FAIL" for r in rows) else 0
