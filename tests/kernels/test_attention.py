import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import numpy as np
import pytest
import torch
from hypothesis import given, settings

from flashrt_kernels.attention import (
    KVPool,
    gqa_attention,
    pack_tree_mask,
    packed_prefill_attention,
    reference,
    segmented_attention,
    workspace_numel,
)
from flashrt_kernels.attention.properties import random_tree_mask
from flashrt_kernels.registry import properties

PROPS = properties()
_NAMES = (
    "gqa_attention.matches_reference",
    "gqa_attention.batch_invariant",
    "packed_prefill_attention.matches_reference_and_rows_alone",
    "segmented_attention.matches_reference_and_independent",
    "rope_append.matches_reference",
    "rope_qk.matches_reference",
)
for _name in _NAMES:
    _short = _name.replace(".", "_")
    globals()[f"test_{_short}"] = PROPS[_name].test("small")
    globals()[f"test_{_short}_gpu"] = pytest.mark.gpu(PROPS[_name].test("real"))

BF16 = torch.bfloat16


def _lens(*xs):
    return torch.tensor(xs, dtype=torch.int32)


def test_tree_mask_packing_round_trips():
    m = torch.stack([random_tree_mask(40, d, s) for d, s in ((1, 0), (8, 1), (3, 2))])
    assert torch.equal(reference.unpack_tree_mask(pack_tree_mask(m), 40), m)
    assert m[1].sum(1).max() <= 8 and m[0].sum(1).max() <= 2


def test_reference_tree_with_chain_mask_equals_causal():
    q = torch.randn(2, 6, 4, 64, dtype=BF16)
    k = torch.randn(2, 50, 2, 64, dtype=BF16)
    v = torch.randn_like(k)
    cl, ql = _lens(10, 40), _lens(6, 3)
    chain = torch.tril(torch.ones(6, 6, dtype=torch.bool)).expand(2, 6, 6)
    a = reference.gqa_attention(q, k, v, cl, ql)
    b = reference.gqa_attention(q, k, v, cl, ql, tree_mask=chain)
    assert torch.equal(a, b)
    assert torch.equal(a[1, 3:], torch.zeros_like(a[1, 3:]))


@settings(max_examples=300, deadline=None)
@given(
    s=hnp.arrays(np.float32, st.integers(1, 64),
                 elements=st.floats(width=32, allow_nan=False, allow_subnormal=True)),
    scale=st.floats(min_value=2.0**-126, max_value=2.0**126, width=32),
)  # fmt: skip
def test_row_max_of_raw_scores_then_scaled_is_the_max_of_scaled_scores(s, scale):
    """What the tiles' ``_scaled_max`` relies on: for ``scale > 0`` (both ops validate it), fp32
    round-to-nearest is monotonic, so ``max(s) * scale`` is ``max(s * scale)``: the same value
    (+0 and -0 compare equal), overflow and underflow included."""
    c = np.float32(scale)
    with np.errstate(over="ignore", under="ignore"):
        assert np.max(s) * c == np.max(s * c)


def test_chain_bit_rows_unpack_to_chain_then_tree():
    # row 0: a chain of 3 tokens, then a 3-node tree (node 2's parent is node 0); row 1: no
    # chain; chain queries' rows and bits past the tree are noise the mask must ignore
    bits = torch.tensor([[-1, 7, -8, 1 | 2**40, 2 | 2**50, 5 | 2**60],
                         [1, 3, 5, 9, 16, -2**63]])  # fmt: skip
    m = reference.unpack_tree_mask(bits, 6, _lens(3, 0))
    chain = torch.tril(torch.ones(3, 3, dtype=torch.bool))
    assert torch.equal(m[0, :3, :3], chain) and not m[0, :3, 3:].any()
    assert m[0, 3:, :3].all()
    want_tree = torch.tensor([[1, 0, 0], [0, 1, 0], [1, 0, 1]], dtype=torch.bool)
    assert torch.equal(m[0, 3:, 3:], want_tree)
    assert torch.equal(m[1], reference.unpack_tree_mask(bits[1:], 6)[0])
    assert torch.equal(m[1, 5], torch.zeros(6, dtype=torch.bool))  # bit 63 is node 63: past q_max
    # a whole-row chain is causal
    q = torch.randn(2, 6, 4, 64, dtype=BF16)
    k = torch.randn(2, 50, 2, 64, dtype=BF16)
    cl, ql = _lens(10, 40), _lens(6, 3)
    whole = reference.gqa_attention(q, k, k, cl, ql, tree_mask=bits, chain_lens=ql)
    assert torch.equal(whole, reference.gqa_attention(q, k, k, cl, ql))


