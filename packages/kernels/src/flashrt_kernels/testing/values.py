"""Seeded tensors with adversarial value distributions.

``make_values(kind, shape, dtype, seed)`` is deterministic in (kind, shape, dtype, seed) whatever
the device: the data is generated on the CPU and then moved.
"""

from __future__ import annotations

import torch

VALUE_KINDS = (
    "normal",  # N(0, 1)
    "uniform",  # U(-1, 1)
    "ties",  # few distinct values, many exact repeats
    "zeros",  # all exact zeros
    "relu_plateau",  # ReLU of a normal: about half exact zeros
    "inf",  # normal with some +inf and -inf
    "nan",  # normal with some NaN
    "huge",  # magnitudes near the dtype's max / 4
    "tiny",  # magnitudes near the dtype's smallest normal
    "denormal",  # subnormal magnitudes of the dtype (fp32 for integer dtypes)
    "outlier",  # normal rows each with one huge value
)


def _generator(seed: int) -> torch.Generator:
    g = torch.Generator(device="cpu")
    g.manual_seed(int(seed))
    return g


def make_values(
    kind: str,
    shape: tuple[int, ...] | list[int],
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    device: torch.device | str = "cpu",
    scale: float = 1.0,
) -> torch.Tensor:
    """A tensor of ``shape`` with the ``kind`` distribution, cast to ``dtype``."""
    if kind not in VALUE_KINDS:
        raise ValueError(f"kind must be one of {VALUE_KINDS}, got {kind!r}")
    shape = tuple(int(s) for s in shape)
    g = _generator(seed)
    finfo = torch.finfo(dtype if dtype.is_floating_point else torch.float32)
    n = 1
    for s in shape:
        n *= s
    base = torch.randn(shape, generator=g, dtype=torch.float64) * scale
    if kind == "normal":
        x = base
    elif kind == "uniform":
        x = (torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1) * scale
    elif kind == "ties":
        levels = torch.tensor([-2.0, -0.5, 0.0, 0.5, 1.0, 3.0], dtype=torch.float64) * scale
        x = levels[torch.randint(0, len(levels), shape, generator=g)]
    elif kind == "zeros":
        x = torch.zeros(shape, dtype=torch.float64)
    elif kind == "relu_plateau":
        x = base.clamp_min(0.0)
    elif kind in ("inf", "nan"):
        x = base.clone()
        pick = torch.rand(shape, generator=g) < 0.05
        if n:
            pick.view(-1)[torch.randint(0, n, (1,), generator=g)] = True
        if kind == "inf":
            sign = torch.where(torch.rand(shape, generator=g) < 0.5, -1.0, 1.0).double()
            x[pick] = (sign * float("inf"))[pick]
        else:
            x[pick] = float("nan")
    elif kind == "huge":
        x = torch.sign(base) * (finfo.max / 4) * (0.5 + torch.rand(shape, generator=g).double())
    elif kind == "tiny":
        x = torch.sign(base) * finfo.tiny * (1 + 7 * torch.rand(shape, generator=g).double())
    elif kind == "denormal":
        sub = finfo.smallest_normal * torch.rand(shape, generator=g).double()
        x = torch.sign(base) * sub
    elif kind == "outlier":
        x = base.clone()
        if n and len(shape) >= 1 and shape[-1] > 0:
            rows = x.reshape(-1, shape[-1])
            cols = torch.randint(0, shape[-1], (rows.shape[0],), generator=g)
            rows[torch.arange(rows.shape[0]), cols] = 1000.0 * scale
            x = rows.reshape(shape)
    if not dtype.is_floating_point:
        info = torch.iinfo(dtype)
        x = torch.nan_to_num(x, nan=0.0, posinf=info.max, neginf=info.min)
        x = x.round().clamp(info.min, info.max)
    return x.to(dtype).to(device)
