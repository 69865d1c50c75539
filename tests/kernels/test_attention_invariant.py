"""gqa_attention(..., query_invariant=True): properties (CPU interpreter at small shapes, GPU at
real shapes), a greedy chain step by step through a KVPool, inputs, custom ops."""

import pytest
import torch

from flashrt_kernels.attention import KVPool, gqa_attention, reference, workspace_numel
from flashrt_kernels.attention.invariant_kernels import tile_layout
from flashrt_kernels.attention.properties import random_tree_mask
from flashrt_kernels.attention.splits import invariant_geometry
from flashrt_kernels.registry import properties
from flashrt_kernels.testing import assert_exact, make_values

PROPS = properties()
_NAMES = (
    "gqa_attention.query_invariant_matches_reference",
    "gqa_attention.query_invariant_batch_invariant",
    "gqa_attention.query_invariant_chain_equals_tree",
)
for _name in _NAMES:
    _short = _name.replace(".", "_")
    globals()[f"test_{_short}"] = PROPS[_name].test("small")
    globals()[f"test_{_short}_gpu"] = pytest.mark.gpu(PROPS[_name].test("real"))

BF16 = torch.bfloat16
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _lens(*xs):
    return torch.tensor(xs, dtype=torch.int32, device=DEV)


def _greedy_chain_vs_tree(backend, prefix, hq, hkv, d, n_nodes, seed):
    """A tree verified once, then its deepest branch decoded step by step in a KVPool: each step
    appends its key, attends with q_len = 1, then commits (the tree's keys moved by
    ``KVPool.commit`` in the first step, so committed keys came from tree slots)."""
    mask = random_tree_mask(n_nodes, 8, seed).to(DEV)
    depth = mask.sum(1)
    node = int((depth == depth.max()).nonzero().flatten()[-1])
    path = mask[node].nonzero().flatten().tolist()
    cap = prefix + n_nodes + 4
    prompt_k = make_values("normal", (1, prefix, hkv, d), BF16, seed, DEV)
    prompt_v = make_values("normal", (1, prefix, hkv, d), BF16, seed + 1, DEV)
    nodes_k = make_values("normal", (1, n_nodes, hkv, d), BF16, seed + 2, DEV)
    nodes_v = make_values("normal", (1, n_nodes, hkv, d), BF16, seed + 3, DEV)
    q = make_values("normal", (1, n_nodes, hq, d), BF16, seed + 4, DEV)
    pool = KVPool(1, 2, cap, hkv, d, dtype=BF16, device=DEV)
    pool.k.fill_(float("nan"))
    pool.v.fill_(float("nan"))
    pool.acquire()
    row = torch.tensor([pool.acquire()], dtype=torch.int32, device=DEV)  # pool row 1
    if prefix:
        pool.append(0, row, prompt_k, prompt_v, _lens(prefix))
        pool.advance(row, _lens(prefix))
    pool.append(0, row, nodes_k, nodes_v, _lens(n_nodes))
    kc, vc = pool.layer(0)
    tree = gqa_attention(q, kc, vc, pool.lengths[row.long()], _lens(n_nodes), cache_rows=row,
                         tree_mask=mask[None], backend=backend, query_invariant=True)  # fmt: skip
    # commit the path's first node from its tree slot, then decode the rest one by one
    accepted = torch.tensor([[path[0]]], device=DEV)
    steps = []
    for t, j in enumerate(path):
        if t == 0:
            pool.commit(0, row, accepted, _lens(1))
        else:
            pool.append(0, row, nodes_k[:, j : j + 1], nodes_v[:, j : j + 1], _lens(1))
        kc, vc = pool.layer(0)
        cl = pool.lengths[row.long()]
        # stale slots past the step: NaN (the tree's nodes that were never committed)
        kc[row.long(), int(cl) + 1 :] = float("nan")
        vc[row.long(), int(cl) + 1 :] = float("nan")
        steps.append(gqa_attention(q[:, j : j + 1], kc, vc, cl, _lens(1), cache_rows=row,
                                   backend=backend, query_invariant=True)[0, 0])  # fmt: skip
        pool.advance(row, _lens(1))
    return torch.stack(steps), tree[0, path]


@pytest.mark.parametrize(("prefix", "n_nodes", "seed"), [(0, 9, 1), (510, 12, 2), (64, 16, 3)])
def test_greedy_chain_through_pool_equals_tree(prefix, n_nodes, seed):
    chain, tree = _greedy_chain_vs_tree("triton", prefix, 8, 2, 64, n_nodes, seed)
    assert_exact(chain, tree, what="greedy chain vs tree branch")