def test_kv_pool_append_commit_reuse():
    pool = KVPool(2, 3, 32, 2, 8, dtype=torch.float32)
    r0, r1 = pool.acquire(), pool.acquire()
    rows = torch.tensor([r1, r0], dtype=torch.int32)
    k1 = torch.randn(2, 5, 2, 8)
    pool.append(1, rows, k1, -k1, _lens(5, 3))
    assert torch.equal(pool.k[1, r1, :5], k1[0]) and torch.equal(pool.k[1, r0, :3], k1[1, :3])
    assert torch.equal(pool.v[1, r0, :3], -k1[1, :3])
    assert pool.k[1, r0, 3:].abs().sum() == 0 and pool.k[0].abs().sum() == 0  # nothing else
    pool.advance(rows, _lens(5, 3))
    assert pool.lengths.tolist()[:2] == [3, 5]
    # tree nodes after the prefix, then keep nodes 0, 2, 3 of row r1 and node 1 of row r0
    nodes = torch.randn(2, 4, 2, 8)
    pool.append(1, rows, nodes, nodes * 2, _lens(4, 4))
    accepted = torch.tensor([[0, 2, 3, 0], [1, 0, 0, 0]])
    pool.commit(1, rows, accepted, _lens(3, 1))
    pool.advance(rows, _lens(3, 1))
    assert torch.equal(pool.k[1, r1, 5:8], nodes[0, [0, 2, 3]])
    assert torch.equal(pool.v[1, r1, 5:8], 2 * nodes[0, [0, 2, 3]])
    assert torch.equal(pool.k[1, r0, 3], nodes[1, 1])
    assert pool.lengths.tolist()[:2] == [4, 8]
    pool.release(r0)
    r2 = pool.acquire()
    assert r2 == 2 and pool.lengths[r2] == 0
    with pytest.raises(ValueError, match="already free"):
        pool.release(r0)
    assert pool.acquire() == r0 and pool.lengths[r0] == 0  # a finished row handed over


def test_kv_pool_packed_append_routes_padding_to_scratch():
    pool = KVPool(1, 2, 16, 1, 4, dtype=torch.float32)
    pool.lengths[:] = torch.tensor([2, 7], dtype=torch.int32)
    k = torch.arange(6 * 4, dtype=torch.float32).view(6, 1, 4)
    token_row = torch.tensor([0, 0, 1, -1, -1, 1])
    token_index = torch.tensor([0, 1, 0, 0, 0, 1])
    pool.append_packed(0, torch.tensor([1, 0], dtype=torch.int32), k, k, token_row, token_index)
    assert torch.equal(pool.k[0, 1, 7:9], k[[0, 1]]) and torch.equal(pool.k[0, 0, 2:4], k[[2, 5]])
    assert pool.k[0, 0, 4:].abs().sum() == 0 and pool.k[0, 1, 9:].abs().sum() == 0


def test_pool_decode_step_matches_reference():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    pool = KVPool(1, 2, 200, 2, 64, dtype=BF16, device=dev)
    pool.k.fill_(float("nan"))
    pool.v.fill_(float("nan"))
    rows = torch.tensor([1, 0], dtype=torch.int32, device=dev)
    prompt = torch.randn(2, 150, 2, 64, dtype=BF16, device=dev)
    pool.append(0, rows, prompt, prompt.flip(1), _lens(150, 90).to(dev))
    pool.advance(rows, _lens(150, 90).to(dev))
    q = torch.randn(2, 1, 8, 64, dtype=BF16, device=dev)
    kn = torch.randn(2, 1, 2, 64, dtype=BF16, device=dev)
    pool.append(0, rows, kn, kn, _lens(1, 1).to(dev))
    kc, vc = pool.layer(0)
    got = gqa_attention(q, kc, vc, pool.lengths[rows.long()], _lens(1, 1).to(dev),
                        cache_rows=rows, backend="triton")  # fmt: skip
    for b, n in enumerate((150, 90)):
        keys = torch.cat([prompt[b, :n], kn[b]])[None]
        vals = torch.cat([prompt.flip(1)[b, :n], kn[b]])[None]
        want = reference.gqa_attention(q[b : b + 1], keys, vals, _lens(n).to(dev), _lens(1).to(dev))
        torch.testing.assert_close(got[b : b + 1], want, rtol=2**-7, atol=2**-6)


