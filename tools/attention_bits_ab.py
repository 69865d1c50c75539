#!/usr/bin/env python3
"""Do two trees' attention kernels give the same bits on this GPU?

    python3 tools/attention_bits_ab.py --baseline DIR [--out OUT_DIR]

For a change meant to keep every output bit (an instruction saved, a register freed): runs the
same seeded inputs through ``gqa_attention`` (replay-shaped steps with bit rows after chains and
with bool masks, q = 1 decode at both model shapes, 24- and 64-node trees, a long causal query
chain, the query-invariant mode), ``packed_prefill_attention`` and ``segmented_attention`` (d = 72 / 80 / 128) once from this
tree's packages and once from ``DIR/packages/*/src`` (make it with ``mkdir -p build/base && git
archive main packages | tar -x -C build/base``, and carry it), each in its own process, and prints
how many output elements differ per case. Needs a CUDA GPU; no uv (the machine's torch / triton).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _dump(dst: Path) -> None:
    """The outputs of every case, from the packages on ``sys.path``, into ``dst``."""
    import torch

    from flashrt_kernels.attention import (
        bench,
        gqa_attention,
        packed_prefill_attention,
        segmented_attention,
    )
    from flashrt_kernels.attention.properties import random_tree_mask

    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    res = {}
    for scale in (0.25, 1.0):
        sets, cl, ql, _, _, (bits, chains) = bench._step_sets(scale)
        q, k, v, mask, _ = sets[0]
        res[f"step x{scale}, bit rows"] = gqa_attention(q, k, v, cl, ql, tree_mask=bits,
                                                        chain_lens=chains)  # fmt: skip
        res[f"step x{scale}, bool mask"] = gqa_attention(q, k, v, cl, ql, tree_mask=mask)
        del sets
    cases = ((4, 2048, 1, 16, 2, False), (1, 32768, 1, 32, 8, False), (8, 8192, 24, 16, 2, True),
             (8, 2048, 64, 16, 2, True), (3, 1000, 300, 16, 2, False))  # fmt: skip
    for bsz, length, n, hq, hkv, tree in cases:
        q = torch.randn(bsz, n, hq, 128, dtype=dt, device=dev)
        k = torch.randn(bsz, length + n, hkv, 128, dtype=dt, device=dev)
        v = torch.randn_like(k)
        cl = torch.full((bsz,), length, dtype=torch.int32, device=dev)
        ql = torch.full((bsz,), n, dtype=torch.int32, device=dev)
        mask = None
        if tree:
            mask = torch.stack([random_tree_mask(n, 8, b) for b in range(bsz)]).to(dev)
        name = f"B={bsz} L={length} q={n} {hq}/{hkv}{' tree' if tree else ''}"
        res[name] = gqa_attention(q, k, v, cl, ql, tree_mask=mask)
        if n <= 64 or not tree:
            res[name + ", query-invariant"] = gqa_attention(q, k, v, cl, ql, tree_mask=mask,
                                                            query_invariant=True)  # fmt: skip
    new, prefix = [392, 120, 40, 352, 600, 88, 200, 1000], [0, 2000, 4000, 300, 0, 1000, 3000, 50]
    q = torch.randn(sum(new), 16, 128, dtype=dt, device=dev)
    cap = max(n + c for n, c in zip(new, prefix, strict=True))
    k = torch.randn(len(new), cap, 2, 128, dtype=dt, device=dev)
    cu = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], dtype=torch.int32, device=dev)
    cl = torch.tensor(prefix, dtype=torch.int32, device=dev)
    res["packed prefill after prefixes"] = packed_prefill_attention(q, k, torch.randn_like(k), cu,
                                                                    cl, max(new))  # fmt: skip
    for d, n_seg, seg in ((80, 44, 64), (72, 16, 720), (128, 4, 500)):
        t = n_seg * seg
        q, k, v = (torch.randn(t, 16, d, dtype=dt, device=dev) for _ in range(3))
        cu = torch.arange(0, t + 1, seg, dtype=torch.int32, device=dev)
        res[f"segments {n_seg} x {seg}, d={d}"] = segmented_attention(q, k, v, cu, seg)
    torch.save({key: out.cpu() for key, out in res.items()}, dst)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--baseline", type=Path, help="a copy of another tree (its packages/)")
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "attention_bits_ab")
    ap.add_argument("--src-root", type=Path, help=argparse.SUPPRESS)  # the per-tree worker
    ap.add_argument("--dump", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.dump is not None:
        sys.path[:0] = sorted(str(p) for p in (args.src_root / "packages").glob("*/src"))
        _dump(args.dump)
        return 0
    if args.baseline is None:
        ap.error("--baseline DIR is required")
    args.out.mkdir(parents=True, exist_ok=True)
    dumps = {}
    for name, root in (("ours", ROOT), ("baseline", args.baseline.resolve())):
        dumps[name] = args.out / f"{name}.pt"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--src-root", str(root),
               "--dump", str(dumps[name])]  # fmt: skip
        print(f"== {name}: {root}", flush=True)
        if subprocess.run(cmd).returncode != 0:
            print(f"attention_bits_ab: the {name} run failed")
            return 1
    import torch

    ours, base = (torch.load(dumps[n], weights_only=True) for n in ("ours", "baseline"))
    print("| case | elements differing | max abs diff |\n|---|---|---|")
    differ = 0
    for key, a in ours.items():
        b = base[key]
        n = (a.view(torch.int16) != b.view(torch.int16)).sum().item()
        diff = (a.float() - b.float()).abs().nan_to_num(0.0).max().item()
        differ += n > 0
        print(f"| {key} | {n} of {a.numel()} | {diff:.3g} |", flush=True)
    print(f"{len(ours) - differ} of {len(ours)} cases bit for bit the same")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
