"""Indexer configurations: the real DeepSeek models' indexer shapes and tiny ones for tests.

The indexer scores every (compressed) key of a row with ``I[t, j] = sum_h w[t, h] * ReLU(q[t, h] .
k[j])`` and keeps the top ``topk`` keys. ``compress_ratio`` maps a row's token length to its key
count: ``N = seq_len // compress_ratio`` (V4's CSA layers compress 4x; V3.2-style is 1).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

KEY_FORMATS = ("fp8", "fp4")
BLOCK_SIZES = (32, 64, 128)


@dataclass(frozen=True)
class IndexerConfig:
    name: str
    topk: int
    compress_ratio: int
    n_layers: int
    n_indexer_layers: int
    n_heads: int = 64
    head_dim: int = 128
    block_size: int = 64
    key_format: str = "fp8"
    max_next_n: int = 4

    def __post_init__(self) -> None:
        if self.key_format not in KEY_FORMATS:
            raise ValueError(f"IndexerConfig: key_format must be one of {KEY_FORMATS}")
        if self.block_size not in BLOCK_SIZES:
            raise ValueError(f"IndexerConfig: block_size must be one of {BLOCK_SIZES}")
        if self.head_dim % 32 or self.head_dim < 32:
            raise ValueError("IndexerConfig: head_dim must be a multiple of 32 (MXFP4 groups)")
        if self.n_heads < 1 or self.n_heads & (self.n_heads - 1):
            raise ValueError("IndexerConfig: n_heads must be a power of two")
        if self.compress_ratio < 1 or self.topk < 1:
            raise ValueError("IndexerConfig: compress_ratio and topk must be >= 1")

    def n_keys(self, seq_len: int) -> int:
        """Compressed keys of a row of ``seq_len`` tokens."""
        return seq_len // self.compress_ratio

    def key_bytes(self) -> int:
        """Bytes one cached key occupies (codes + scales)."""
        if self.key_format == "fp8":
            return self.head_dim + 4
        return self.head_dim // 2 + self.head_dim // 32

    def with_(self, **kw) -> IndexerConfig:
        return replace(self, **kw)


V4_FLASH = IndexerConfig("v4-flash", topk=512, compress_ratio=4, n_layers=43, n_indexer_layers=21)
V4_PRO = IndexerConfig("v4-pro", topk=1024, compress_ratio=4, n_layers=61, n_indexer_layers=30)
V32 = IndexerConfig("v3.2", topk=2048, compress_ratio=1, n_layers=61, n_indexer_layers=61)
PRESETS = {c.name: c for c in (V4_FLASH, V4_PRO, V32)}


def tiny(key_format: str = "fp8", block_size: int = 32, topk: int = 16) -> IndexerConfig:
    """A configuration small enough for the CPU interpreter (same code paths as the real ones)."""
    return IndexerConfig(
        f"tiny-{key_format}",
        topk=topk,
        compress_ratio=4,
        n_layers=2,
        n_indexer_layers=1,
        n_heads=16,
        head_dim=32,
        block_size=block_size,
        key_format=key_format,
    )


def preset(name: str) -> IndexerConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown indexer preset {name!r}; known: {sorted(PRESETS)}")
    return PRESETS[name]