def test_reference_backend_and_custom_ops():
    q = torch.randn(2, 3, 4, 64, dtype=BF16)
    k = torch.randn(2, 20, 2, 64, dtype=BF16)
    cl, ql = _lens(5, 0), _lens(3, 2)
    want = reference.gqa_attention(q, k, k, cl, ql)
    assert torch.equal(gqa_attention(q, k, k, cl, ql, backend="reference"), want)
    assert torch.equal(torch.ops.flashrt.gqa_attention(q, k, k, cl, ql, None, None, None,
                                                       "reference"), want)  # fmt: skip
    with torch._subclasses.fake_tensor.FakeTensorMode():
        fq = torch.empty(2, 3, 4, 64, dtype=BF16)
        fk = torch.empty(2, 20, 2, 64, dtype=BF16)
        fl = torch.empty(2, dtype=torch.int32)
        assert torch.ops.flashrt.gqa_attention(fq, fk, fk, fl, fl, None, None, None,
                                               "triton").shape == fq.shape  # fmt: skip
        cu = torch.empty(3, dtype=torch.int32)
        fp = torch.empty(7, 4, 64, dtype=BF16)
        assert torch.ops.flashrt.packed_prefill_attention(fp, fk, fk, cu, fl, 4, None, None,
                                                          "triton").shape == fp.shape  # fmt: skip
        fs = torch.empty(7, 2, 80, dtype=BF16)
        assert torch.ops.flashrt.segmented_attention(fs, fs, fs, cu, 4, None,
                                                     "triton").shape == fs.shape  # fmt: skip


def test_out_and_workspace_variant_allocates_into_given_buffers():
    q = torch.randn(1, 2, 2, 64, dtype=BF16)
    k = torch.randn(1, 40, 1, 64, dtype=BF16)
    out = torch.empty_like(q)
    ws = torch.empty(workspace_numel(1, 2, 2, 1, 64, 40))
    got = gqa_attention(q, k, k, _lens(30), _lens(2), out=out, workspace=ws, backend="triton")
    assert got.data_ptr() == out.data_ptr()
    with pytest.raises(ValueError, match="workspace must hold"):
        gqa_attention(q, k, k, _lens(30), _lens(2), out=out, workspace=ws[:10])


BITS = torch.ones(2, 2, dtype=torch.int64)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"q": torch.randn(1, 2, 4, 64)}, TypeError, "q must have dtype in"),
        ({"k_cache": torch.randn(2, 40, 3, 64, dtype=BF16)}, ValueError, "multiple of kv heads"),
        ({"k_cache": torch.randn(2, 40, 2, 32, dtype=BF16)}, ValueError, "head dim must be 64"),
        ({"cache_lens": torch.tensor([1, 2])}, TypeError, "cache_lens must have dtype"),
        ({"q_lens": _lens(1, 2, 3)}, ValueError, r"q_lens must have shape \[2\]"),
        ({"tree_mask": torch.ones(2, 2, 3, dtype=torch.bool)}, ValueError, "tree_mask must have"),
        ({"tree_mask": torch.ones(2, 2, 2)}, TypeError, "tree_mask must have dtype"),
        ({"out": torch.empty(2, 2, 4, 64)}, TypeError, "out must have dtype"),
        ({"chain_lens": _lens(1, 1)}, ValueError, "chain_lens needs a bit-row"),
        (
            {"chain_lens": _lens(1, 1), "tree_mask": BITS, "query_invariant": True},
            ValueError,
            "not supported with query_invariant",
        ),
        ({"chain_lens": _lens(1), "tree_mask": BITS}, ValueError, r"chain_lens must have shape"),
        ({"scale": -1.0}, ValueError, "scale must be > 0"),
        ({"backend": "cute"}, ValueError, "not implemented"),
    ],
)
def test_gqa_bad_inputs_raise_clear_errors(kwargs, error, match):
    args = {
        "q": torch.randn(2, 2, 4, 64, dtype=BF16),
        "k_cache": torch.randn(2, 40, 2, 64, dtype=BF16),
        "v_cache": None,
        "cache_lens": _lens(3, 4),
        "q_lens": _lens(1, 2),
    }
    args.update(kwargs)
    if args["v_cache"] is None:
        args["v_cache"] = torch.randn_like(args["k_cache"])
    with pytest.raises(error, match=match):
        gqa_attention(args.pop("q"), args.pop("k_cache"), args.pop("v_cache"),
                      args.pop("cache_lens"), args.pop("q_lens"), **args)  # fmt: skip