def test_reference_backend_is_query_invariant():
    chain, tree = _greedy_chain_vs_tree("reference", 70, 4, 1, 80, 10, 4)
    assert_exact(chain, tree, what="reference backend: greedy chain vs tree branch")


@pytest.mark.gpu
@pytest.mark.parametrize(("prefix", "hq", "hkv", "n_nodes"), [(8000, 16, 2, 64), (2047, 32, 8, 24)])
def test_greedy_chain_through_pool_equals_tree_gpu(prefix, hq, hkv, n_nodes):
    chain, tree = _greedy_chain_vs_tree("triton", prefix, hq, hkv, 128, n_nodes, 7)
    assert_exact(chain, tree, what="greedy chain vs tree branch")


@pytest.mark.parametrize(("group", "d", "bits"), [(1, 64, True), (4, 128, False), (8, 128, True),
                                                 (16, 64, False)])  # fmt: skip
def test_every_tile_slot_gives_the_same_bits(group, d, bits):
    """Two tiles of root nodes (each sees the prefix and itself): node ``i``, whatever its slot in
    its tile, equals the q = 1 step that has the prefix and node ``i``'s key committed before it
    (the steps batched, one per pool row), bit for bit."""
    prefix, hkv = 70, 2
    hq = group * hkv
    rows, nodes = tile_layout(group, invariant_geometry()["BLOCK_M"])
    n = 2 * nodes
    q = make_values("normal", (1, n, hq, d), BF16, 11, DEV)
    k = make_values("normal", (1, prefix + n, hkv, d), BF16, 12, DEV)
    v = make_values("normal", (1, prefix + n, hkv, d), BF16, 13, DEV)
    mask = torch.eye(n, dtype=torch.bool, device=DEV)[None]
    tree = gqa_attention(q, k, v, _lens(prefix), _lens(n),
                         tree_mask=reference.pack_tree_mask(mask) if bits else mask,
                         backend="triton", query_invariant=True)  # fmt: skip
    ks = torch.cat([k[:, :prefix].expand(n, -1, -1, -1), k[0, prefix:, None]], 1)
    vs = torch.cat([v[:, :prefix].expand(n, -1, -1, -1), v[0, prefix:, None]], 1)
    cl = torch.full((n,), prefix, dtype=torch.int32, device=DEV)
    steps = gqa_attention(q[0, :, None].contiguous(), ks.contiguous(), vs.contiguous(), cl,
                          torch.ones_like(cl), backend="triton", query_invariant=True)  # fmt: skip
    assert rows * nodes == invariant_geometry()["BLOCK_M"] and rows >= group
    assert_exact(tree[0], steps[:, 0], what=f"{n} nodes in {rows}-row slots vs q = 1 steps")


def test_invariant_inputs_and_workspace():
    q = torch.randn(1, 65, 2, 64, dtype=BF16)
    k = torch.randn(1, 100, 1, 64, dtype=BF16)
    tree = torch.ones(1, 65, 65, dtype=torch.bool)
    with pytest.raises(ValueError, match="at most 64 nodes"):
        gqa_attention(q, k, k, _lens(0).cpu(), _lens(65).cpu(), tree_mask=tree,
                      query_invariant=True)  # fmt: skip
    with pytest.raises(TypeError, match="query_invariant must be a bool"):
        gqa_attention(q, k, k, _lens(0).cpu(), _lens(65).cpu(), query_invariant=1)
    q = torch.randn(1, 2, 2, 64, dtype=BF16)
    small = workspace_numel(1, 2, 2, 1, 64, 100)
    need = workspace_numel(1, 2, 2, 1, 64, 100, query_invariant=True)
    with pytest.raises(ValueError, match="workspace must hold"):
        gqa_attention(q, k, k, _lens(30).cpu(), _lens(2).cpu(), workspace=torch.empty(need - 1),
                      query_invariant=True)  # fmt: skip
    out = torch.empty_like(q)
    got = gqa_attention(q, k, k, _lens(30).cpu(), _lens(2).cpu(), out=out,
                        workspace=torch.empty(need), backend="triton", query_invariant=True)  # fmt: skip
    assert got.data_ptr() == out.data_ptr() and small > 0


