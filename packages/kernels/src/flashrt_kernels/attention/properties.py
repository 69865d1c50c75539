"""Properties of the attention family, run by the tests (both scales) and ``flashrt check``.

Cases draw shapes, lengths, tree shapes (as a seed and a depth), flags, dtypes and a seed; tensors
are built from the seed. Every K/V slot at or past a row's live extent (and every slot of rows the
batch does not use) holds NaN, and outputs are poisoned before the run.
"""

from __future__ import annotations

import functools

import torch
from hypothesis import strategies as st

from flashrt_kernels.attention import reference
from flashrt_kernels.attention.decode import ATOL_V, RTOL, gqa_attention
from flashrt_kernels.attention.prefill import packed_prefill_attention
from flashrt_kernels.attention.segmented import segmented_attention
from flashrt_kernels.registry import Property, register_property
from flashrt_kernels.testing import (
    assert_exact,
    assert_faithful,
    make_values,
    poisoned_empty,
    seeds,
    sizes,
    test_device,
)

HEAD_DIMS = (64, 72, 80, 128)
GROUPS = (1, 2, 4, 8)
DTYPES = (torch.bfloat16, torch.float16)
Q_KINDS = ("normal", "uniform", "ties", "zeros", "outlier")
V_KINDS = ("normal", "ties", "outlier", "zeros")
LEN_EDGES = (0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 129, 255, 256, 257, 1023, 1024, 1025)

SMALL = {"batch": 3, "q_max": 16, "cap": 300, "kv_heads": (1, 2), "new": 40, "seg": 100}
REAL = {"batch": 8, "q_max": 64, "cap": 6000, "kv_heads": (1, 2, 8), "new": 600, "seg": 1400}


def _limits(scale: str) -> dict:
    return SMALL if scale == "small" else REAL


def _length(draw, high: int) -> int:
    edges = [e for e in LEN_EDGES if e <= high]
    return draw(st.one_of(st.sampled_from(edges + [high]), st.integers(0, high)))


def _bound(v: torch.Tensor, dtype: torch.dtype) -> dict:
    vmax = float(v.float().nan_to_num(0.0).abs().max()) if v.numel() else 0.0
    return {"rtol": RTOL[dtype], "atol": ATOL_V[dtype] * vmax + torch.finfo(dtype).tiny}