def test_segmented_and_prefill_bad_inputs():
    q = torch.randn(10, 4, 80, dtype=BF16)
    with pytest.raises(ValueError, match="Hkv dividing"):
        segmented_attention(q, torch.randn(10, 3, 80, dtype=BF16), q[:, :3], _lens(0, 10), 10)
    with pytest.raises(TypeError, match="cu_seqlens must have dtype"):
        segmented_attention(q, q, q, torch.tensor([0, 10]), 10)
    k = torch.randn(2, 40, 2, 80, dtype=BF16)
    with pytest.raises(ValueError, match="max_seqlen must be >= 0"):
        packed_prefill_attention(q, k, k, _lens(0, 4, 10), _lens(0, 1), -1)
    with pytest.raises(ValueError, match=r"cache_lens must have shape \[2\]"):
        packed_prefill_attention(q, k, k, _lens(0, 4, 10), _lens(0), 6)


@pytest.mark.gpu
def test_cuda_graph_replay_is_exact():
    dev = "cuda"
    q = torch.randn(4, 24, 16, 128, dtype=BF16, device=dev)
    k = torch.randn(5, 3000, 2, 128, dtype=BF16, device=dev)
    v = torch.randn_like(k)
    cl = torch.tensor([2900, 0, 1000, 17], dtype=torch.int32, device=dev)
    ql = torch.tensor([24, 1, 0, 13], dtype=torch.int32, device=dev)
    mask = torch.stack([random_tree_mask(24, 8, s) for s in range(4)]).to(dev)
    out = torch.empty_like(q)
    ws = torch.empty(workspace_numel(4, 24, 16, 2, 128, 3000), device=dev)
    gqa_attention(q, k, v, cl, ql, tree_mask=mask, out=out, workspace=ws)
    eager = out.clone()
    out.zero_()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gqa_attention(q, k, v, cl, ql, tree_mask=mask, out=out, workspace=ws)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)


def test_rope_append_bad_inputs():
    from flashrt_kernels.attention import rope_append

    q, kv = torch.zeros(3, 4 * 8, dtype=BF16), torch.zeros(3, 2 * 8, dtype=BF16)
    cs = torch.zeros(3, 8, dtype=BF16)
    cache = torch.zeros(2, 5, 2, 8, dtype=BF16)
    idx = torch.zeros(3, dtype=torch.int64)
    q_out = torch.zeros(3, 4, 8, dtype=BF16)
    args = (q, kv, kv, cs, cs, cache, cache.clone(), idx, idx, q_out, idx)
    rope_append(*args)  # valid
    with pytest.raises(ValueError, match="q_heads"):
        rope_append(q[:, :30], *args[1:])
    with pytest.raises(TypeError, match="dtype"):
        rope_append(*args[:3], cs.float(), *args[4:])
    with pytest.raises(ValueError, match="q_out must be"):
        rope_append(*args[:9], torch.zeros(3, 2, 8, dtype=BF16), idx)
    with pytest.raises(ValueError, match="biases"):
        rope_append(*args, biases=(torch.zeros(32, dtype=BF16),))
    with pytest.raises(ValueError, match="head_dim must be even"):
        c7 = torch.zeros(2, 5, 2, 7, dtype=BF16)
        rope_append(torch.zeros(3, 28, dtype=BF16), torch.zeros(3, 14, dtype=BF16),
                    torch.zeros(3, 14, dtype=BF16), cs[:, :7], cs[:, :7], c7, c7.clone(), idx,
                    idx, torch.zeros(3, 4, 7, dtype=BF16), idx)  # fmt: skip


