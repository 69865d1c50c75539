"""Properties of ``gqa_attention(..., query_invariant=True)``: a greedy chain equals a tree branch.

A random forest (depth 1..8, up to 64 nodes) is verified in one call, inside a batch of other
random rows, with ``q_max`` padded. A branch of it (the ancestors of its deepest node) is then
decoded as a greedy chain: step ``t`` has ``cache_len = P + t``, ``q_len = 1``, the path's first
``t`` keys committed at ``P .. P + t - 1`` (copied from their tree slots: the same values) and its
own key at ``P + t``. Every step's output must equal the tree's output for that node bit for bit.
The steps run as the rows of one batch (each in its own pool row), which is what a chain of
single-step calls computes by batch invariance (its own property); a test in
``tests/kernels/test_attention_invariant.py`` runs the chain step by step through a ``KVPool``.
Every stale slot holds NaN; outputs are poisoned.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from flashrt_kernels.attention import reference
from flashrt_kernels.attention.decode import gqa_attention
from flashrt_kernels.attention.properties import (
    DTYPES,
    GROUPS,
    _bound,
    random_tree_mask,
)
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

# prefix lengths at block (64) and split (512) boundaries: a chain crosses them while it grows
PREFIX_EDGES = (0, 1, 2, 63, 64, 65, 127, 128, 505, 508, 511, 512, 513, 1023, 1024, 1025)
# small (interpreter): drawn trees up to 24 nodes (the interpreter is slow); the
# examples hold 33 and 64 nodes
SMALL = {"nodes": 24, "prefix": 600, "kv_heads": (1, 2), "head_dims": (64, 80, 128), "other": 2}
REAL = {"nodes": 64, "prefix": 8192, "kv_heads": (2, 8), "head_dims": (128,), "other": 3}
NODE_EDGES = (1, 2, 7, 8, 16, 24, 33, 63, 64)


@st.composite
def _chain_cases(draw, scale: str):
    lim = SMALL if scale == "small" else REAL
    nodes = draw(sizes(1, lim["nodes"], NODE_EDGES))
    prefix = draw(sizes(0, lim["prefix"], PREFIX_EDGES + (lim["prefix"],)))
    return {
        "nodes": nodes,
        "depth": draw(st.integers(1, 8)),
        "prefix": prefix,
        "q_max": min(64, nodes + draw(st.sampled_from((0, 0, 1, 5)))),
        "chain_q_max": draw(st.sampled_from((1, 1, 2, 7))),
        "other": draw(st.integers(0, lim["other"])),
        "row": draw(st.integers(0, lim["other"])),
        "group": draw(st.sampled_from(GROUPS)),
        "kv_heads": draw(st.sampled_from(lim["kv_heads"])),
        "head_dim": draw(st.sampled_from(lim["head_dims"])),
        "dtype": draw(st.sampled_from(DTYPES)),
        "bits": draw(st.booleans()),
        "seed": draw(seeds()),
    }


def _chain_examples(scale: str):
    base = {"depth": 8, "q_max": 64, "chain_q_max": 1, "other": 1, "row": 1, "group": 8,
            "kv_heads": 2, "head_dim": 128, "dtype": torch.bfloat16, "bits": True, "seed": 5}  # fmt: skip
    if scale == "small":
        return [
            {**base, "nodes": 33, "prefix": 508, "q_max": 40, "head_dim": 80},
            {**base, "nodes": 8, "prefix": 0, "q_max": 9, "group": 1, "kv_heads": 1,
             "dtype": torch.float16, "bits": False, "chain_q_max": 2},
            {**base, "nodes": 64, "prefix": 1, "group": 4, "head_dim": 64, "other": 0, "row": 0,
             "kv_heads": 1},
        ]  # fmt: skip
    return [
        {**base, "nodes": 64, "prefix": 8190},
        {**base, "nodes": 24, "prefix": 2045, "q_max": 33, "group": 4, "kv_heads": 8},
        {**base, "nodes": 33, "prefix": 4096, "q_max": 40, "bits": False, "other": 3, "row": 2},
    ]


def _deepest_path(mask: torch.Tensor) -> list[int]:
    """The slots of the deepest node's ancestors and itself (the last such node on ties)."""
    depth = mask.sum(1)
    node = int((depth == depth.max()).nonzero().flatten()[-1])
    return mask[node].nonzero().flatten().tolist()