def random_tree_mask(n: int, max_depth: int, seed: int) -> torch.Tensor:
    """Ancestor-or-self mask of a random forest of ``n`` nodes (parents precede children)."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(n, n, dtype=torch.bool)
    depth = [0] * n
    for i in range(n):
        eligible = [j for j in range(i) if depth[j] < max_depth]
        if eligible and torch.rand((), generator=g) > 0.15:
            p = eligible[int(torch.randint(len(eligible), (), generator=g))]
            mask[i] = mask[p]
            depth[i] = depth[p] + 1
        else:
            depth[i] = 1
        mask[i, i] = True
    return mask


# ---------------------------------------------------------------------------------------------
# decode / tree verification
@st.composite
def _decode_cases(draw, scale: str):
    lim = _limits(scale)
    bsz = draw(st.integers(1, lim["batch"]))
    mode = draw(st.sampled_from(("causal", "tree", "tree_bits", "chain_bits")))
    q_max = draw(sizes(1, lim["q_max"], (1, 2, 7, 8, 15, 16, 17, 24, 31, 32, 63, 64)))
    cap = draw(sizes(max(q_max, 2), lim["cap"], (129, 256, 257, 1024, 2049, 4096, 6000)))
    q_lens = [draw(st.one_of(st.sampled_from((0, 1, q_max)), st.integers(0, q_max)))
              for _ in range(bsz)]  # fmt: skip
    cache_lens = [_length(draw, cap - n) for n in q_lens]
    # chain_bits: each row's causal chain before its tree (the whole row, none of it, or any cut)
    chains = [draw(st.one_of(st.sampled_from((0, n)), st.integers(0, n))) for n in q_lens]
    return {
        "chains": chains,
        "batch": bsz,
        "q_max": q_max,
        "cap": cap,
        "q_lens": q_lens,
        "cache_lens": cache_lens,
        "group": draw(st.sampled_from(GROUPS)),
        "kv_heads": draw(st.sampled_from(lim["kv_heads"])),
        "head_dim": draw(st.sampled_from(HEAD_DIMS)),
        "dtype": draw(st.sampled_from(DTYPES)),
        "mask": mode,
        "depth": draw(st.integers(1, 8)),
        "q_kind": draw(st.sampled_from(Q_KINDS)),
        "v_kind": draw(st.sampled_from(V_KINDS)),
        "seed": draw(seeds()),
    }


def _decode_examples(scale: str):
    base = {"group": 8, "kv_heads": 2, "head_dim": 128, "dtype": torch.bfloat16, "depth": 8,
            "q_kind": "normal", "v_kind": "normal", "seed": 1}  # fmt: skip
    if scale == "small":
        return [
            {**base, "batch": 3, "q_max": 1, "cap": 257, "q_lens": [1, 0, 1],
             "cache_lens": [256, 5, 0], "mask": "causal"},
            {**base, "batch": 2, "q_max": 16, "cap": 300, "q_lens": [16, 9],
             "cache_lens": [129, 0], "mask": "tree", "group": 4, "head_dim": 72},
            {**base, "batch": 1, "q_max": 8, "cap": 130, "q_lens": [8], "cache_lens": [122],
             "mask": "tree_bits", "group": 1, "head_dim": 80, "dtype": torch.float16},
            # rows of more than 64 queries are never split here: the combine grid stops at 64
            # query slots and its programs zero the dead slots past it
            {**base, "batch": 3, "q_max": 80, "cap": 1024, "q_lens": [70, 3, 0],
             "cache_lens": [900, 1000, 11], "mask": "causal", "group": 2, "kv_heads": 1,
             "head_dim": 64},
            # trees after causal chains: a 64-node tree after 8 chain tokens (72 queries), a
            # whole-chain row, a tree without a chain
            {**base, "batch": 3, "q_max": 72, "cap": 200, "q_lens": [72, 30, 9],
             "chains": [8, 30, 0], "cache_lens": [100, 7, 0], "mask": "chain_bits", "group": 2,
             "kv_heads": 1, "head_dim": 64},
        ]  # fmt: skip
    return [
        {**base, "batch": 4, "q_max": 1, "cap": 6000, "q_lens": [1, 1, 0, 1],
         "cache_lens": [5999, 2048, 3000, 0], "mask": "causal"},
        {**base, "batch": 8, "q_max": 64, "cap": 4200, "q_lens": [64, 24, 0, 1, 64, 63, 2, 17],
         "cache_lens": [4096, 2048, 7, 0, 1, 128, 4000, 300], "mask": "tree"},
        {**base, "batch": 2, "q_max": 24, "cap": 2100, "q_lens": [24, 24],
         "cache_lens": [2048, 2076], "mask": "tree_bits", "group": 4, "kv_heads": 8},
        # a padded prefill step (ActiveVLN's 256-query bucket): only rows of <= 32 queries split
        {**base, "batch": 8, "q_max": 256, "cap": 2048, "q_lens": [130, 120, 0, 1, 256, 3, 88, 32],
         "cache_lens": [1500, 0, 5, 2047, 1792, 2000, 900, 1400], "mask": "causal"},
        # a replay step: frame rows of 150 queries over long contexts split at QUERY_CHUNK_CAP
        # beside tree rows
        {**base, "batch": 4, "q_max": 160, "cap": 6000, "q_lens": [150, 14, 160, 0],
         "cache_lens": [5000, 5900, 2100, 10], "mask": "tree"},
        # the same with bit rows after each row's chain: a frame row's 150 tokens and its
        # 33-node tree, a tree row, a frame row without a tree, a 64-node tree after 36 tokens
        {**base, "batch": 5, "q_max": 183, "cap": 6000, "q_lens": [183, 14, 160, 0, 100],
         "chains": [150, 0, 160, 0, 36], "cache_lens": [5000, 5900, 2100, 10, 1200],
         "mask": "chain_bits"},
    ]  # fmt: skip


def _invariant_examples(scale: str):
    """The decode examples the query-invariant mode takes: its tree verification holds at most
    64 nodes (a replay step's frame rows go through causal steps there) and takes no chains."""
    return [e for e in _decode_examples(scale)
            if e["mask"] == "causal" or (e["q_max"] <= 64 and e["mask"] != "chain_bits")]  # fmt: skip


def _chain_bits(case, g) -> torch.Tensor:
    """Bit rows of a random tree after each row's chain, noise wherever the rows must not matter
    (the chain queries' rows, bits past the tree, padded query slots)."""
    bsz, q_max = case["batch"], case["q_max"]
    bits = torch.randint(-(2**62), 2**62, (bsz, q_max), generator=g, dtype=torch.int64)
    for b, (n, c) in enumerate(zip(case["q_lens"], case["chains"], strict=True)):
        if n > c:
            tree = random_tree_mask(n - c, case["depth"], case["seed"] + 4 + b)
            beyond = bits[b, c:n] & ~((1 << (n - c)) - 1) if n - c < 64 else 0
            bits[b, c:n] = reference.pack_tree_mask(tree) | beyond
    return bits


def _decode_inputs(case, device):
    bsz, q_max, cap = case["batch"], case["q_max"], case["cap"]
    hkv, d, dt, s = case["kv_heads"], case["head_dim"], case["dtype"], case["seed"]
    hq = hkv * case["group"]
    q = make_values(case["q_kind"], (bsz, q_max, hq, d), dt, s, device)
    rows = bsz + 1  # one pool row the batch never uses
    k = make_values("normal", (rows, cap, hkv, d), dt, s + 1, device)
    v = make_values(case["v_kind"], (rows, cap, hkv, d), dt, s + 2, device)
    cache_lens = torch.tensor(case["cache_lens"], dtype=torch.int32)
    q_lens = torch.tensor(case["q_lens"], dtype=torch.int32)
    extent = torch.cat([cache_lens + q_lens, torch.zeros(1, dtype=torch.int32)]).to(device)
    stale = torch.arange(cap, device=device)[None, :] >= extent[:, None]
    k[stale] = float("nan")
    v[stale] = float("nan")
    mask = chain = None
    if case["mask"] == "chain_bits":
        mask = _chain_bits(case, torch.Generator().manual_seed(s + 3)).to(device)
        chain = torch.tensor(case["chains"], dtype=torch.int32, device=device)
    elif case["mask"] != "causal":
        g = torch.Generator().manual_seed(s + 3)
        noise = torch.rand(bsz, q_max, q_max, generator=g) < 0.5  # where nothing may look
        mask = noise.clone()
        for b, n in enumerate(case["q_lens"]):
            if n:
                mask[b, :n, :n] = random_tree_mask(n, case["depth"], s + 4 + b)
        mask = mask.to(device)
        if case["mask"] == "tree_bits":
            mask = reference.pack_tree_mask(mask)
    return q, k, v, cache_lens.to(device), q_lens.to(device), mask, chain


def _for_mode(case, invariant: bool) -> dict:
    """The query-invariant mode takes no chains: its cases run the same trees without them."""
    if invariant and case["mask"] == "chain_bits":
        return {**case, "mask": "tree_bits"}
    return case


def _check_decode_matches_reference(case, invariant: bool = False) -> None:
    device = test_device()
    case = _for_mode(case, invariant)
    q, k, v, cl, ql, mask, chain = _decode_inputs(case, device)
    rows = torch.arange(case["batch"], dtype=torch.int32, device=device)
    want = reference.gqa_attention(q, k, v, cl, ql, cache_rows=rows, tree_mask=mask,
                                   chain_lens=chain)  # fmt: skip
    out = poisoned_empty(q.shape, q.dtype, device)
    got = gqa_attention(q, k, v, cl, ql, cache_rows=rows, tree_mask=mask, out=out,
                        backend="triton", query_invariant=invariant, chain_lens=chain)  # fmt: skip
    assert got.data_ptr() == out.data_ptr()
    live_v = v[:-1].nan_to_num(0.0)
    assert_faithful(got, want, **_bound(live_v, q.dtype), what="gqa_attention vs reference")


def _check_decode_batch_invariant(case, invariant: bool = False) -> None:
    """A row's bits do not depend on the other rows, their order, the pool row or q_max."""
    device = test_device()
    case = _for_mode(case, invariant)
    q, k, v, cl, ql, mask, chain = _decode_inputs(case, device)
    bsz, q_max = case["batch"], case["q_max"]
    full = gqa_attention(q, k, v, cl, ql, tree_mask=mask, backend="triton",
                         query_invariant=invariant, chain_lens=chain)  # fmt: skip
    pick = list(range(bsz))[::-1][: max(1, bsz - 1)]
    idx = torch.tensor(pick, device=device)
    # bit-row masks without chains (and the invariant mode's trees) hold at most 64 nodes
    bits64 = mask is not None and chain is None and (invariant or mask.dtype == torch.int64)
    pad = min(q_max + 5, 64) if bits64 else q_max + 5
    q2 = make_values("normal", (len(pick), pad, *q.shape[2:]), q.dtype, case["seed"] + 9, device)
    q2[:, :q_max] = q[idx]
    mask2 = None
    if mask is not None and mask.dtype == torch.bool:
        mask2 = torch.ones(len(pick), pad, pad, dtype=torch.bool, device=device)
        mask2[:, :q_max, :q_max] = mask[idx]
    elif mask is not None:
        mask2 = torch.full((len(pick), pad), -1, dtype=torch.int64, device=device)
        mask2[:, :q_max] = mask[idx]
    # The rows live in other pool rows: move them to the end of a bigger pool.
    k2 = torch.cat([k[-1:].expand(2, *k.shape[1:]), k[idx]])
    v2 = torch.cat([v[-1:].expand(2, *v.shape[1:]), v[idx]])
    rows2 = torch.arange(2, 2 + len(pick), dtype=torch.int32, device=device)
    part = gqa_attention(q2, k2, v2, cl[idx], ql[idx], cache_rows=rows2, tree_mask=mask2,
                         backend="triton", query_invariant=invariant,
                         chain_lens=None if chain is None else chain[idx])  # fmt: skip
    assert_exact(part[:, :q_max], full[idx], what="rows run inside another batch")
    assert_exact(part[:, q_max:], torch.zeros_like(part[:, q_max:]), what="padded query slots")


register_property(Property("gqa_attention", "matches_reference", _decode_cases,
                           _check_decode_matches_reference, _decode_examples))  # fmt: skip
register_property(Property("gqa_attention", "batch_invariant", _decode_cases,
                           _check_decode_batch_invariant, _decode_examples))  # fmt: skip
register_property(Property("gqa_attention", "query_invariant_matches_reference", _decode_cases,
                           functools.partial(_check_decode_matches_reference, invariant=True),
                           _invariant_examples))  # fmt: skip
register_property(Property("gqa_attention", "query_invariant_batch_invariant", _decode_cases,
                           functools.partial(_check_decode_batch_invariant, invariant=True),
                           _invariant_examples))  # fmt: skip


# ---------------------------------------------------------------------------------------------
# packed prefill
@st.composite
def _prefill_cases(draw, scale: str):
    lim = _limits(scale)
    bsz = draw(st.integers(1, lim["batch"]))
    new = [_length(draw, lim["new"]) for _ in range(bsz)]
    cap = max(new) + draw(sizes(1, lim["cap"] // 2, (1, 64, 128, 129, 1024)))
    return {
        "new": new,
        "cache_lens": [_length(draw, cap - n) for n in new],
        "cap": cap,
        "group": draw(st.sampled_from(GROUPS)),
        "kv_heads": draw(st.sampled_from(lim["kv_heads"][:2])),
        "head_dim": draw(st.sampled_from(HEAD_DIMS)),
        "dtype": draw(st.sampled_from(DTYPES)),
        "q_kind": draw(st.sampled_from(Q_KINDS)),
        "seed": draw(seeds()),
    }


def _prefill_examples(scale: str):
    base = {"group": 8, "kv_heads": 2, "head_dim": 128, "dtype": torch.bfloat16,
            "q_kind": "normal", "seed": 2}  # fmt: skip
    if scale == "small":
        return [{**base, "new": [8, 0, 33], "cache_lens": [0, 9, 64], "cap": 100}]
    return [{**base, "new": [352, 40, 1, 600], "cache_lens": [0, 3000, 4095, 17], "cap": 4096}]


def _prefill_inputs(case, device):
    new, cap, hkv, d = case["new"], case["cap"], case["kv_heads"], case["head_dim"]
    dt, s = case["dtype"], case["seed"]
    hq = hkv * case["group"]
    bsz = len(new)
    cu = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], dtype=torch.int32)
    q = make_values(case["q_kind"], (int(cu[-1]), hq, d), dt, s, device)
    k = make_values("normal", (bsz + 1, cap, hkv, d), dt, s + 1, device)
    v = make_values("normal", (bsz + 1, cap, hkv, d), dt, s + 2, device)
    cl = torch.tensor(case["cache_lens"], dtype=torch.int32)
    extent = torch.cat(
        [cl + torch.tensor(new, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)]
    )
    stale = torch.arange(cap)[None, :] >= extent[:, None]
    k[stale.to(device)] = float("nan")
    v[stale.to(device)] = float("nan")
    return q, k, v, cu.to(device), cl.to(device)


def _check_prefill(case) -> None:
    device = test_device()
    q, k, v, cu, cl = _prefill_inputs(case, device)
    max_new = max(case["new"])
    want = reference.packed_prefill_attention(q, k, v, cu, cl)
    out = poisoned_empty(q.shape, q.dtype, device)
    got = packed_prefill_attention(q, k, v, cu, cl, max_new, out=out, backend="triton")
    assert_faithful(got, want, **_bound(v[:-1].nan_to_num(0.0), q.dtype),
                    what="packed_prefill_attention vs reference")  # fmt: skip
    for b in range(len(case["new"])):  # each row alone, in another pool row
        a, e = int(cu[b]), int(cu[b + 1])
        one = torch.tensor([0, e - a], dtype=torch.int32, device=device)
        row = torch.tensor([b], dtype=torch.int32, device=device)
        alone = packed_prefill_attention(q[a:e], k, v, one, cl[b : b + 1], e - a, cache_rows=row,
                                         backend="triton")  # fmt: skip
        assert_exact(alone, got[a:e], what=f"row {b} run alone")


register_property(Property("packed_prefill_attention", "matches_reference_and_rows_alone",
                           _prefill_cases, _check_prefill, _prefill_examples))  # fmt: skip


# ---------------------------------------------------------------------------------------------
# segmented (vision)
@st.composite
def _segmented_cases(draw, scale: str):
    lim = _limits(scale)
    n_seg = draw(st.integers(1, 4 if scale == "small" else 24))
    return {
        "segments": [_length(draw, lim["seg"]) for _ in range(n_seg)],
        "heads": draw(st.sampled_from((1, 2, 4) if scale == "small" else (16,))),
        "group": draw(st.sampled_from((1, 2))),
        "head_dim": draw(st.sampled_from(HEAD_DIMS)),
        "dtype": draw(st.sampled_from(DTYPES)),
        "q_kind": draw(st.sampled_from(Q_KINDS)),
        "v_kind": draw(st.sampled_from(V_KINDS)),
        "seed": draw(seeds()),
    }


def _segmented_examples(scale: str):
    base = {"group": 1, "dtype": torch.bfloat16, "q_kind": "normal", "v_kind": "normal", "seed": 3}
    if scale == "small":
        return [{**base, "segments": [64, 0, 65, 1], "heads": 2, "head_dim": 80},
                {**base, "segments": [17, 63], "heads": 1, "head_dim": 72}]  # fmt: skip
    return [{**base, "segments": [64] * 44, "heads": 16, "head_dim": 80},
            {**base, "segments": [720] * 4, "heads": 16, "head_dim": 72},
            {**base, "segments": [1, 1400, 129], "heads": 16, "head_dim": 128}]  # fmt: skip


def _check_segmented(case) -> None:
    device = test_device()
    segs, dt, s, d = case["segments"], case["dtype"], case["seed"], case["head_dim"]
    hq = case["heads"] * case["group"]
    t = sum(segs)
    cu = torch.tensor([0, *torch.tensor(segs).cumsum(0).tolist()], dtype=torch.int32, device=device)
    q = make_values(case["q_kind"], (t, hq, d), dt, s, device)
    k = make_values("normal", (t, case["heads"], d), dt, s + 1, device)
    v = make_values(case["v_kind"], (t, case["heads"], d), dt, s + 2, device)
    want = reference.segmented_attention(q, k, v, cu)
    out = poisoned_empty(q.shape, dt, device)
    got = segmented_attention(q, k, v, cu, max(segs), out=out, backend="triton")
    assert_faithful(got, want, **_bound(v, dt), what="segmented_attention vs reference")
    b = max(range(len(segs)), key=lambda i: segs[i])  # the longest segment alone
    a, e = int(cu[b]), int(cu[b + 1])
    one = torch.tensor([0, e - a], dtype=torch.int32, device=device)
    alone = segmented_attention(q[a:e], k[a:e], v[a:e], one, e - a, backend="triton")
    assert_exact(alone, got[a:e], what="segment run alone")


register_property(Property("segmented_attention", "matches_reference_and_independent",
                           _segmented_cases, _check_segmented, _segmented_examples))  # fmt: skip


# the query-invariant mode's chain-vs-tree property and rope_append's live beside (registered
# on import)
from flashrt_kernels.attention import properties_invariant, properties_rope  # noqa: E402, F401