def test_rope_qk_bad_inputs():
    from flashrt_kernels.attention import rope_qk

    q, k = torch.zeros(3, 4, 8, dtype=BF16), torch.zeros(3, 2, 8, dtype=BF16)
    cs = torch.zeros(3, 8)
    rope_qk(q, k, cs, cs)  # valid
    with pytest.raises(ValueError, match="head_dim must be even"):
        rope_qk(q[..., :7], k[..., :7], cs[:, :7], cs[:, :7])
    with pytest.raises(ValueError, match="k must have shape"):
        rope_qk(q, k[:2], cs, cs)
    with pytest.raises(TypeError, match="dtype"):
        rope_qk(q, k.half(), cs, cs)
    with pytest.raises(ValueError, match="cos must have shape"):
        rope_qk(q, k, cs[:, :4], cs)
    with pytest.raises(ValueError, match="pair"):
        rope_qk(q, k, cs, cs, out=torch.empty_like(q))
    with pytest.raises(ValueError, match="k_out must have shape"):
        rope_qk(q, k, cs, cs, out=(torch.empty_like(q), torch.empty_like(q)))


def test_pdl_only_on_compiled_hopper_launches():
    from flashrt_kernels.backends import pdl_supported

    assert not pdl_supported(torch.device("cpu"))


@pytest.mark.gpu
def test_pdl_combine_gives_the_plain_launch_bits():
    """The combine as a programmatic dependent launch (the default on sm90+) against the plain
    launch: same bits, eagerly and replayed, for split decode rows, a tree and an empty row."""
    from flashrt_kernels.attention.gqa_kernels import launch_gqa_tiles

    dev = "cuda"
    for hq, hkv in ((16, 2), (32, 8)):
        q = torch.randn(4, 24, hq, 128, dtype=BF16, device=dev)
        k = torch.randn(4, 9000, hkv, 128, dtype=BF16, device=dev)
        v = torch.randn_like(k)
        cl = torch.tensor([8900, 0, 2047, 300], dtype=torch.int32, device=dev)
        ql = torch.tensor([1, 0, 24, 1], dtype=torch.int32, device=dev)
        mask = torch.stack([random_tree_mask(24, 8, s) for s in range(4)]).to(dev)
        ws = torch.empty(workspace_numel(4, 24, hq, hkv, 128, 9000), device=dev)
        outs = []
        for cfg in ({"PDL": False}, None):
            out = torch.full_like(q, float("nan"))
            launch_gqa_tiles(q, k, v, out, cl, ql, q_starts=None, cache_rows=None,
                             mask=mask.view(torch.uint8), mask_mode=1, q_max=24, split=True,
                             workspace=ws, scale=128**-0.5, config=cfg)  # fmt: skip
            outs.append(out)
        assert torch.equal(outs[0], outs[1])
        assert not outs[1].isnan().any()


def _merge_and_combine(q, k, v, cl, ql, mask, q_max, cfg=None):
    """``launch_gqa_tiles`` (split, bool tree mask) with the merge in the tile launch (the
    default, or ``cfg``) and with the combine launch; outputs start as NaN. Returns both, and
    the ticket buffer the merge used."""
    from flashrt_kernels.arrival import tickets
    from flashrt_kernels.attention.gqa_kernels import launch_gqa_tiles

    hq, d = q.shape[2], q.shape[3]
    cap, hkv = k.shape[1], k.shape[2]
    outs = []
    for merge in (True, False):
        geo = {**(cfg or {}), "MERGE": merge}
        ws = torch.empty(workspace_numel(q.shape[0], q_max, hq, hkv, d, cap, geo), device=q.device)
        out = torch.full_like(q, float("nan"))
        launch_gqa_tiles(q, k, v, out, cl, ql, q_starts=None, cache_rows=None,
                         mask=mask.view(torch.uint8), mask_mode=1, q_max=q_max, split=True,
                         workspace=ws, scale=d**-0.5, config=geo)  # fmt: skip
        outs.append(out)
    return outs[0], outs[1], tickets(q.device, 1)


def _check_merge(merged, combined, want, v, ql):
    from flashrt_kernels.testing import assert_faithful

    tol = {"rtol": 2.0**-7, "atol": 2.0**-7 * float(v.float().abs().max())}
    assert_faithful(merged.float().cpu(), want.float().cpu(), **tol, what="merge vs reference")
    assert_faithful(merged.float().cpu(), combined.float().cpu(), **tol,
                    what="merge vs combine")  # fmt: skip
    for b, n in enumerate(ql.tolist()):
        assert not merged[b, :n].isnan().any(), f"row {b}: a live slot not written"
        assert torch.equal(merged[b, n:], torch.zeros_like(merged[b, n:])), f"row {b}: dead slots"


