"""Backend selection and device-capability detection.

Every op takes ``backend=`` with one of ``BACKENDS``. ``"auto"`` picks the fastest implementation
the op has that can run on the tensors' device: a compiled kernel on a CUDA device, the torch
reference on a CPU (unless the Triton interpreter is active, which tests turn on to run the Triton
kernels on a CPU).
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch

BACKENDS = ("auto", "cuda", "cute", "triton", "reference")

# Preference order for "auto": the first one the op implements and the device can run wins.
_AUTO_ORDER = ("cute", "cuda", "triton", "reference")


def triton_interpreter_active() -> bool:
    """True when Triton kernels run through its CPU interpreter (set before Triton is imported)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def maxnreg_kwargs(cap: int | None) -> dict:
    """The launch keyword for a per-thread register cap (ptxas's ``.maxnreg``): none without a cap
    or under the interpreter, which compiles nothing."""
    return {} if cap is None or triton_interpreter_active() else {"maxnreg": cap}


@functools.cache
def module_available(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


@functools.cache
def device_capability(index: int = 0) -> tuple[int, int] | None:
    """(major, minor) compute capability of CUDA device ``index``, or None without CUDA."""
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability(index)


@functools.cache
def sm_count(index: int = 0) -> int:
    """Streaming multiprocessors of CUDA device ``index`` (grid sizing)."""
    return torch.cuda.get_device_properties(index).multi_processor_count


def pdl_supported(device: torch.device) -> bool:
    """Whether Triton kernels on ``device`` can use programmatic dependent launch: compiled (not
    interpreted) kernels on a Hopper-or-newer GPU."""
    if device.type != "cuda" or triton_interpreter_active():
        return False
    cap = device_capability(device.index if device.index is not None else 0)
    return cap is not None and cap[0] >= 9


def cuda_compiler() -> str | None:
    """Who compiles the CUDA C++ backends in this process: ``"cupy"`` where CuPy is installed,
    else ``"nvrtc"`` where cuda.bindings' NVRTC loads (``flashrt_kernels.cuda_nvrtc``), else None."""
    if module_available("cupy"):
        return "cupy"
    from flashrt_kernels import cuda_nvrtc

    return "nvrtc" if cuda_nvrtc.available() else None


def backend_runs_on(backend: str, device: torch.device) -> bool:
    """Whether ``backend`` can execute on ``device`` in this process."""
    if backend == "reference":
        return True
    if backend == "triton":
        if device.type == "cuda":
            return module_available("triton")
        return device.type == "cpu" and triton_interpreter_active() and module_available("triton")
    if backend == "cuda":
        return device.type == "cuda" and cuda_compiler() is not None
    if backend == "cute":
        return device.type == "cuda" and module_available("cutlass")
    return False


def available_backends(device: torch.device) -> list[str]:
    """The concrete backends (no "auto") that can run on ``device`` here."""
    return [b for b in _AUTO_ORDER if backend_runs_on(b, device)]


def resolve_backend(
    op: str, requested: str, device: torch.device, implemented: tuple[str, ...]
) -> str:
    """Turn a user's ``backend=`` into the concrete backend to run, or raise a clear error."""
    if requested not in BACKENDS:
        raise ValueError(f"{op}: backend must be one of {BACKENDS}, got {requested!r}")
    if requested == "auto":
        for candidate in _AUTO_ORDER:
            if candidate in implemented and backend_runs_on(candidate, device):
                return candidate
        raise RuntimeError(f"{op}: no implementation among {implemented} runs on {device}")
    if requested not in implemented:
        raise ValueError(
            f"{op}: backend {requested!r} is not implemented; this op has {implemented}"
        )
    if not backend_runs_on(requested, device):
        raise ValueError(
            f"{op}: backend {requested!r} cannot run on device {device} here "
            f"(runnable: {available_backends(device)})"
        )
    return requested
