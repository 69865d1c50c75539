"""Few-row linears (batch-invariant bf16, W8A16, W4A8, INT4 LM head) and prefill GEMMs (FP8 W8A8,
NVFP4 W4A4)."""

from flashrt_kernels.gemm.few_rows import linear, linear_gate_up_swiglu, linear_qkv
from flashrt_kernels.gemm.fp8_linear import fp8_linear
from flashrt_kernels.gemm.nvfp4_linear import nvfp4_linear
from flashrt_kernels.gemm.w4a8 import w4a8_linear

__all__ = [
    "fp8_linear",
    "linear",
    "linear_gate_up_swiglu",
    "linear_qkv",
    "nvfp4_linear",
    "w4a8_linear",
]