@pytest.mark.parametrize(
    "merge_cfg",
    [
        {},
        {"narrow": {"MERGE_CHUNK": 2, "MERGE_STAGES": 2}, "wide": {"MERGE_STAGES": 2}},
        {"narrow": {"MERGE_GROUP": 4}, "wide": {"MERGE_GROUP": 2}},
    ],
    ids=["plain", "pipelined", "grouped"],
)
def test_merge_in_the_tile_launch_matches_the_combine(merge_cfg):
    """The last split program of a tile merges the partials (no combine launch): faithful to the
    reference and to the combine; every dead query slot is zero, written by the launch that
    owns it (a narrow row's slots past the narrow tiles by the wide launch); a row's bits are
    the same alone as in the batch; the tickets are left at zero for the next call. Plain
    loads, the pipelined loop that picks each chunk's weights from the registers, and splits
    merged by groups first (the q = 1 row: 19 splits, groups of 4, the last one of 3)."""
    from flashrt_kernels.testing import assert_exact

    g = torch.Generator().manual_seed(3)
    hq, hkv, d, q_max, cap = 8, 2, 64, 12, 320
    q = torch.randn(4, q_max, hq, d, generator=g).to(BF16)
    k = torch.randn(4, cap, hkv, d, generator=g).to(BF16)
    v = torch.randn(4, cap, hkv, d, generator=g).to(BF16)
    # a q = 1 row, a dead row, a narrow row of 5 queries (20 tile rows; slots 5..11 reach past
    # the 32 narrow rows) and a wide row (48 tile rows), over several splits each
    cl, ql = _lens(300, 40, 250, 200), _lens(1, 0, 5, 12)
    mask = torch.stack([random_tree_mask(q_max, 4, s) for s in range(4)])
    cfg = {"MIN_CHUNK": 16, "QUERY_CHUNK_FLOOR": 64, "QUERY_CHUNK_CAP": 64, **merge_cfg}
    merged, combined, tix = _merge_and_combine(q, k, v, cl, ql, mask, q_max, cfg)
    want = reference.gqa_attention(q, k, v, cl, ql, tree_mask=mask)
    _check_merge(merged, combined, want, v, ql)
    assert not tix.any(), "tickets left non-zero"
    for b in range(4):
        alone, _, _ = _merge_and_combine(q[b : b + 1], k[b : b + 1], v[b : b + 1], cl[b : b + 1],
                                         ql[b : b + 1], mask[b : b + 1], q_max, cfg)  # fmt: skip
        assert_exact(alone[0], merged[b], what=f"row {b} alone vs in the batch")


@pytest.mark.gpu
def test_merge_in_the_tile_launch_matches_the_combine_gpu():
    """The same at real shapes (both model shapes, L to 9k, a 24-node tree beside q = 1 rows, a
    dead row), eagerly and replayed in a CUDA graph (the same bits)."""
    from flashrt_kernels.attention.gqa_kernels import launch_gqa_tiles

    dev = "cuda"
    for hq, hkv in ((16, 2), (32, 8)):
        q = torch.randn(5, 24, hq, 128, dtype=BF16, device=dev)
        k = torch.randn(5, 9000, hkv, 128, dtype=BF16, device=dev)
        v = torch.randn_like(k)
        cl = torch.tensor([8900, 0, 2047, 300, 4000], dtype=torch.int32, device=dev)
        ql = torch.tensor([1, 0, 24, 1, 3], dtype=torch.int32, device=dev)
        mask = torch.stack([random_tree_mask(24, 8, s) for s in range(5)]).to(dev)
        merged, combined, tix = _merge_and_combine(q, k, v, cl, ql, mask, 24)
        want = reference.gqa_attention(q, k, v, cl, ql, tree_mask=mask)
        _check_merge(merged, combined, want, v, ql.cpu())
        assert not tix.any(), "tickets left non-zero"
        out = torch.full_like(q, float("nan"))
        ws = torch.empty(workspace_numel(5, 24, hq, hkv, 128, 9000), device=dev)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            launch_gqa_tiles(q, k, v, out, cl, ql, q_starts=None, cache_rows=None,
                             mask=mask.view(torch.uint8), mask_mode=1, q_max=24, split=True,
                             workspace=ws, scale=128**-0.5, config={"MERGE": True})  # fmt: skip
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, merged)


