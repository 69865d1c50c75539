#!/usr/bin/env python3
"""How close the indexer logits kernel comes to the float64 reference on realistic keys: the worst
``|I - I_ref| / M`` (``M``: ``reference.logits_magnitude``, the faithful contract's scale) for fp8
and fp4 keys, next to the contract's bound ``RTOL``.

    python3 tools/indexer_logits_accuracy.py [--src DIR] [--batch 4] [--keys 4096]

Keys: gaussian rows with per-key gains in [1, 4], Hadamard-rotated and quantized by the cache's
own write path (64-key pages, shuffled); queries and head weights quantized as the engine does
(64 heads, d = 128, one decode token a row). ``--src DIR`` measures another copy of the packages
(``DIR/packages/*/src``). Needs a CUDA device (the reference runs on the CPU in float64).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", default=str(Path(__file__).resolve().parent.parent))
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--keys", type=int, default=4096, help="keys a row (a multiple of 64)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    sys.path[:0] = sorted(str(p) for p in Path(args.src).glob("packages/*/src"))
    import torch

    from flashrt_dsv4_indexer import key_cache as kc
    from flashrt_dsv4_indexer import reference
    from flashrt_dsv4_indexer.logits import RTOL, paged_indexer_logits

    if not torch.cuda.is_available():
        raise SystemExit("indexer_logits_accuracy: needs a CUDA device")
    if args.keys % 64:
        raise SystemExit(
            f"indexer_logits_accuracy: --keys must be a multiple of 64, got {args.keys}"
        )
    torch.manual_seed(args.seed)
    b, h, d, page, n = args.batch, 64, 128, 64, args.keys
    pages = n // page
    print(f"| format | worst abs(I - I_ref) / M | log2 | RTOL | ({torch.cuda.get_device_name()}, "
          f"B = {b}, {n} keys a row) |\n|---|---|---|---|---|")  # fmt: skip
    for fmt in ("fp8", "fp4"):
        cache = kc.PagedKeyCache(b * pages, page, d, fmt, "cuda")
        bt = torch.randperm(b * pages).reshape(b, pages).int().cuda()
        for r in range(b):
            keys = torch.randn(n, d) * (1 + 3 * torch.rand(n, 1))
            cache.write(bt, torch.full((n,), r, device="cuda"), torch.arange(n, device="cuda"),
                        kc.hadamard_rotate(keys).cuda())  # fmt: skip
        qc, wf = kc.quantize_queries(kc.hadamard_rotate(torch.randn(b, h, d)), torch.randn(b, h))
        lens = torch.full((b,), n, dtype=torch.int32)
        out = paged_indexer_logits(qc.cuda(), wf.cuda(), cache.codes, cache.scales, bt,
                                   lens.cuda(), key_format=fmt)  # fmt: skip
        ref, mag = reference.indexer_logits(qc, wf, cache.codes.cpu(), cache.scales.cpu(), fmt,
                                            bt.cpu(), lens, n, magnitude=True)  # fmt: skip
        worst = ((out.cpu().double() - ref).abs() / mag).max().item()
        log2 = math.log2(worst) if worst > 0 else float("-inf")
        print(f"| {fmt} | {worst:.3g} | {log2:.1f} | 2^{math.log2(RTOL[fmt]):.0f} | |", flush=True)


if __name__ == "__main__":
    main()
