"""Host side of the GQA tile kernels' geometry: tile classes, split sizes, the workspace layout.

A row's (query, head) pairs are ``q_len * G`` tile rows. Rows with at most ``NARROW_ROWS`` of them
(decode steps, small trees) run in 16-row tiles; larger rows (tree verification) run in the wide
tiles, large enough for Hopper's warpgroup MMA. The class and the split size (``split_chunk``) are
functions of the row's own query count and live extent, so a row's geometry (and its bits) never
depend on the rest of the batch.

Workspace (fp32): per row ``slots`` partial slots of ``(output[d], max, sum)`` per query head;
rows of one split skip it.

Query-invariant mode (``invariant_kernels``): splits of ``SPLIT_KEYS`` logical keys at fixed
positions (a constant: no length enters it), 64-row tiles of 64 / G nodes of G rows each (at
least 4 rows per node: ``invariant_kernels.tile_layout``, fixed by G alone); its workspace holds
``ceil(capacity / SPLIT_KEYS)`` partial slots per query.
"""

from __future__ import annotations

import functools

NARROW_ROWS = 32
# ONE_LOOP: the narrow tiles take every key block through the masked loop (one software
# pipeline instead of two): 0.96x the time in geomean over the 12 decode cells at 16/2 heads
# and 0.99x at 32/8 on an H100 (docs/kernels/attention.md, 2026-12-05).
NARROW = {"BLOCK_M": 16, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2, "ONE_LOOP": True,
          "MERGE_CHUNK": 4, "MERGE_COLS": 32}  # fmt: skip
# 64-row wide tiles with 4 warps beat 128 rows with 8 warps on the H200 (90 vs 118 us, 24-node
# trees at L=8k); 3 stages beat 2 on an H100 with the separate combine (trees 1.14x, replay-shaped
# steps 1.07-1.13x; docs/kernels/attention.md, 2026-12-06)
# TMA: committed (unmasked) K/V blocks load through tensor descriptors where the pool allows it
# (``gqa_kernels.kv_descriptors``): no per-element addresses; replay-shaped steps 1.09-1.15x and
# trees 1.01-1.15x on an H100 (docs/kernels/attention.md, 2026-12-06).
WIDE = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "TMA": True,
        "MERGE_CHUNK": 1, "MERGE_COLS": 32}  # fmt: skip
PREFILL = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2}
# Split rule: at least MIN_CHUNK keys, at most TARGET splits, at least KEYS_PER_ROW keys per tile
# row (bounds the partial traffic: KEYS_PER_ROW / 4 times the K/V bytes of the split at d=128).
# With few KV heads (FEW_KV_HEADS or less) long rows take fewer, longer splits and the narrow
# tiles a deeper key loop: the H200 decode sweep (docs/kernels/attention.md) measured 0.94x the
# time of the other geometry in geomean over B x L at 16/2 heads, and 1.00x at 32/8 where it
# lost at L=2k. A function of the model's head counts, never of the batch.
# The query term (KEYS_PER_ROW keys a tile row) is capped by a function of the row's extent:
# min(QUERY_CHUNK_CAP, max(QUERY_CHUNK_FLOOR, extent / QUERY_SPLITS)). So a row of many queries
# (a frame's prefill beside tree rows in one step: compute-bound) still splits its context into
# a few programs instead of walking it in one, and into about QUERY_SPLITS of them while the
# context is short. On an H100 (docs/kernels/attention.md, 2026-12-06): the cap at 2048 took
# replay-shaped steps 1.1-1.9x; the floor at 1024 with 4 splits and, for wide rows,
# WIDE_KEYS_PER_ROW = 8 keys a tile row (was 4, with the term at the cap) another 1.24x / 1.05x /
# 0.98x at ~1.2k / 4.9k / 9.9k keys and the trees 1.0-1.09x. Narrow rows keep KEYS_PER_ROW (at
# most 32 tile rows: 128 keys, below the floor).
SPLITS = {"MIN_CHUNK": 128, "TARGET": 64, "KEYS_PER_ROW": 4, "WIDE_KEYS_PER_ROW": 8,
          "QUERY_CHUNK_CAP": 2048, "QUERY_CHUNK_FLOOR": 1024, "QUERY_SPLITS": 4}  # fmt: skip
FEW_KV_HEADS = 2
FEW_KV_SPLITS = {"TARGET": 32, "narrow": {"num_stages": 3}}
# The split combine starts as a programmatic dependent of the tile launch (sm90+; the bits do not
# depend on it).
# MERGE: the last split program of a tile to arrive merges its partials instead of the combine
# launch (``gqa_kernels.gqa_tile_kernel``). Off until it is timed against the combine on a GPU
# (``tools/attention_merge_ab.py``; docs/kernels/attention.md, "The split merge in the tile
# launch").
LAUNCH = {"PDL": True, "MERGE": False}
MAX_DOUBLINGS = 20
# Query-invariant mode: one geometry for every query (constants of the contract: the bits depend
# on all of them).
# (TMA: committed blocks through tensor descriptors where the pool allows; CAUSAL_TILE_STEPS:
# causal blocks reaching the new nodes stepped once for the tile, not once per node: a causal
# chain of 450 tokens 1.39-1.72x faster on an H100, docs/kernels/attention.md. Neither changes
# the bits.)
INVARIANT = {"SPLIT_KEYS": 512, "BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2,
             "TMA": True, "CAUSAL_TILE_STEPS": True}  # fmt: skip


