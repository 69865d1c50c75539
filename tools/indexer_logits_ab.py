#!/usr/bin/env python3
"""Time the indexer logits kernel alone (fp8 and fp4 keys, V4 shapes: 64 heads, d = 128, 64-key
pages, one decode token a row), each call the only launch of a CUDA graph, as the bench times it.

    python3 tools/indexer_logits_ab.py --out FILE.json [--src DIR] [--label NAME]

``--src DIR`` imports the packages from another copy (``DIR/packages/*/src``: a baseline made
with ``git archive <ref> packages | tar -x -C DIR``); run it once per copy on the same machine and
compare the JSON rows. fp4 keys get random codes and UE8M0 scales within a few binades of each
other (as quantized keys have); ``fp4-unfolded`` gives every key one group 12 binades down, so
every tile takes the bf16 path (the worst case of ``fp4_tiles.fold_factor``'s fallback).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

CELLS = [(1, 32768), (1, 131072), (1, 262144), (4, 32768), (4, 131072), (4, 262144),
         (16, 8192), (16, 32768), (16, 131072), (64, 8192), (64, 32768), (64, 131072),
         (256, 32768)]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--src", default=str(Path(__file__).resolve().parent.parent))
    ap.add_argument("--label", default="this tree")
    ap.add_argument("--formats", default="fp8,fp4,fp4-unfolded")
    ap.add_argument(
        "--launch",
        default=None,
        metavar="STAGES,CAP",
        help="fp4 launches with these pipeline stages and register cap (0: none)",
    )
    ap.add_argument("--cells", default=None, help="B:N,B:N,... (default: the 13 of run 10)")
    args = ap.parse_args()
    sys.path[:0] = sorted(str(p) for p in Path(args.src).glob("packages/*/src"))
    import torch

    from flashrt_dsv4_indexer import logits
    from flashrt_dsv4_indexer.logits import paged_indexer_logits
    from flashrt_kernels.benchmarking import floor_us, time_graph_us

    if args.launch:  # a launch variant: the same tiles, other stages / register cap
        stages, cap, *force = (int(x) for x in args.launch.split(","))
        chosen = logits.launch_config

        def variant(*a, **k):
            keys, tiles, warps, st, mr = chosen(*a, **k)
            fp4 = (a[5] if len(a) > 5 else k.get("key_format")) == "fp4"
            return (
                (keys, tiles, warps, stages, cap or None) if fp4 else (keys, tiles, warps, st, mr)
            )

        logits.launch_config = variant
    import triton.runtime.jit as jit

    launched = {}
    run = jit.JITFunction.run

    def recording_run(self, *a, **k):  # the compiled kernel of each launch: registers, spills
        kernel = run(self, *a, **k)
        launched[self.fn.__name__] = kernel
        return kernel

    jit.JITFunction.run = recording_run
    cells = CELLS
    if args.cells:
        cells = [tuple(int(x) for x in c.split(":")) for c in args.cells.split(",")]
    dev, h, d, page = "cuda", 64, 128, 64
    g = torch.Generator(dev).manual_seed(0)
    rows = []
    for fmt in args.formats.split(","):
        for batch, n in cells:
            pages = n // page
            blocks = batch * pages
            q = torch.randint(0, 126, (batch, h, d), dtype=torch.uint8, device=dev, generator=g)
            w = torch.randn(batch, h, device=dev, generator=g)
            if fmt == "fp8":
                kc = torch.randint(0, 126, (blocks, page, d), dtype=torch.uint8, device=dev,
                                   generator=g)  # fmt: skip
                ks = torch.rand(blocks, page, device=dev, generator=g)
                key_bytes = d + 4
            else:
                kc = torch.randint(0, 256, (blocks, page, d // 2), dtype=torch.uint8, device=dev,
                                   generator=g)  # fmt: skip
                ks = torch.randint(118, 122, (blocks, page, d // 32), dtype=torch.uint8,
                                   device=dev, generator=g)  # fmt: skip
                if fmt == "fp4-unfolded":
                    ks[..., 1] = 106
                key_bytes = d // 2 + d // 32
            perm = torch.randperm(blocks, device=dev, generator=g).int()
            bt = perm.reshape(batch, pages)
            lens = torch.full((batch,), n, dtype=torch.int32, device=dev)
            out = torch.empty(batch, n, device=dev)
            kf = "fp8" if fmt == "fp8" else "fp4"

            def call(q=q, w=w, kc=kc, ks=ks, bt=bt, lens=lens, out=out, kf=kf):
                paged_indexer_logits(q, w, kc, ks, bt, lens, key_format=kf, out=out,
                                     fill_padding=False)  # fmt: skip

            t = time_graph_us([call])
            fl = floor_us(batch * n * key_bytes + batch * n * 4)
            rows.append(dict(format=fmt, batch=batch, n=n, us=t, floor_us=fl, floor_frac=fl / t))
            print(f"{args.label:>10} {fmt:>13} B={batch:<4} N={n:<7} {t:9.1f} us  "
                  f"floor {fl:7.1f} us  {fl / t:5.2f}", flush=True)  # fmt: skip
            del kc, ks, out
        for name, kern in launched.items():
            regs = f"{kern.n_regs} registers, {kern.n_spills} spilled"
            print(f"{args.label:>10} {fmt:>13} {name}: {regs}, {kern.metadata.shared} shared bytes",
                  flush=True)  # fmt: skip
    dev_name = torch.cuda.get_device_name()
    Path(args.out).write_text(json.dumps(dict(device=dev_name, label=args.label, rows=rows),
                                         indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
