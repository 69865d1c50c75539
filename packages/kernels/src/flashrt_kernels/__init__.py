"""flashrt-kernels: realtime GPU inference kernels for small-batch, latency-bound models.

Every op is a plain function on torch tensors with ``out=`` buffers and a ``backend=`` argument,
also registered as a ``torch.library`` custom op under the ``flashrt`` namespace.

Ops are imported lazily on first use: Triton decides at a kernel's definition whether it runs
compiled or through its CPU interpreter, so importing this package must not define kernels before
the caller (a test configuration, the ``flashrt`` command) has made that choice.
"""

from __future__ import annotations

import importlib

from flashrt_kernels.backends import BACKENDS, available_backends, device_capability

__version__ = "0.1.0"

# public name -> module that defines it
_OPS = {
    "rms_norm": "flashrt_kernels.norm",
    **dict.fromkeys(
        ("gqa_attention", "packed_prefill_attention", "segmented_attention", "KVPool",
         "workspace_numel", "pack_tree_mask", "rope_append"),
        "flashrt_kernels.attention",
    ),
    **dict.fromkeys(
        ("linear", "linear_qkv", "linear_gate_up_swiglu", "w4a8_linear", "fp8_linear",
         "nvfp4_linear"),
        "flashrt_kernels.gemm",
    ),
    **dict.fromkeys(
        ("quantize_rows", "rms_norm_quantize", "silu_mul", "silu_mul_quantize",
         "layer_norm_quantize", "rotate_quantize_rows", "quantize_rows_nvfp4",
         "rms_norm_quantize_nvfp4"),
        "flashrt_kernels.quant",
    ),
}  # fmt: skip

# subpackages reachable as attributes (``flashrt_kernels.topk.topk(...)``). ``topk`` is one of them
# and not an op name here: a lazily bound function would shadow (or be shadowed by) the subpackage
# of the same name depending on what was imported first.
_PACKAGES = ("attention", "gemm", "norm", "quant", "testing", "topk")

__all__ = ["BACKENDS", "__version__", "available_backends", "device_capability", *_OPS, "topk"]


def __getattr__(name: str):
    if name in _OPS:
        value = getattr(importlib.import_module(_OPS[name]), name)
        globals()[name] = value
        return value
    if name in _PACKAGES:
        return importlib.import_module(f"flashrt_kernels.{name}")
    raise AttributeError(f"module 'flashrt_kernels' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
