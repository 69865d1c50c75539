"""The paged indexer key cache, its two quantized formats, and the write path.

Formats (one key of ``D`` values a token; pages of ``block_size`` tokens; a block table maps a
row's page ``p`` to a physical block):
- ``fp8``: e4m3 codes ``uint8 [blocks, block_size, D]`` and one fp32 scale per token
  ``[blocks, block_size]``: ``k = code * scale``, ``scale = amax / 448`` (1 for an all-zero key).
- ``fp4``: MXFP4: e2m1 codes packed two a byte (even element in the low nibble, sign in bit 3)
  ``uint8 [blocks, block_size, D // 2]`` and one UE8M0 scale byte per 32 values
  ``[blocks, block_size, D // 32]``: ``k = e2m1(code) * 2 ** (byte - 127)``, the exponent being
  ``floor(log2(amax)) - 2`` (e2m1's largest binade) clamped to [-100, 127].
Quantization rounds to nearest, ties to even code, and saturates; it is deterministic (pure torch
integer / exact float steps), so the reference and the fast path see the same codes.

Queries are fp8 too: one scale per (token, head), folded into the head weights (ReLU commutes with a
positive scale), so the logits kernel multiplies codes only.
"""

from __future__ import annotations

import functools
import math

import torch

from flashrt_dsv4_indexer.config import BLOCK_SIZES, KEY_FORMATS

FP8_MAX = 448.0
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
MX_GROUP = 32


@functools.cache
def _hadamard(d: int, device: str) -> torch.Tensor:
    if d < 1 or d & (d - 1):
        raise ValueError(f"hadamard: dimension must be a power of two, got {d}")
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h / math.sqrt(d)).to(device)


def hadamard_rotate(x: torch.Tensor) -> torch.Tensor:
    """``x @ H / sqrt(D)`` over the last dimension (orthonormal: q . k is unchanged when both are
    rotated; the rotation spreads outliers before quantization). Computed in float64."""
    h = _hadamard(x.shape[-1], str(x.device))
    return (x.double() @ h).to(x.dtype)


