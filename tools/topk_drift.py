#!/usr/bin/env python3
"""The hinted CUDA top-K on rows that drifted since the hint: source variants side by side.

    python3 tools/topk_drift.py [--base DIR] [--cells B,N,K ...] [--drifts 0.02 0.2 ...]
                                [--json OUT.json]

A decode step's hint is the previous step's selection; how far the scores moved since then sets
how many keys the hinted guess admits (``testing.chains.ScoreChain``'s ``drift``: 0.02 is the
``topk`` benchmark's chain, 0.2-0.35 matches the DeepSeek indexer's decode chains). Per cell and
drift this times, as CUDA graphs over rotated input sets, the hint-free call (base and new
source) and the hinted call compiled from each source variant: ``base`` (the ``.cu`` files of another checkout's
``packages/kernels/src/flashrt_kernels/topk``, ``--base``), ``ladder`` (this checkout's source with
the recompaction switched off: ``RECOMPACT_BYTES`` 0) and ``new`` (this checkout's source). It
also prints the keys the smallest hinted score admits (``admit_min`` / K) and checks every
variant's result bit for bit against the reference. Run it through ``tools/gpu_run.py``'s
environment (every ``packages/*/src`` on ``PYTHONPATH``).

``--triton`` times the Triton backend instead: its hint-free call, and its hinted call with the
Triton kernels of ``--base`` (``base``; that checkout's ``topk/kernels.py`` loaded beside this
one's) and of this checkout (``new``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = sorted(str(p) for p in (ROOT / "packages").glob("*/src"))

import torch  # noqa: E402

from flashrt_kernels.benchmarking import markdown_table, rotation, time_graph_us  # noqa: E402
from flashrt_kernels.testing.chains import ScoreChain  # noqa: E402
from flashrt_kernels.topk import cuda_select, reference  # noqa: E402
from flashrt_kernels.topk import select as triton_select  # noqa: E402
from flashrt_kernels.topk.api import topk  # noqa: E402

CELLS = ["1,131072,1024", "4,131072,1024", "1,1048576,512", "16,131072,512", "8,262144,2048",
         "64,262144,2048"]  # fmt: skip
DRIFTS = [0.02, 0.1, 0.2, 0.3]
RECOMPACT_LINE = "#define RECOMPACT_BYTES 3000"
_ORIGINAL_SOURCE = cuda_select.source


def variants(base: str | None) -> dict[str, str]:
    """Name -> CUDA source."""
    src = _ORIGINAL_SOURCE()
    if src.count(RECOMPACT_LINE) != 1:
        raise ValueError(f"topk_drift: expected one {RECOMPACT_LINE!r} in the source")
    out = {}
    if base:
        topk_dir = Path(base) / "packages/kernels/src/flashrt_kernels/topk"
        out["base"] = "\n".join((topk_dir / name).read_text() for name in cuda_select.SOURCES)
    out["ladder"] = src.replace(RECOMPACT_LINE, "#define RECOMPACT_BYTES 0")  # never recompacts
    out["new"] = src
    return out


_MODULES: dict[str, object] = {}  # source -> its CuPy module (compiled once a process)
_ORIGINAL_MODULE = cuda_select._module


def use(src: str) -> None:
    """Route cuda_select's launches through ``src`` (each variant is compiled once)."""
    cuda_select.source = lambda: src
    if cuda_select.compiler() == "cupy":
        import cupy

        if src not in _MODULES:
            _MODULES[src] = cupy.RawModule(code=src, options=("-std=c++17",),
                                           name_expressions=cuda_select.NAMES)  # fmt: skip
        cuda_select._module = lambda: _MODULES[src]
    else:  # NVRTC: the cubin cache on disk is keyed by the source
        cuda_select._nvrtc_module.cache_clear()
    cuda_select._kernel.cache_clear()


def sets_for(b: int, n: int, k: int, drift: float, count: int):
    chain = ScoreChain(b, n, drift=drift, seed=b * 7 + n + k, device="cuda")
    prev = chain.step()[0]
    out = []
    for _ in range(count):
        x = chain.step()[0]
        hint = reference.topk(prev, k)[1]
        out.append((x, hint, torch.empty(b, k, device="cuda"),
                    torch.empty(b, k, dtype=torch.int32, device="cuda")))  # fmt: skip
        prev = x
    return out


