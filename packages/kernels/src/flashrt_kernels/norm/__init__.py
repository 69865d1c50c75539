"""Normalization ops."""

from flashrt_kernels.norm.rms_norm import rms_norm

__all__ = ["rms_norm"]
