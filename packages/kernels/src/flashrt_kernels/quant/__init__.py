"""Quantized formats (pack, unpack, converters) and producers of quantized rows."""

from flashrt_kernels.quant.layer_norm import layer_norm, layer_norm_quantize
from flashrt_kernels.quant.nvfp4_rows import quantize_rows_nvfp4, rms_norm_quantize_nvfp4
from flashrt_kernels.quant.rotate_quantize import rotate_quantize_rows
from flashrt_kernels.quant.rows import quantize_rows, rms_norm_quantize, silu_mul, silu_mul_quantize

__all__ = [
    "layer_norm",
    "layer_norm_quantize",
    "quantize_rows",
    "quantize_rows_nvfp4",
    "rms_norm_quantize",
    "rms_norm_quantize_nvfp4",
    "rotate_quantize_rows",
    "silu_mul",
    "silu_mul_quantize",
]