def admit_min(x: torch.Tensor, hint: torch.Tensor) -> float:
    """Mean over rows of (keys >= the smallest hinted key) / K."""
    keys = reference.order_key(x)
    g = keys.gather(1, hint.long()).min(1, keepdim=True).values
    return float((keys >= g).sum(1).float().mean() / hint.shape[1])


def triton_variants(base: str | None) -> dict[str, object]:
    """Name -> Triton kernels module for ``select.kn`` (``base`` loaded from its file)."""
    out = {}
    if base:
        path = Path(base) / "packages/kernels/src/flashrt_kernels/topk/kernels.py"
        spec = importlib.util.spec_from_file_location("base_topk_kernels", path)
        out["base"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(out["base"])
    out["new"] = triton_select.kn
    return out


def _exact(got, want) -> bool:
    return torch.equal(got[1], want[1]) and torch.equal(
        got[0].view(torch.int32), want[0].view(torch.int32)
    )


def measure(args, backend: str, hintfree: dict, hinted: dict) -> list[dict]:
    """Per cell and drift: the hint-free call timed after each ``hintfree`` setup and the hinted
    call after each ``hinted`` setup (column name -> a function routing the launches), every
    hinted result checked bit for bit against the reference."""
    rows = []
    for cell in args.cells:
        b, n, k = (int(v) for v in cell.split(","))
        for drift in args.drifts:
            sets = sets_for(b, n, k, drift, rotation(b * n * 4, limit=8))
            x, hint, ov, oi = sets[-1]
            want = reference.topk(x, k)
            row = {"B": b, "N": n, "K": k, "drift": drift, "admit_min": admit_min(x, hint)}
            free = [lambda s=s, k=k: topk(s[0], k, out_values=s[2], out_indices=s[3],
                                          backend=backend) for s in sets]  # fmt: skip
            for col, setup in hintfree.items():
                setup()
                row[col] = time_graph_us(free, rep_ms=args.rep_ms)
            exact = True
            for col, setup in hinted.items():
                setup()
                ov.fill_(float("nan"))
                topk(x, k, hint=hint, out_values=ov, out_indices=oi, backend=backend)
                exact &= _exact((ov, oi), want)
                calls = [lambda s=s, k=k: topk(s[0], k, hint=s[1], out_values=s[2],
                                               out_indices=s[3], backend=backend)
                         for s in sets]  # fmt: skip
                row[col] = time_graph_us(calls, rep_ms=args.rep_ms)
            row["exact"] = exact
            rows.append(row)
            print({c: round(v, 2) if isinstance(v, float) else v for c, v in row.items()},
                  flush=True)  # fmt: skip
            del sets
    return rows


def _route_triton(module):
    return lambda: setattr(triton_select, "kn", module)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default=None, help="another checkout's root (its topk .cu files)")
    ap.add_argument("--cells", nargs="*", default=CELLS)
    ap.add_argument("--drifts", nargs="*", type=float, default=DRIFTS)
    ap.add_argument("--rep-ms", type=int, default=20)
    ap.add_argument("--json", default=None)
    ap.add_argument("--triton", action="store_true", help="time the Triton backend instead")
    args = ap.parse_args()
    if args.triton:
        mods = triton_variants(args.base)
        rows = measure(
            args,
            "triton",
            {"triton_hintfree_us": _route_triton(mods["new"])},
            {f"triton_{name}_us": _route_triton(m) for name, m in mods.items()},
        )
        triton_select.kn = mods["new"]
    else:
        srcs = variants(args.base)
        base = srcs.get("base", srcs["ladder"])
        rows = measure(
            args,
            "auto",
            {"hintfree_us": lambda: use(base), "hintfree_new_us": lambda: use(srcs["new"])},
            {f"{name}_us": (lambda src=src: use(src)) for name, src in srcs.items()},
        )
        cuda_select.source, cuda_select._module = _ORIGINAL_SOURCE, _ORIGINAL_MODULE
        cuda_select._nvrtc_module.cache_clear()
        cuda_select._kernel.cache_clear()
    print(markdown_table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
