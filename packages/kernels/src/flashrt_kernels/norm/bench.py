"""RMSNorm benchmark: ours vs torch's eager composite and ``torch.nn.functional.rms_norm``."""

from __future__ import annotations

import torch

from flashrt_kernels.benchmarking import floor_us, rotation, time_graph_us
from flashrt_kernels.norm.rms_norm import rms_norm
from flashrt_kernels.registry import register_benchmark

WIDTHS = (2048, 4096, 1152, 1280)
ROWS = (1, 16, 128, 1024, 4096, 16384)


def _composite(x, w, eps, res):
    if res is not None:
        x = x + res
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def _functional(x, w, eps, res):
    if res is not None:
        x = x + res
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps)


def _ours(x, w, eps, res, out, res_out):
    return rms_norm(x, w, eps, residual=res, out=out, residual_out=res_out)


def _call(fn, inputs, w, eps):
    x, res, out, res_out = inputs
    if fn is _ours:
        return lambda: fn(x, w, eps, res, out, res_out)
    return lambda: fn(x, w, eps, res)


@register_benchmark("rms_norm", "norm", "fused RMSNorm (+ residual) vs torch eager and F.rms_norm")
def run(quick: bool = False) -> list[dict]:
    rows_out = []
    eps, dt = 1e-6, torch.bfloat16
    widths = WIDTHS[:2] if quick else WIDTHS
    for residual in (False, True):
        for cols in widths:
            for rows in ROWS:
                nbytes = rows * cols * dt.itemsize * (4 if residual else 2) + cols * dt.itemsize
                sets = []
                for _ in range(rotation(nbytes)):
                    x = torch.randn(rows, cols, dtype=dt, device="cuda")
                    r = torch.randn_like(x) if residual else None
                    sets.append(
                        (x, r, torch.empty_like(x), torch.empty_like(x) if residual else None)
                    )
                w = torch.randn(cols, dtype=dt, device="cuda")

                t_ours = time_graph_us([_call(_ours, s, w, eps) for s in sets])
                t_comp = time_graph_us([_call(_composite, s, w, eps) for s in sets])
                t_func = time_graph_us([_call(_functional, s, w, eps) for s in sets])
                fl = floor_us(nbytes)
                rows_out.append(
                    {
                        "residual": residual,
                        "rows": rows,
                        "cols": cols,
                        "ours_us": t_ours,
                        "eager_us": t_comp,
                        "F.rms_norm_us": t_func,
                        "x_eager": t_comp / t_ours,
                        "x_F.rms_norm": t_func / t_ours,
                        "floor_us": fl,
                        "floor_frac": fl / t_ours,
                    }
                )
    return rows_out