def test_invariant_custom_ops():
    q = torch.randn(2, 3, 4, 64, dtype=BF16)
    k = torch.randn(2, 20, 2, 64, dtype=BF16)
    cl, ql = _lens(5, 0).cpu(), _lens(3, 2).cpu()
    want = reference.gqa_attention_invariant(q, k, k, cl, ql)
    got = torch.ops.flashrt.gqa_attention(q, k, k, cl, ql, None, None, None, "reference", True)
    assert torch.equal(got, want)
    with torch._subclasses.fake_tensor.FakeTensorMode():
        fq = torch.empty(2, 3, 4, 64, dtype=BF16)
        fk = torch.empty(2, 20, 2, 64, dtype=BF16)
        fl = torch.empty(2, dtype=torch.int32)
        got = torch.ops.flashrt.gqa_attention(fq, fk, fk, fl, fl, None, None, None, "triton", True)
        assert got.shape == fq.shape


def test_invariant_tma_loads_give_the_pointer_loads_bits():
    """The committed blocks through tensor descriptors (``TMA``, the default where the pool is
    packed) give the pointer loads' bits; stale slots hold NaN."""
    from flashrt_kernels.attention.gqa_kernels import kv_descriptors
    from flashrt_kernels.attention.invariant_kernels import launch_invariant

    hq, hkv, d, q_max, cap = 8, 2, 64, 10, 1200
    cl, ql = _lens(600, 1100, 40), _lens(10, 1, 7)
    q = make_values("normal", (3, q_max, hq, d), BF16, 1, DEV)
    k = make_values("normal", (3, cap, hkv, d), BF16, 2, DEV)
    v = make_values("normal", (3, cap, hkv, d), BF16, 3, DEV)
    for b in range(3):
        k[b, int(cl[b] + ql[b]) :] = float("nan")
        v[b, int(cl[b] + ql[b]) :] = float("nan")
    mask = torch.stack([random_tree_mask(q_max, 4, s) for s in range(3)]).to(DEV)
    assert kv_descriptors(k, v, invariant_geometry()["BLOCK_N"]) is not None
    outs = []
    for cfg in (None, {"TMA": False}):
        out = torch.full((3, q_max, hq, d), float("nan"), dtype=BF16, device=DEV)
        ws = torch.empty(workspace_numel(3, q_max, hq, hkv, d, cap, query_invariant=True),
                         device=DEV)  # fmt: skip
        launch_invariant(q, k, v, out, cl, ql, cache_rows=None, mask=mask.view(torch.uint8),
                         mask_mode=1, workspace=ws, scale=d**-0.5, config=cfg)  # fmt: skip
        outs.append(out)
    assert not outs[0][0].isnan().any()
    assert_exact(outs[0], outs[1], what="TMA-loaded invariant tiles vs pointer loads")


def _causal_chain_check(cache, chain, hkv, group, d, dev):
    """A causal launch of a row's ``chain`` new tokens (a frame's prefill in the lossless replay),
    stepped per node or once for the tile (``CAUSAL_TILE_STEPS``, the default), gives each token
    the bits of its own q = 1 decode step over the same pool row (cache ``cache + i``), stale
    slots NaN."""
    from flashrt_kernels.attention.invariant_kernels import launch_invariant

    hq = hkv * group
    cap = cache + chain + 6
    k = make_values("normal", (2, cap, hkv, d), BF16, 11, dev)
    v = make_values("normal", (2, cap, hkv, d), BF16, 12, dev)
    k[:, cache + chain :] = float("nan")
    v[:, cache + chain :] = float("nan")
    q = make_values("normal", (1, chain, hq, d), BF16, 13, dev)
    row = torch.tensor([1], dtype=torch.int32, device=dev)
    lens = torch.tensor([cache], dtype=torch.int32, device=dev)
    chain_len = torch.tensor([chain], dtype=torch.int32, device=dev)
    fulls = []
    for cfg in ({"CAUSAL_TILE_STEPS": False}, {"CAUSAL_TILE_STEPS": True}):
        full = torch.full_like(q, float("nan"))
        ws = torch.empty(workspace_numel(1, chain, hq, hkv, d, cap, query_invariant=True),
                         device=dev)  # fmt: skip
        launch_invariant(q, k, v, full, lens, chain_len, cache_rows=row, mask=None,
                         mask_mode=0, workspace=ws, scale=d**-0.5, config=cfg)  # fmt: skip
        fulls.append(full)
    steps = gqa_attention(q.transpose(0, 1), k, v, cache + torch.arange(chain, device=dev).int(),
                          torch.ones(chain, dtype=torch.int32, device=dev),
                          cache_rows=row.repeat(chain), backend="triton",
                          query_invariant=True)  # fmt: skip
    for full, how in zip(fulls, ("per node", "per tile"), strict=True):
        assert full.isfinite().all()
        assert_exact(full[0], steps[:, 0], what=f"causal chain ({how}) vs its decode steps")


