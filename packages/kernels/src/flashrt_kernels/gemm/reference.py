"""Torch specification of the gemm family.

- ``linear``: ``x @ w.T`` (times a per-output-column scale for int8 / fp8 weights), products and
  sums in float64, rounded once to bf16 (the few-row kernels accumulate in fp32: ``faithful``).
- ``w4a8_linear``: the integer W4A8 arithmetic (``quant.reference.w4a8_linear``): ``exact``.
- ``fp8_linear``: ``act(acc * xs[m] * ws[n] + bias) + residual`` with acc the fp32 dot of the fp8
  codes, bias and residual in fp32, one rounding to bf16 at the end.
"""

from __future__ import annotations

import math

import torch

from flashrt_kernels.quant.reference import w4a8_linear

__all__ = ["abs_products", "fp8_linear", "gelu", "linear", "linear_f64", "w4a8_linear"]


def linear_f64(x, w, w_scale=None) -> torch.Tensor:
    y = x.double() @ w.double().t()
    if w_scale is not None:
        y = y * w_scale.double()[None, :]
    return y


def abs_products(x, w, w_scale=None) -> torch.Tensor:
    """sum_k |x_k w_k scale| in float64: the scale of the rounding error of a dot product."""
    return linear_f64(x.abs(), w.abs() if w.dtype != torch.int8 else w.abs(), w_scale)


def linear(x, w, w_scale=None) -> torch.Tensor:
    return linear_f64(x, w, w_scale).to(torch.bfloat16)


def gelu(v: torch.Tensor, approximate: str) -> torch.Tensor:
    if approximate == "tanh":
        return 0.5 * v * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v**3)))
    return 0.5 * v * (1.0 + torch.erf(v / math.sqrt(2.0)))


def fp8_linear(xq, xs, wq, ws, bias=None, activation="none", residual=None) -> torch.Tensor:
    acc = xq.double() @ wq.double().t()
    v = acc * xs.double()[:, None] * ws.double()[None, :]
    if bias is not None:
        v = v + bias.double()[None, :]
    if activation != "none":
        v = gelu(v, activation)
    if residual is not None:
        v = v + residual.double()
    return v.to(torch.bfloat16)
