#!/usr/bin/env python3
"""Are the GQA tile kernel's two mask forms bit for bit the same on this GPU?

    PYTHONPATH=<every packages/*/src> python3 tools/attention_mask_forms.py

Runs the attention benchmark's replay-shaped steps (``bench._step_sets``: frame rows of causal
queries beside tree rows) with the mask as bool ``[B, q, q]`` (mode 1) and as bit rows after each
row's causal chain (mode 2 with ``chain_lens``), once as compiled by default and once with FMA
contraction off in the tile kernel (``enable_fp_fusion=False``), and prints how many live outputs
differ between the forms. Both forms are faithful to the reference; the default mode promises no
identity across them (docs/kernels/attention.md, "sixth change"). Needs a CUDA GPU.
"""

from __future__ import annotations

import torch

from flashrt_kernels.attention import bench, gqa_kernels
from flashrt_kernels.attention.gqa_kernels import launch_gqa_tiles
from flashrt_kernels.attention.splits import workspace_numel

DEFAULT_KERNEL = gqa_kernels.gqa_tile_kernel


class _NoContraction:
    """The tile kernel launched with ``enable_fp_fusion=False``."""

    def __getitem__(self, grid):
        launch = DEFAULT_KERNEL[grid]
        return lambda *args, **kwargs: launch(*args, enable_fp_fusion=False, **kwargs)


def _run(sets, cl, ql, bits, chains, form: str) -> torch.Tensor:
    q, k, v, mask, _ = sets[0]
    out = torch.empty_like(q)
    numel = workspace_numel(cl.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3], k.shape[1])
    launch_gqa_tiles(q, k, v, out, cl, ql, q_starts=None, cache_rows=None, q_max=q.shape[1],
                     split=True, workspace=torch.empty(numel, device=q.device),
                     scale=q.shape[3] ** -0.5, **bench.step_masking(form, mask, bits, chains))  # fmt: skip
    return out


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("attention_mask_forms: needs a CUDA GPU")
    print(
        "| context scale | FMA contraction | live outputs differing (bool vs bits) | max abs diff |"
    )
    print("|---|---|---|---|")
    for scale in (0.25, 1.0):
        sets, cl, ql, _, _, (bits, chains) = bench._step_sets(scale)
        live = torch.arange(sets[0][0].shape[1], device=cl.device)[None] < ql[:, None]
        for contraction in (True, False):
            gqa_kernels.gqa_tile_kernel = DEFAULT_KERNEL if contraction else _NoContraction()
            try:
                a = _run(sets, cl, ql, bits, chains, "bool")[live]
                b = _run(sets, cl, ql, bits, chains, "bits")[live]
            finally:
                gqa_kernels.gqa_tile_kernel = DEFAULT_KERNEL
            diff = (a.float() - b.float()).abs().max().item()
            print(f"| {scale} | {'on' if contraction else 'off'} | {(a != b).sum().item()} of "
                  f"{a.numel()} | {diff:.3g} |", flush=True)  # fmt: skip
        del sets


if __name__ == "__main__":
    main()