@pytest.mark.parametrize(("cache", "chain", "group"), [(100, 70, 4), (0, 19, 8), (530, 9, 1)])
def test_causal_chain_equals_its_decode_steps(cache, chain, group):
    _causal_chain_check(cache, chain, 1, group, 64, DEV)


@pytest.mark.gpu
@pytest.mark.parametrize(("cache", "chain"), [(2048, 450), (8000, 130), (0, 77)])
def test_causal_chain_equals_its_decode_steps_gpu(cache, chain):
    """The same at the lossless replay's shapes (Qwen2.5-VL-3B: 16 / 2 heads, d = 128)."""
    _causal_chain_check(cache, chain, 2, 8, 128, "cuda")


def test_invariant_bool_and_bit_masks_give_the_same_bits():
    """The query-invariant mode under a tree mask as bool rows and as packed bit rows
    (``pack_tree_mask``): the same visible sequences, so the same bits (the bit rows are the
    launch that does not spill, ``tools/registers.py``)."""
    from flashrt_kernels.attention import pack_tree_mask

    hq, hkv, d, q_max, cap = 8, 2, 64, 24, 700
    cl, ql = _lens(600, 37, 0), _lens(24, 11, 5)
    q = make_values("normal", (3, q_max, hq, d), BF16, 21, DEV)
    k = make_values("normal", (3, cap, hkv, d), BF16, 22, DEV)
    v = make_values("normal", (3, cap, hkv, d), BF16, 23, DEV)
    mask = torch.stack([random_tree_mask(q_max, 6, s) for s in range(3)]).to(DEV)
    as_bool = gqa_attention(q, k, v, cl, ql, tree_mask=mask, backend="triton",
                            query_invariant=True)  # fmt: skip
    as_bits = gqa_attention(q, k, v, cl, ql, tree_mask=pack_tree_mask(mask), backend="triton",
                            query_invariant=True)  # fmt: skip
    assert_exact(as_bits, as_bool, what="bit-row mask vs bool mask")


def test_combine_merges_rows_of_few_and_many_splits():
    """The combine reads a row of at most ``COMBINE_CHUNK`` splits in one wave and a longer row
    chunk by chunk: with 64-key splits, q = 1 rows of 3, 16 and 40 splits are faithful to the
    reference (a tolerance tight enough to catch one lost split), and each row's bits are the
    same alone as inside the batch (NaN past the extents)."""
    from flashrt_kernels.attention.invariant_kernels import COMBINE_CHUNK, launch_invariant
    from flashrt_kernels.attention.splits import invariant_workspace_numel
    from flashrt_kernels.testing import assert_faithful

    cfg = {"SPLIT_KEYS": 64}
    hq, hkv, d, cap = 2, 1, 64, 2560
    lens = (150, 16 * 64 - 1, 40 * 64 - 10)
    assert [-(-(n + 1) // 64) for n in lens] == [3, COMBINE_CHUNK, 40] and COMBINE_CHUNK == 16
    g = torch.Generator().manual_seed(3)
    q = torch.randn(len(lens), 1, hq, d, generator=g).to(BF16).to(DEV)
    k = torch.randn(len(lens), cap, hkv, d, generator=g).to(BF16).to(DEV)
    v = torch.randn(len(lens), cap, hkv, d, generator=g).to(BF16).to(DEV)
    for b, n in enumerate(lens):
        k[b, n + 1 :] = float("nan")
        v[b, n + 1 :] = float("nan")
    cl, ql = _lens(*lens), _lens(1, 1, 1)

    def run(rows):
        idx = torch.tensor(rows, device=DEV)
        out = torch.full((len(rows), 1, hq, d), float("nan"), dtype=BF16, device=DEV)
        ws = torch.empty(invariant_workspace_numel(len(rows), 1, hq, d, cap, cfg), device=DEV)
        launch_invariant(q[idx], k[idx], v[idx], out, cl[idx], ql[idx], cache_rows=None,
                         mask=None, mask_mode=0, workspace=ws, scale=d**-0.5, config=cfg)  # fmt: skip
        return out

    full = run([0, 1, 2])
    want = reference.gqa_attention(q, k, v, cl, ql)
    tol = {
        "rtol": 2.0**-7,
        "atol": 2.0**-8 * float(want.float().abs().max()),
    }  # (catches a lost split)
    assert_faithful(full, want, **tol, what="rows of 3, 16 and 40 splits vs reference")
    for b in range(len(lens)):
        assert_exact(run([b])[0], full[b], what=f"row {b} alone vs in the batch")
