#!/usr/bin/env python3
"""Offline check of ``nvfp4_linear`` for Hopper, no GPU needed: compile every launch
configuration of ``tools/tune_nvfp4.py`` (and the activation pre-pass and the split sum) for
sm_90 through ptxas, then count the main loop's instructions a K step, in PTX and in SASS (through
the nvdisasm that Triton ships), for the decode tile (16 x 64 x 128, activations dequantized in the
loop) and the prefill tile (128 x 128 x 64, bf16 activations).

    python3 tools/nvfp4_ptx.py [--module PATH]

``--module`` counts another copy of ``nvfp4_linear.py`` (say, main's) the same way.
"""

from __future__ import annotations

import argparse
import collections
import importlib
import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = sorted(str(p) for p in (ROOT / "packages").glob("*/src")) + [str(ROOT / "tools")]

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

POINTERS = {"A": "*u8", "ASF": "*fp8e4nv", "AA": "*fp32", "WC": "*u8", "WSF": "*fp8e4nv",
            "WA": "*fp32", "Y": "*bf16", "WS": "*fp32", "C": "*u8", "SF": "*fp8e4nv",
            "OUT": "*bf16"}  # fmt: skip


def compile_sm90(fn, const: dict, warps: int, stages: int, pointers: dict | None = None):
    """Compile @triton.jit ``fn`` to a cubin for sm_90: pointers from POINTERS, int32 sizes and
    strides, 16-divisible where a real launch would be (all but m / splits)."""
    ptrs = {**POINTERS, **(pointers or {})}
    sig = {nm: ptrs.get(nm, "constexpr" if nm in const else "i32") for nm in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, nm in enumerate(fn.arg_names)
             if nm not in const and nm not in ("m", "splits")}  # fmt: skip
    src = ASTSource(fn, sig, const, attrs)
    opts = {"num_warps": warps, "num_stages": stages}
    return triton.compile(src, target=GPUTarget("cuda", 90, 128), options=opts)


def loop_counts(ptx: str) -> tuple[int, int, collections.Counter]:
    """(instructions, wgmma, opcode counts) of the loop body holding the most wgmma."""
    lines = [ln.strip() for ln in ptx.splitlines()]
    best = (0, 0, collections.Counter())
    for i, ln in enumerate(lines):
        if not re.match(r"^\$L__BB\d+_\d+:", ln):
            continue
        label = ln.split(":")[0]
        for j in range(i + 1, len(lines)):
            if lines[j].startswith("@") and "bra" in lines[j] and lines[j].endswith(label + ";"):
                body = [
                    b
                    for b in lines[i + 1 : j]
                    if b and not b.startswith(("//", "$L", ".", "{", "}"))
                ]
                mma = sum("wgmma.mma_async" in b for b in body)
                if mma > best[1]:
                    best = (len(body), mma, collections.Counter(b.split()[0] for b in body))
                break
    return best


def sass_loop_counts(sass: str) -> tuple[int, int, collections.Counter]:
    """(instructions, HGMMA, opcode counts) of the SASS loop (label .. backward BRA) holding the
    most HGMMA."""
    lines, labels = sass.splitlines(), {}
    best = (0, 0, collections.Counter())
    for i, ln in enumerate(lines):
        if m := re.match(r"^(LBB\d+):", ln):
            labels[m.group(1)] = i
        if (m := re.search(r"BRA (LBB\d+);", ln)) and m.group(1) in labels:
            body = [b.split("\t", 1)[1] for b in lines[labels[m.group(1)] + 1 : i + 1] if "\t" in b]
            mma = sum("HGMMA" in b for b in body)
            if mma > best[1]:
                ops = (b.split()[1 if b.startswith("@") else 0].split(".")[0] for b in body)
                best = (len(body), mma, collections.Counter(ops))
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--module", default=None, help="another nvfp4_linear.py to count")
    args = ap.parse_args()
    nv = importlib.import_module("flashrt_kernels.gemm.nvfp4_linear")
    if args.module:
        spec = importlib.util.spec_from_file_location("nvfp4_other", args.module)
        nv = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(nv)
    names = nv._nvfp4_linear_kernel.arg_names
    if not args.module:
        import tune_nvfp4

        seen = set()
        for m, n, k in ((16, 4096, 12288), (64, 6144, 4096), (2048, 6144, 4096), (32, 2560, 2048)):
            for c in tune_nvfp4.candidates(m, n, k) + [nv.nvfp4_launch_config(m, n, k)]:
                c = dict(c)
                a_codes, split = c.pop("A_CODES"), c.pop("SPLIT_K", 1)
                warps, stages = c.pop("num_warps"), c.pop("num_stages")
                const = dict(A_CODES=a_codes, A_PER_ROW=True, W_PER_ROW=True, SPLIT=split > 1,
                             UPCAST=False, **c)  # fmt: skip
                key = (tuple(sorted(const.items())), warps, stages)
                if key not in seen:
                    seen.add(key)
                    compile_sm90(nv._nvfp4_linear_kernel, const, warps, stages,
                                 {"A": "*u8" if a_codes else "*bf16"})  # fmt: skip
        compile_sm90(nv._nvfp4_dequant_rows_kernel, dict(BLOCK_R=32, BLOCK_K=128, UPCAST=False),
                     4, 1)  # fmt: skip
        compile_sm90(nv._split_sum_kernel, dict(A_PER_ROW=True, W_PER_ROW=True, BLOCK_M=16,
                                                BLOCK_N=128), 4, 1)  # fmt: skip
        print(f"compiled for sm_90: {len(seen)} configurations, the pre-pass, the split sum")
    for a_codes, bm, bn, bk, warps in ((True, 16, 64, 128, 4), (False, 128, 128, 64, 8)):
        const = dict(A_CODES=a_codes, A_PER_ROW=True, W_PER_ROW=True, BLOCK_M=bm, BLOCK_N=bn,
                     BLOCK_K=bk, GROUP_M=1, UPCAST=False)  # fmt: skip
        if "SPLIT" in names:
            const["SPLIT"] = False
        kern = compile_sm90(nv._nvfp4_linear_kernel, const, warps, 3,
                            {"A": "*u8" if a_codes else "*bf16"})  # fmt: skip
        n_instr, n_mma, ops = loop_counts(kern.asm["ptx"])
        loads = {o: c for o, c in ops.items() if o.startswith(("ld.shared", "cp.async"))}
        print(f"{bm} x {bn} x {bk}: {n_instr} PTX instructions a K step, {n_mma} wgmma; {loads}")
        n_sass, n_hgmma, sops = sass_loop_counts(kern.asm["sass"])
        print(f"  SASS: {n_sass} a K step, {n_hgmma} HGMMA; most: {sops.most_common(8)}")


if __name__ == "__main__":
    main()