def _check_chain_equals_tree(case) -> None:
    device = test_device()
    n, p, q_max, s = case["nodes"], case["prefix"], case["q_max"], case["seed"]
    hkv, d, dt = case["kv_heads"], case["head_dim"], case["dtype"]
    hq = hkv * case["group"]
    bsz = case["other"] + 1
    row = min(case["row"], bsz - 1)
    g = torch.Generator().manual_seed(s)
    cache_lens = torch.randint(0, p + 2, (bsz,), generator=g, dtype=torch.int32)
    q_lens = torch.randint(0, q_max + 1, (bsz,), generator=g, dtype=torch.int32)
    cache_lens[row], q_lens[row] = p, n
    cap = int((cache_lens + q_lens).max()) + 1
    q = make_values("normal", (bsz, q_max, hq, d), dt, s + 1, device)
    k = make_values("normal", (bsz + 1, cap, hkv, d), dt, s + 2, device)
    v = make_values("normal", (bsz + 1, cap, hkv, d), dt, s + 3, device)
    extent = torch.cat([cache_lens + q_lens, torch.zeros(1, dtype=torch.int32)]).to(device)
    stale = torch.arange(cap, device=device)[None, :] >= extent[:, None]
    k[stale] = float("nan")
    v[stale] = float("nan")
    mask = torch.rand(bsz, q_max, q_max, generator=g) < 0.5  # noise where nothing may look
    for b in range(bsz):
        m = int(q_lens[b])
        if m:
            mask[b, :m, :m] = random_tree_mask(m, case["depth"], s + 4 + b)
    path = _deepest_path(mask[row, :n, :n])
    mask = mask.to(device)
    tree_mask = reference.pack_tree_mask(mask) if case["bits"] else mask
    cl, ql = cache_lens.to(device), q_lens.to(device)
    out = poisoned_empty(q.shape, dt, device)
    tree = gqa_attention(q, k, v, cl, ql, tree_mask=tree_mask, out=out, backend="triton",
                         query_invariant=True)  # fmt: skip
    want = reference.gqa_attention(q, k, v, cl, ql, tree_mask=tree_mask)
    assert_faithful(tree, want, **_bound(v[:-1].nan_to_num(0.0), dt), what="tree vs reference")

    # the chain: step t in pool row steps - 1 - t, the path's keys committed before it
    steps = len(path)
    kc = torch.full((steps, p + steps + 1, hkv, d), float("nan"), dtype=dt, device=device)
    vc = torch.full_like(kc, float("nan"))
    kc[:, :p] = k[row, :p]
    vc[:, :p] = v[row, :p]
    slots = torch.tensor([p + j for j in path], device=device)
    for t in range(steps):
        kc[steps - 1 - t, p : p + t + 1] = k[row, slots[: t + 1]]
        vc[steps - 1 - t, p : p + t + 1] = v[row, slots[: t + 1]]
    qc = make_values("normal", (steps, case["chain_q_max"], hq, d), dt, s + 5, device)
    qc[:, 0] = q[row, path]
    rows = torch.arange(steps - 1, -1, -1, dtype=torch.int32, device=device)
    ccl = torch.arange(p, p + steps, dtype=torch.int32, device=device)
    cql = torch.ones(steps, dtype=torch.int32, device=device)
    chain = gqa_attention(qc, kc, vc, ccl, cql, cache_rows=rows, backend="triton",
                          query_invariant=True)  # fmt: skip
    assert_exact(chain[:, 0], tree[row, path], what=f"chain steps vs tree branch {path}")


register_property(Property("gqa_attention", "query_invariant_chain_equals_tree", _chain_cases,
                           _check_chain_equals_tree, _chain_examples))  # fmt: skip
