"""Host-side input validation: every public op checks its inputs before launching anything.

Each helper raises ``TypeError`` (wrong kind of object or dtype) or ``ValueError`` (shape, device,
layout) with a message that names the op, the argument and what was expected. None of them reads
tensor data, so none synchronizes with the device.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch


def _fmt_dtypes(dtypes: Iterable[torch.dtype]) -> str:
    return ", ".join(str(d).replace("torch.", "") for d in dtypes)


def check_tensor(
    op: str,
    name: str,
    t: object,
    *,
    dtypes: Sequence[torch.dtype] | None = None,
    ndim: int | Sequence[int] | None = None,
    shape: Sequence[int | None] | None = None,
    device: torch.device | None = None,
    contiguous: bool = False,
    last_dim_contiguous: bool = False,
) -> torch.Tensor:
    """Check one tensor argument; ``None`` in ``shape`` means any size in that dimension."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if dtypes is not None and t.dtype not in dtypes:
        raise TypeError(f"{op}: {name} must have dtype in ({_fmt_dtypes(dtypes)}), got {t.dtype}")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if t.dim() not in allowed:
            raise ValueError(
                f"{op}: {name} must have {' or '.join(map(str, allowed))} dimensions, "
                f"got shape {tuple(t.shape)}"
            )
    if shape is not None:
        ok = t.dim() == len(shape) and all(
            want is None or got == want for got, want in zip(t.shape, shape, strict=True)
        )
        if not ok:
            want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
            raise ValueError(f"{op}: {name} must have shape {want}, got {list(t.shape)}")
    if device is not None and t.device != device:
        raise ValueError(
            f"{op}: {name} must be on {device} (like the other inputs), got {t.device}"
        )
    if contiguous and not t.is_contiguous():
        raise ValueError(
            f"{op}: {name} must be contiguous, got strides {t.stride()} for shape {tuple(t.shape)}"
        )
    if last_dim_contiguous and t.dim() > 0 and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(
            f"{op}: {name} must have unit stride in its last dimension, got {t.stride()}"
        )
    return t


def check_out(
    op: str,
    name: str,
    out: object,
    *,
    shape: Sequence[int],
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """Check a caller-provided output buffer: exact shape, dtype, device, contiguous."""
    return check_tensor(
        op, name, out, dtypes=(dtype,), shape=list(shape), device=device, contiguous=True
    )


def check_no_alias(op: str, names_and_tensors: Sequence[tuple[str, torch.Tensor]]) -> None:
    """Outputs must not share memory with inputs or each other unless the op says so."""
    seen: list[tuple[str, torch.Tensor]] = []
    for name, t in names_and_tensors:
        for other_name, other in seen:
            if (
                t.numel()
                and other.numel()
                and t.untyped_storage().data_ptr() == other.untyped_storage().data_ptr()
            ):
                raise ValueError(f"{op}: {name} must not share memory with {other_name}")
        seen.append((name, t))


def check_choice(op: str, name: str, value: object, choices: Sequence[object]) -> None:
    if value not in choices:
        raise ValueError(f"{op}: {name} must be one of {tuple(choices)}, got {value!r}")


def check_int(
    op: str, name: str, value: object, *, low: int | None = None, high: int | None = None
) -> int:
    """An integer argument within [low, high] (either bound optional)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{op}: {name} must be an int, got {type(value).__name__}")
    if low is not None and value < low:
        raise ValueError(f"{op}: {name} must be >= {low}, got {value}")
    if high is not None and value > high:
        raise ValueError(f"{op}: {name} must be <= {high}, got {value}")
    return value


def check_float(op: str, name: str, value: object, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{op}: {name} must be a float, got {type(value).__name__}")
    if positive and not value > 0:
        raise ValueError(f"{op}: {name} must be > 0, got {value}")
    return float(value)