@pytest.mark.parametrize(
    "cfg",
    [None, {"QUERY_CHUNK_FLOOR": 512}, {"WIDE_KEYS_PER_ROW": 4, "QUERY_CHUNK_FLOOR": 2048},
     {"MIN_CHUNK": 64, "TARGET": 8, "QUERY_SPLITS": 3}],
)  # fmt: skip
def test_split_plan_is_the_most_splits_of_any_extent(cfg):
    """The host plan (grid and workspace) takes the most splits a row can have: exactly the
    maximum over every extent up to the capacity, so no split is left out and none is wasted."""
    from flashrt_kernels.attention.splits import geometry, most_splits, split_chunk

    geo = geometry(cfg, 2)
    for capacity in (1, 700, 5000):
        for q in (1, 3, 14, 150):
            brute = max(-(-t // split_chunk(t, q, 8, geo)) for t in range(1, capacity + 1))
            assert most_splits(capacity, q, 8, geo) == brute, (capacity, q)


def _tiles_on_rows(q, k, v, cl, ql, mask, rows, cfg):
    """``launch_gqa_tiles`` (split, bool tree mask) on the batch rows ``rows`` of the inputs,
    with geometry overrides ``cfg``; outputs start as NaN."""
    from flashrt_kernels.attention.gqa_kernels import launch_gqa_tiles

    idx = torch.tensor(rows)
    _, q_max, hq, d = q.shape
    cap, hkv = k.shape[1], k.shape[2]
    out = torch.full((len(rows), q_max, hq, d), float("nan"), dtype=q.dtype)
    ws = torch.empty(workspace_numel(len(rows), q_max, hq, hkv, d, cap, cfg))
    launch_gqa_tiles(q[idx], k[idx], v[idx], out, cl[idx], ql[idx], q_starts=None,
                     cache_rows=None, mask=mask[idx].view(torch.uint8), mask_mode=1, q_max=q_max,
                     split=True, workspace=ws, scale=d**-0.5, config=cfg)  # fmt: skip
    return out


def test_query_chunk_cap_splits_rows_of_many_queries():
    """A row whose query term passes ``QUERY_CHUNK_CAP`` splits its context (a replay step's frame
    rows): the host plan says so, the result is faithful to the reference, and a row's bits are
    the same alone as inside the batch (the split is a function of the row)."""
    from flashrt_kernels.attention.splits import geometry, split_chunk
    from flashrt_kernels.testing import assert_exact, assert_faithful

    cfg = {"QUERY_CHUNK_CAP": 128}
    hq, hkv, d, q_max = 2, 1, 64, 40
    cl, ql = _lens(260, 0, 100), _lens(40, 3, 25)
    assert split_chunk(260 + 40, 40, 2, geometry(cfg, hkv)) == 128  # 3 splits
    assert split_chunk(260 + 40, 40, 2, geometry(None, hkv)) == 1024  # 1 split without the cap
    g = torch.Generator().manual_seed(7)
    q = torch.randn(3, q_max, hq, d, generator=g).to(BF16)
    k = torch.randn(3, 300, hkv, d, generator=g).to(BF16)
    v = torch.randn(3, 300, hkv, d, generator=g).to(BF16)
    mask = torch.ones(q_max, q_max).tril().bool().expand(3, q_max, q_max).contiguous()

    def run(rows, cfg=cfg):
        return _tiles_on_rows(q, k, v, cl, ql, mask, rows, cfg)

    full = run([0, 1, 2])
    want = reference.gqa_attention(q, k, v, cl, ql, tree_mask=mask)
    tol = {"rtol": 2.0**-7, "atol": 2.0**-7 * float(v.float().abs().max())}
    assert_faithful(full, want, **tol, what="rows split at the query cap vs reference")
    assert_exact(run([0])[0], full[0], what="a split frame row alone vs in the batch")
    # the kernel splits too (not only the host plan): three partials merged round differently
    # from one walk (deterministic inputs; checked to differ)
    assert not torch.equal(run([0], cfg=None)[0], full[0])


def test_combine_merges_every_split_count():
    """The split combine reads a power of two of slots from 4 to ``TARGET`` by the row's split
    count: rows of 3, 7, 13, 26 and 57 splits (one in each of its reduction shapes) are faithful
    to the reference, and each row's bits are the same alone as inside the batch."""
    from flashrt_kernels.attention.splits import geometry, split_chunk
    from flashrt_kernels.testing import assert_exact, assert_faithful

    cfg = {"MIN_CHUNK": 16, "TARGET": 64}
    hq, hkv, d = 2, 1, 64
    lens = (40, 100, 200, 400, 900)
    splits = [-(-(n + 1) // split_chunk(n + 1, 1, 2, geometry(cfg, hkv))) for n in lens]
    assert splits == [3, 7, 13, 26, 57]
    cl, ql = _lens(*lens), _lens(*[1] * len(lens))
    g = torch.Generator().manual_seed(11)
    q = torch.randn(len(lens), 1, hq, d, generator=g).to(BF16)
    k = torch.randn(len(lens), 904, hkv, d, generator=g).to(BF16)
    v = torch.randn(len(lens), 904, hkv, d, generator=g).to(BF16)
    tol = {"rtol": 2.0**-7, "atol": 2.0**-7 * float(v.float().abs().max())}
    for b, n in enumerate(lens):
        k[b, n + 1 :] = float("nan")
        v[b, n + 1 :] = float("nan")
    mask = torch.ones(len(lens), 1, 1, dtype=torch.bool)
    full = _tiles_on_rows(q, k, v, cl, ql, mask, list(range(len(lens))), cfg)
    want = reference.gqa_attention(q, k, v, cl, ql)
    assert_faithful(full, want, **tol, what="rows of 3..57 splits vs reference")
    for b in range(len(lens)):
        assert_exact(_tiles_on_rows(q, k, v, cl, ql, mask, [b], cfg)[0], full[b],
                     what=f"a row of {splits[b]} splits alone vs in the batch")  # fmt: skip


def test_tma_loads_give_the_pointer_loads_bits():
    """Wide tiles load their committed K/V blocks through tensor descriptors (``TMA``, the
    default where the pool is packed): the same bits as pointer loads for every block, with NaN in
    the stale slots past each row's extent. A pool without the packed view (heads not next to the
    dims) or a head dim that is not a power of two takes the pointer loads."""
    from flashrt_kernels.attention.gqa_kernels import kv_descriptors
    from flashrt_kernels.testing import assert_exact

    hq, hkv, d, q_max, cap = 8, 2, 64, 12, 400
    cl, ql = _lens(300, 0, 150), _lens(12, 9, 5)  # 48 / 36 / 20 tile rows: wide, wide, narrow
    g = torch.Generator().manual_seed(5)
    q = torch.randn(3, q_max, hq, d, generator=g).to(BF16)
    k = torch.randn(3, cap, hkv, d, generator=g).to(BF16)
    v = torch.randn(3, cap, hkv, d, generator=g).to(BF16)
    for b in range(3):
        k[b, int(cl[b] + ql[b]) :] = float("nan")
        v[b, int(cl[b] + ql[b]) :] = float("nan")
    mask = torch.stack([random_tree_mask(q_max, 4, s) for s in range(3)])
    assert kv_descriptors(k, v, 64) is not None
    tma = _tiles_on_rows(q, k, v, cl, ql, mask, [0, 1, 2], None)
    ptr = _tiles_on_rows(q, k, v, cl, ql, mask, [0, 1, 2], {"wide": {"TMA": False}})
    assert not tma.isnan().any()
    assert_exact(tma, ptr, what="TMA-loaded wide tiles vs pointer loads")
    # heads outside the dims: no packed [slots, heads * d] view
    k_t = k.transpose(1, 2).contiguous().transpose(1, 2)
    v_t = v.transpose(1, 2).contiguous().transpose(1, 2)
    assert kv_descriptors(k_t, v_t, 64) is None
    assert_exact(_tiles_on_rows(q, k_t, v_t, cl, ql, mask, [0, 1, 2], None), tma,
                 what="a pool without the packed view")  # fmt: skip
    assert kv_descriptors(k[..., :48].contiguous(), v[..., :48].contiguous(), 64) is None
