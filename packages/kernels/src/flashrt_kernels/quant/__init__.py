"""Quantized formats (pack, unpack, converters) and producers of quantized rows."""

from flashrt_kernels.quant.rows import quantize_rows, rms_norm_quantize, silu_mul, silu_mul_quantize

__all__ = ["quantize_rows", "rms_norm_quantize", "silu_mul", "silu_mul_quantize"]
