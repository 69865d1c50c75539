"""Torch specification of the norm family (the order of operations the kernels follow).

RMSNorm follows the Hugging Face Llama / Qwen order: the residual sum is rounded to the input
dtype (that rounded sum is the new residual stream), the mean of squares is taken in fp32, the
normalized row is rounded to the input dtype, and then multiplied by the weight in that dtype.

The inverse root is ``1 / sqrt(.)``, both correctly rounded (HF writes ``torch.rsqrt``, which is
the same up to its own rounding): torch's ``rsqrt`` is not the same function everywhere, e.g. its
vectorized CPU path and its CUDA path return NaN for an infinite argument where 1/sqrt gives 0, so
the specification would depend on the machine evaluating it.
"""

from __future__ import annotations

import torch


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Returns ``(y, new_residual)``; ``new_residual`` is ``x + residual`` (None without residual)."""
    r = x + residual if residual is not None else x
    rf = r.float()
    inv = 1.0 / torch.sqrt(rf.pow(2).mean(-1, keepdim=True) + eps)
    y = (rf * inv).to(x.dtype) * weight
    return y, (r if residual is not None else None)