def geometry(config: dict | None = None, kv_heads: int | None = None) -> dict:
    """The default geometry for ``kv_heads`` KV heads (``FEW_KV_SPLITS`` at ``FEW_KV_HEADS`` or
    fewer) with ``config`` overrides (benchmark sweeps only: the defaults are the contract's fixed
    geometry). Keys: ``narrow`` / ``wide`` / ``prefill`` (tile dicts, merged) and the ``SPLITS``
    and ``LAUNCH`` keys."""
    cfg = {"narrow": dict(NARROW), "wide": dict(WIDE), "prefill": dict(PREFILL), **SPLITS, **LAUNCH}
    few = kv_heads is not None and kv_heads <= FEW_KV_HEADS
    for key, val in [*(FEW_KV_SPLITS.items() if few else ()), *(config or {}).items()]:
        if isinstance(val, dict):
            cfg[key] = {**cfg[key], **val}
        else:
            cfg[key] = val
    return cfg


def split_chunk(total: int, q_len: int, group: int, cfg: dict) -> int:
    """Host mirror of the in-kernel split size (keys per split) of a row."""
    cap = min(cfg["QUERY_CHUNK_CAP"],
              max(cfg["QUERY_CHUNK_FLOOR"], -(-total // cfg["QUERY_SPLITS"])))  # fmt: skip
    wide = q_len * group > NARROW_ROWS
    per_query = min(cfg["WIDE_KEYS_PER_ROW" if wide else "KEYS_PER_ROW"] * q_len * group, cap)
    need = max(per_query, -(-total // cfg["TARGET"]))
    chunk = cfg["MIN_CHUNK"]
    for _ in range(MAX_DOUBLINGS):
        if chunk < need:
            chunk *= 2
    return chunk


def most_splits(capacity: int, q_len: int, group: int, cfg: dict) -> int:
    """The most splits a row of ``q_len`` queries has over any extent up to ``capacity``. The
    split size is a power-of-two multiple of ``MIN_CHUNK`` that never shrinks as the extent
    grows, so the count peaks at the last extent of each split size: where the extent reaches
    that size times ``TARGET`` or times ``QUERY_SPLITS``, or the capacity."""
    ends = {capacity}
    chunk = cfg["MIN_CHUNK"]
    while chunk < capacity:
        ends.update((chunk * cfg["TARGET"], chunk * cfg["QUERY_SPLITS"]))
        chunk *= 2
    return max(-(-t // split_chunk(t, q_len, group, cfg)) for t in ends if t <= capacity)


# The split rule's keys (``split_chunk``); the kernels take them as constexprs of these names.
RULE_KEYS = ("MIN_CHUNK", "TARGET", "KEYS_PER_ROW", "WIDE_KEYS_PER_ROW", "QUERY_CHUNK_CAP",
             "QUERY_CHUNK_FLOOR", "QUERY_SPLITS")  # fmt: skip


@functools.cache
def _plan(capacity: int, q_max: int, group: int, rule: tuple) -> tuple[int, int, int, int]:
    cfg = dict(zip(RULE_KEYS, rule, strict=True))
    splits = {False: 1, True: 1}
    slots = 1
    split_queries = 0
    for q in range(1, q_max + 1):
        s = most_splits(capacity, q, group, cfg)
        wide = q * group > NARROW_ROWS
        splits[wide] = max(splits[wide], s)
        slots = max(slots, q * s)
        if s > 1:
            split_queries = q
    return splits[False], splits[True], slots, split_queries


def split_plan(capacity: int, q_max: int, group: int, cfg: dict) -> tuple[int, int, int, int]:
    """(most splits of a narrow row, of a wide row, partial slots per row, the largest query
    count of a row that can have more than one split). A row's split size grows with its query
    count and its key count is at most ``capacity``, so rows of more queries than the last are
    never split: the combine pass only merges query slots below it."""
    return _plan(capacity, q_max, group, tuple(cfg[key] for key in RULE_KEYS))


def workspace_numel(batch: int, q_max: int, q_heads: int, kv_heads: int, head_dim: int,
                    capacity: int, config: dict | None = None, *,
                    query_invariant: bool = False) -> int:  # fmt: skip
    """fp32 elements of the split workspace ``gqa_attention`` needs for these sizes (and mode)."""
    if query_invariant:
        return invariant_workspace_numel(batch, q_max, q_heads, head_dim, capacity, config)
    _, _, slots, _ = split_plan(capacity, q_max, q_heads // kv_heads, geometry(config, kv_heads))
    return batch * slots * q_heads * (head_dim + 2)


def invariant_geometry(config: dict | None = None) -> dict:
    """The query-invariant geometry with ``config`` overrides (benchmark sweeps only)."""
    cfg = dict(INVARIANT)
    unknown = set(config or {}) - set(cfg)
    if unknown:
        raise ValueError(f"invariant geometry: unknown keys {sorted(unknown)}")
    cfg.update(config or {})
    if cfg["SPLIT_KEYS"] % cfg["BLOCK_N"]:
        raise ValueError("invariant geometry: SPLIT_KEYS must be a multiple of BLOCK_N")
    return cfg


def invariant_workspace_numel(batch: int, q_max: int, q_heads: int, head_dim: int,
                              capacity: int, config: dict | None = None) -> int:  # fmt: skip
    """fp32 elements of the query-invariant mode's split workspace."""
    splits = -(-capacity // invariant_geometry(config)["SPLIT_KEYS"])
    return batch * q_max * splits * q_heads * (head_dim + 2)


def vector_align(itemsize: int, *strides: int) -> int:
    """Largest power-of-two element count (at most 16 bytes) dividing every stride: lets the
    kernels issue 16-byte loads for head dims like 72 whose strides the JIT cannot prove aligned."""
    align = max(1, 16 // itemsize)
    while align > 1 and any(s % align for s in strides):
        align //= 2
    return align
