"""Attention ops: GQA split-KV decode and tree verification over a KV pool, packed varlen prefill,
segmented (vision) attention."""

from flashrt_kernels.attention.decode import gqa_attention, workspace_numel
from flashrt_kernels.attention.kv_pool import KVPool
from flashrt_kernels.attention.prefill import packed_prefill_attention
from flashrt_kernels.attention.reference import pack_tree_mask
from flashrt_kernels.attention.rope_append import rope_append
from flashrt_kernels.attention.rope_qk import rope_qk
from flashrt_kernels.attention.segmented import segmented_attention

__all__ = [
    "KVPool",
    "gqa_attention",
    "pack_tree_mask",
    "packed_prefill_attention",
    "rope_append",
    "rope_qk",
    "segmented_attention",
    "workspace_numel",
]
