"""Few-row linears (batch-invariant bf16, W8A16, W4A8, INT4 LM head) and prefill GEMMs (FP8)."""

from flashrt_kernels.gemm.few_rows import linear, linear_gate_up_swiglu, linear_qkv

__all__ = ["linear", "linear_gate_up_swiglu", "linear_qkv"]