# fp8 e4m3 -------------------------------------------------------------------------------------
def quantize_fp8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row (last dim) e4m3 codes as uint8 and fp32 scales (``amax / 448``, 1 when all zero)."""
    xf = x.float()
    amax = xf.abs().amax(-1)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    codes = (xf / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return codes.view(torch.uint8), scale


def dequantize_fp8(codes: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """float64 values of uint8 e4m3 codes, times the per-row scale when given."""
    v = codes.view(torch.float8_e4m3fn).double()
    return v if scale is None else v * scale.double()[..., None]


# MXFP4 ----------------------------------------------------------------------------------------
def _e2m1_codes(mag: torch.Tensor) -> torch.Tensor:
    """Magnitude codes 0..7 of values already divided by their scale: nearest, ties to even."""
    grid = torch.tensor(E2M1_GRID, dtype=torch.float32, device=mag.device)
    mids = (grid[1:] + grid[:-1]) / 2
    code = torch.bucketize(mag.clamp(max=6.0), mids)  # ties go to the lower code
    tie = (code < 7) & (mag == mids[code.clamp(max=6)])
    return torch.where(tie & (code % 2 == 1), code + 1, code)


def quantize_mxfp4_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 codes (uint8 [..., D // 2]) and UE8M0 scale bytes (uint8 [..., D // 32])."""
    d = x.shape[-1]
    if d % MX_GROUP:
        raise ValueError(f"quantize_mxfp4_rows: last dimension must be a multiple of 32, got {d}")
    g = x.float().reshape(*x.shape[:-1], d // MX_GROUP, MX_GROUP)
    amax = g.abs().amax(-1)
    _, e = torch.frexp(amax)  # amax = m * 2**e, m in [0.5, 1): floor(log2 amax) = e - 1
    exp = torch.where(amax > 0, e - 1 - 2, torch.full_like(e, -100)).clamp(-100, 127)
    scaled = g / torch.exp2(exp.float())[..., None]
    code = _e2m1_codes(scaled.abs()) | ((scaled < 0).to(torch.int64) << 3)
    code = torch.where((code & 7) == 0, torch.zeros_like(code), code)  # no negative zero
    code = code.reshape(*x.shape[:-1], d).to(torch.uint8)
    packed = code[..., 0::2] | (code[..., 1::2] << 4)
    return packed, (exp + 127).to(torch.uint8)


def dequantize_mxfp4(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float64 values of packed MXFP4 codes and their UE8M0 scale bytes."""
    lo, hi = packed & 15, packed >> 4
    code = torch.stack([lo, hi], -1).reshape(*packed.shape[:-1], packed.shape[-1] * 2).long()
    grid = torch.tensor(E2M1_GRID, dtype=torch.float64, device=packed.device)
    v = grid[code & 7] * torch.where(code >= 8, -1.0, 1.0).double()
    v = v.reshape(*packed.shape[:-1], -1, MX_GROUP)
    v = v * torch.exp2(scales.double() - 127)[..., None]
    return v.reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def quantize_queries(q: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries [rows, H, D] -> e4m3 codes (uint8, same shape) and the head weights [rows, H] with
    each (token, head) scale folded in (fp32)."""
    codes, scale = quantize_fp8_rows(q)
    return codes, (weights.float() * scale).contiguous()


class PagedKeyCache:
    """Physical storage of the quantized indexer keys; block tables live with the engine."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        head_dim: int,
        key_format: str = "fp8",
        device: torch.device | str = "cpu",
    ) -> None:
        if key_format not in KEY_FORMATS:
            raise ValueError(f"PagedKeyCache: key_format must be one of {KEY_FORMATS}")
        if block_size not in BLOCK_SIZES:
            raise ValueError(f"PagedKeyCache: block_size must be one of {BLOCK_SIZES}")
        if head_dim % MX_GROUP:
            raise ValueError("PagedKeyCache: head_dim must be a multiple of 32")
        self.num_blocks, self.block_size, self.head_dim = num_blocks, block_size, head_dim
        self.key_format = key_format
        dev = torch.device(device)
        if key_format == "fp8":
            self.codes = torch.zeros(
                num_blocks, block_size, head_dim, dtype=torch.uint8, device=dev
            )
            self.scales = torch.ones(num_blocks, block_size, dtype=torch.float32, device=dev)
        else:
            self.codes = torch.zeros(
                num_blocks, block_size, head_dim // 2, dtype=torch.uint8, device=dev
            )
            self.scales = torch.full(
                (num_blocks, block_size, head_dim // MX_GROUP), 27, dtype=torch.uint8, device=dev
            )

    @property
    def device(self) -> torch.device:
        return self.codes.device

    def quantize(self, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.key_format == "fp8":
            return quantize_fp8_rows(keys)
        return quantize_mxfp4_rows(keys)

    def write(
        self,
        block_table: torch.Tensor,
        rows: torch.Tensor,
        positions: torch.Tensor,
        keys: torch.Tensor,
    ) -> None:
        """Append (or overwrite) keys: ``keys[i]`` goes to position ``positions[i]`` of batch row
        ``rows[i]`` through ``block_table``. Pure tensor indexing: no host sync, graph-safe."""
        if keys.dim() != 2 or keys.shape[1] != self.head_dim:
            raise ValueError(f"PagedKeyCache.write: keys must be [n, {self.head_dim}]")
        if rows.shape != positions.shape or rows.shape[0] != keys.shape[0]:
            raise ValueError("PagedKeyCache.write: rows, positions and keys must agree in length")
        codes, scales = self.quantize(keys)
        pos = positions.long()
        block = block_table[rows.long(), pos // self.block_size].long()
        off = pos % self.block_size
        self.codes[block, off] = codes
        self.scales[block, off] = scales

    def dequantize_row(self, block_table_row: torch.Tensor, n: int) -> torch.Tensor:
        """float64 keys [n, D] of one row (the reference's view of the cache)."""
        return dequantize_pages(self.codes, self.scales, self.key_format, block_table_row, n)


def dequantize_pages(
    codes: torch.Tensor,
    scales: torch.Tensor,
    key_format: str,
    block_table_row: torch.Tensor,
    n: int,
) -> torch.Tensor:
    """float64 keys [n, D] of the first ``n`` positions of one row of a paged cache."""
    block_size = codes.shape[1]
    pos = torch.arange(n, device=codes.device)
    block = block_table_row[pos // block_size].long()
    off = pos % block_size
    if key_format == "fp8":
        return dequantize_fp8(codes[block, off], scales[block, off])
    return dequantize_mxfp4(codes[block, off], scales[block, off])
