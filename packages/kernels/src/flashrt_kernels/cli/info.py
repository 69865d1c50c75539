"""``flashrt info``: software versions, the GPU, and which backends run here."""

from __future__ import annotations

import importlib
import platform

import torch

from flashrt_kernels.backends import (
    available_backends,
    device_capability,
    triton_interpreter_active,
)
from flashrt_kernels.benchmarking import markdown_table


def _version(module: str) -> str:
    try:
        return getattr(importlib.import_module(module), "__version__", "installed")
    except Exception:
        return "not installed"


def register(sub) -> None:
    p = sub.add_parser("info", help="versions, GPU, and which backends can run here")
    p.set_defaults(func=run)


def run(args) -> int:
    import flashrt_kernels

    rows = [
        {"item": "flashrt-kernels", "value": flashrt_kernels.__version__},
        {"item": "python", "value": platform.python_version()},
        {"item": "torch", "value": torch.__version__},
        {"item": "triton", "value": _version("triton")},
        {"item": "cupy", "value": _version("cupy")},
        {"item": "cuda-python (cuda.bindings)", "value": _version("cuda.bindings")},
        {"item": "CUDA C++ kernels compiled by", "value": _cuda_compiler()},
        {"item": "nvidia-cutlass-dsl", "value": _version("cutlass")},
    ]
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        cap = device_capability(0)
        rows += [
            {
                "item": "GPU",
                "value": f"{props.name} ({props.multi_processor_count} SMs, "
                f"{props.total_memory / 2**30:.0f} GiB)",
            },
            {"item": "compute capability", "value": f"{cap[0]}.{cap[1]}"},
            {
                "item": "backends on cuda",
                "value": ", ".join(available_backends(torch.device("cuda"))),
            },
        ]
    else:
        rows.append({"item": "GPU", "value": "none (CUDA not available)"})
    cpu = ", ".join(available_backends(torch.device("cpu")))
    note = " (Triton through its CPU interpreter)" if triton_interpreter_active() else ""
    rows.append({"item": "backends on cpu", "value": cpu + note})
    for name, status in getattr(args, "plugin_status", []):
        rows.append({"item": f"plugin {name}", "value": status})
    print(markdown_table(rows))
    return 0


def _cuda_compiler() -> str:
    """Who compiles the CUDA C++ backends here (``backends.cuda_compiler``), if anyone."""
    from flashrt_kernels.backends import cuda_compiler

    return {"cupy": "CuPy (NVRTC)", "nvrtc": "NVRTC through cuda.bindings"}.get(
        cuda_compiler(), "nothing (no CuPy, no NVRTC)"
    )
