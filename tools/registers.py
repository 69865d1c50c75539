#!/usr/bin/env python3
"""Registers and spills of the attention kernels' real launches, compiled for sm_90a without a GPU.

    uv run python tools/registers.py [--ptxas PATH]

Each case calls a launcher with CPU tensors of real shapes; ``flashrt_kernels.testing.
compile_only`` makes every Triton launch compile only (Hopper target), with the launch's own
specialization (the divisibility attributes of its pointers and strides: a hand-written signature
without them compiles another kernel, one that spilled where the real one does not). ptxas (Triton's own, or ``--ptxas``) then
reports each compiled kernel. The numbers are this machine's Triton and ptxas, not necessarily a
GPU machine's.
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import tempfile

import torch
import triton

from flashrt_kernels.testing import compile_only

BF16 = torch.bfloat16


def _ptxas_report(ptx: str, ptxas: str) -> str:
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx.replace(".target sm_90\n", ".target sm_90a\n"))
    res = subprocess.run([ptxas, "-arch=sm_90a", "-v", f.name, "-o", os.devnull],
                         capture_output=True, text=True)  # fmt: skip
    os.unlink(f.name)
    lines = [ln.split("info    : ")[-1].strip() for ln in res.stderr.splitlines()]
    regs = next((ln for ln in lines if "registers" in ln), "?")
    spill = next((ln for ln in lines if "spill" in ln), "?")
    return f"{regs.split(',')[0]}; {spill}"


def _empty(*shape, dtype=BF16):
    return torch.empty(*shape, dtype=dtype)


def _gqa_step(config, masks=("causal", "bool")):
    """A replay-shaped step (B = 8, 150 queries, 16/2 heads, d = 128) under ``config``, once per
    mask form: causal, a bool mask, bit rows after each row's causal chain."""
    from flashrt_kernels.attention.gqa_kernels import launch_gqa_tiles
    from flashrt_kernels.attention.splits import workspace_numel

    bsz, q_max, hq, hkv, d, cap = 8, 150, 16, 2, 128, 8200
    lens = torch.zeros(bsz, dtype=torch.int32)
    k = _empty(bsz, cap, hkv, d)
    forms = {"causal": (0, None, None),
             "bool": (1, torch.zeros(bsz, q_max, q_max, dtype=torch.uint8), None),
             "chain": (2, torch.zeros(bsz, q_max, dtype=torch.int64), lens)}  # fmt: skip
    for mode, mask, chain in (forms[m] for m in masks):
        launch_gqa_tiles(_empty(bsz, q_max, hq, d), k, k, _empty(bsz, q_max, hq, d), lens, lens,
                         q_starts=None, cache_rows=None, mask=mask, mask_mode=mode, q_max=q_max,
                         split=True, scale=0.1, config=config, chain_lens=chain,
                         workspace=torch.empty(workspace_numel(bsz, q_max, hq, hkv, d, cap)))  # fmt: skip


def _gqa_decode(hq, hkv, config=None):
    """A decode step (B = 8, q = 1, d = 128) at ``hq`` / ``hkv`` heads: the narrow tiles and the
    split combine of the model's ``TARGET`` (64 slots at 32/8)."""
    from flashrt_kernels.attention.gqa_kernels import launch_gqa_tiles
    from flashrt_kernels.attention.splits import workspace_numel

    bsz, d, cap = 8, 128, 32800
    lens = torch.zeros(bsz, dtype=torch.int32)
    k = _empty(bsz, cap, hkv, d)
    launch_gqa_tiles(_empty(bsz, 1, hq, d), k, k, _empty(bsz, 1, hq, d), lens, lens,
                     q_starts=None, cache_rows=None, mask=None, mask_mode=0, q_max=1, split=True,
                     scale=0.1, workspace=torch.empty(workspace_numel(bsz, 1, hq, hkv, d, cap)),
                     config=config)  # fmt: skip


def _invariant(config, bits: bool = False):
    """Query-invariant launches: a 450-token causal chain, then a 24-node tree (a bool mask, or
    ``bits``: bit rows, the form the lossless preset sends)."""
    from flashrt_kernels.attention import splits
    from flashrt_kernels.attention.decode import gqa_attention

    old = dict(splits.INVARIANT)
    splits.INVARIANT.update(config)
    try:
        lens = torch.zeros(8, dtype=torch.int32)
        k = _empty(8, 8300, 2, 128)
        gqa_attention(_empty(2, 450, 16, 128), k[:2], k[:2], lens[:2], lens[:2],
                      query_invariant=True)  # fmt: skip
        mask = torch.zeros(8, 24, dtype=torch.int64) if bits else torch.zeros(8, 24, 24).bool()
        gqa_attention(_empty(8, 24, 16, 128), k, k, lens, lens, query_invariant=True,
                      tree_mask=mask)  # fmt: skip
    finally:
        splits.INVARIANT.clear()
        splits.INVARIANT.update(old)


def _segmented(d, seg):
    from flashrt_kernels.attention import segmented_attention

    n = 16 * seg
    x = _empty(n, 16, d)
    segmented_attention(x, x, x, torch.arange(0, n + 1, seg, dtype=torch.int32), seg)


CASES = {
    "gqa step (narrow, wide; causal, bool mask)": lambda: _gqa_step(None),
    "gqa step, wide tiles with pointer loads": lambda: _gqa_step({"wide": {"TMA": False}}),
    "gqa step, bit rows after chains": lambda: _gqa_step(None, ("chain",)),
    "gqa decode, 32/8 heads": lambda: _gqa_decode(32, 8),
    "gqa step, the split merge in the tile launch": lambda: _gqa_step(
        {"MERGE": True}, ("causal", "bool", "chain")
    ),
    "gqa decode 16/2 and 32/8, the split merge": lambda: [
        _gqa_decode(h, kv, {"MERGE": True}) for h, kv in ((16, 2), (32, 8))
    ],
    "invariant (causal chain, tree as a bool mask)": lambda: _invariant({}),
    "invariant (causal chain, tree as bit rows)": lambda: _invariant({}, bits=True),
    "invariant, causal node steps": lambda: _invariant({"CAUSAL_TILE_STEPS": False}),
    "segmented d = 72, 720-patch images": lambda: _segmented(72, 720),
    "segmented d = 80, 64-patch windows": lambda: _segmented(80, 64),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    nvbin = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    ap.add_argument("--ptxas", default=sorted(glob.glob(os.path.join(nvbin, "ptxas*")))[-1])
    args = ap.parse_args()
    compile_only.install()
    print("| case | kernel | registers; spills |\n|---|---|---|")
    for name, case in CASES.items():
        compile_only.COMPILED.clear()
        case()
        for kernel_name, kernel in compile_only.COMPILED:
            print(f"| {name} | {kernel_name} | {_ptxas_report(kernel.asm['ptx'], args.ptxas)} |",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
