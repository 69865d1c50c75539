"""The Indexer on synthetic decode chains: every step exact; the hazards of the research notes
(stale state after churn, degenerate lines, short rows in a long engine); graph replay."""

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from flashrt_dsv4_indexer import chains, config, reference, routing, state, topk_stage
from flashrt_dsv4_indexer.indexer import Indexer
from flashrt_dsv4_indexer.key_cache import PagedKeyCache
from flashrt_kernels.testing.assertions import assert_exact
from flashrt_kernels.testing.strategies import seeds, test_device

# thresholds scaled down so tiny chains exercise every tier
TINY_POLICY = routing.RoutingPolicy(min_assist_n=24, list_min_n=80, list_max_batch=2,
                                    counts_min_work=240)  # fmt: skip


def make(cfg, spec, device, **kw):
    blocks = chains.DecodeChain.cache_blocks(cfg, spec, cfg.block_size)
    cache = PagedKeyCache(blocks, cfg.block_size, cfg.head_dim, cfg.key_format, device)
    # on a CPU the top-K is flashrt-kernels' reference (its Triton kernels are tested there)
    kw.setdefault("topk_backend", "auto" if torch.device(device).type == "cuda" else "reference")
    ix = Indexer(cfg, cache, max_requests=64, **kw)
    return ix, chains.DecodeChain(cfg, spec, ix, device)


def run_chain(fmt, block, next_n, slots, steps, seed, churn=0.3, compact=0.2, device=None,
              lens=(20, 560)):  # fmt: skip
    device = device or test_device()
    cfg = config.tiny(fmt, block)
    spec = chains.ChainSpec(slots=slots, min_len=lens[0], max_len=lens[1], next_n=next_n, churn=churn,
                            compact=compact, seed=seed)  # fmt: skip
    ix, ch = make(cfg, spec, device, policy=TINY_POLICY)
    tiers = set()
    for _ in range(steps):
        st_ = ch.step()
        top = chains.drive(ix, st_, next_n)
        buf = ix.last_buffers
        _, want = topk_stage.exact_reference(buf.logits.cpu(), cfg.topk, buf.lengths.cpu())
        assert_exact(top.cpu(), want, f"step selection ({ix.last_tier})")
        tiers.add(ix.last_tier)
    return tiers


@given(fmt=st.sampled_from(["fp8", "fp4"]), block=st.sampled_from([32, 64, 128]),
       next_n=st.integers(1, 4), slots=st.integers(1, 4), seed=seeds())  # fmt: skip
@example(fmt="fp8", block=32, next_n=1, slots=4, seed=0)
@example(fmt="fp4", block=64, next_n=3, slots=2, seed=1)
def test_every_chain_step_is_exact(fmt, block, next_n, slots, seed):
    run_chain(fmt, block, next_n, slots, steps=5, seed=seed)


def test_chains_reach_every_tier():
    tiers = run_chain("fp8", 32, 1, 1, steps=3, seed=3, churn=0.0, compact=0.0, lens=(120, 280))
    tiers |= run_chain("fp8", 32, 1, 4, steps=4, seed=4)
    tiers |= run_chain("fp4", 32, 1, 2, steps=3, seed=5, churn=0.0, lens=(400, 560))
    assert {"rungs", "list", "counts"} <= tiers


def test_reference_path_equals_the_float64_specification():
    cfg = config.tiny("fp4", 32)
    spec = chains.ChainSpec(slots=3, min_len=20, max_len=400, next_n=2, churn=0.5, seed=5)
    ix, ch = make(cfg, spec, "cpu", policy=TINY_POLICY, logits_backend="reference",
                  topk_backend="reference")  # fmt: skip
    for _ in range(3):
        st_ = ch.step()
        top = chains.drive(ix, st_, 2)
        lens = reference.row_lengths(st_.seq_lens, 2, cfg.compress_ratio)
        from flashrt_dsv4_indexer.key_cache import hadamard_rotate, quantize_queries

        qc, w = quantize_queries(hadamard_rotate(st_.q), st_.weights)
        width = ix.last_buffers.logits.shape[1]
        ref = reference.indexer_logits(qc, w, ix.cache.codes, ix.cache.scales, "fp4",
                                       st_.block_table, lens, width).float()  # fmt: skip
        assert_exact(top, reference.topk(ref, cfg.topk, lens)[1])


# hazard 1: positional state ---------------------------------------------------------------------
def test_state_follows_requests_not_slots():
    cfg = config.tiny("fp8", 32)
    spec = chains.ChainSpec(slots=3, min_len=200, max_len=300, churn=0.0, seed=6)
    ix, ch = make(cfg, spec, "cpu", policy=TINY_POLICY)
    st_ = ch.step()
    chains.drive(ix, st_, 1)
    ids = st_.request_ids
    prev = {rid: ix.state.prev[ix.state.slots([rid])[0]].clone() for rid in ids}
    # the engine finishes the request in row 1 and compacts: a new request takes a freed row
    ch._finish(1)
    ch._compact()
    st2 = ch.step()
    new_rid = st2.request_ids[st2.new[0]]
    assert new_rid not in ids and new_rid not in ix.state
    ix.finish(st2.finished)
    assert ids[1] not in ix.state
    q, w, seq, host, bt, nids = chains.prefill_inputs(st2, 1)
    slot_new = ix.state.slots([new_rid])[0]
    assert ix.state.valid[slot_new] == 0 and (ix.state.prev[slot_new] == -1).all()
    assert ix.state.warm_count([slot_new]) == 0, "a new request must start cold"
    ix.prefill(q, w, seq, bt, nids, seq_lens_host=host)
    top = ix.decode_step(st2.q, st2.weights, st2.seq_lens, st2.block_table, st2.request_ids,
                         seq_lens_host=st2.seq_lens_host)  # fmt: skip
    for row, rid in enumerate(st2.request_ids):  # survivors kept their own state across rows
        if rid in prev:
            assert torch.equal(ix.state.prev[ix.state.slots([rid])[0]], top[row])


def test_finish_resets_and_ids_must_be_distinct():
    s = state.RequestState(4, 8, "cpu")
    (a,) = s.slots(["a"])
    s.prev[a] = 5
    s.valid[a] = 1
    s.mark_warm([a])
    s.finish(["a"])
    (b,) = s.slots(["b"])
    assert b == a and s.valid[b] == 0 and (s.prev[b] == -1).all() and s.warm_count([b]) == 0
    with pytest.raises(ValueError, match="distinct"):
        s.slots(["x", "x"])


# hazard 2: degenerate lines ---------------------------------------------------------------------
def test_degenerate_lines_fall_back_to_wide_guards():
    k = 16
    kth = torch.tensor([5.0, 5.0, 0.0, 3.0])
    top = torch.tensor([9.0, 9.0, 0.0, 7.0])
    lines = torch.tensor([[5.0, 5.0, 5.0], [5.0, 5.0001, 4.9999], [0.0, 0.0, 0.0], [6.0, 4.0, 2.0]])
    counts = torch.tensor(
        [[16, 16, 16], [16, 17, 18], [40, 40, 40], [8, 20, 50]], dtype=torch.int32
    )
    out = state.place_lines(lines, counts, kth, top, k, torch.ones(4, dtype=torch.bool))
    spread = (top - kth).clamp(min=1e-30)
    # pinned spreads (rows 0-1) and plateaus (row 2) -> guards scaled by the selection's spread
    for r in (0, 1, 2):
        want = kth[r] - torch.tensor(state.GUARDS) * spread[r].clamp(min=1e-3 * kth[r].abs())
        torch.testing.assert_close(out[r], want.float())
    assert (out[:2, 0] - out[:2, 2] >= 3.0 * spread[:2]).all(), "lines must not collapse"
    # a usable fit (row 3): lines below kth, ordered tightest first, at the target counts
    assert out[3, 0] <= kth[3] and out[3, 0] > out[3, 1] > out[3, 2]
    # after an upward drift the guards still admit: K values within the wide band
    scores = torch.linspace(5.0, 12.0, 100)  # everything drifted up past the old kth
    assert (scores >= out[0, 2]).sum() >= k


def test_cold_and_invalid_rows_get_lines_that_emit_nothing():
    out = state.place_lines(torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.int32),
                            torch.tensor([float("-inf"), 1.0]), torch.tensor([1.0, 2.0]), 4,
                            torch.tensor([True, False]))  # fmt: skip
    assert torch.isinf(out).all() and (out > 0).all()


# hazard 4: routing on live lengths ----------------------------------------------------------------
def test_short_rows_in_a_long_engine_route_on_live_lengths():
    assert routing.plan_tier([300, 500]) == "none"
    assert routing.plan_tier([300, 100_000]) == "rungs"  # the list tier is off by default
    with_list = routing.RoutingPolicy(list_max_batch=4)
    assert routing.plan_tier([300, 100_000], policy=with_list) == "list"
    assert routing.plan_tier([70_000] * 64) == "none"  # counts off; rungs measured slower here
    assert routing.plan_tier([70_000] * 3) == "rungs"  # batch * n <= rungs_max_work
    assert routing.plan_tier([262_144]) == "rungs"  # B = 1: the hint still paid (run 8)
    assert routing.plan_tier([131_072] * 4) == "none"  # hint-free clusters were as fast (run 8)
    assert routing.plan_tier([131_072] * 16) == "none"  # and so was the multi-launch path
    no_cap = routing.RoutingPolicy(rungs_max_work=None)
    assert routing.plan_tier([70_000] * 64, policy=no_cap) == "rungs"
    with_counts = routing.RoutingPolicy(counts_min_work=1 << 22)
    assert routing.plan_tier([70_000] * 64, policy=with_counts) == "counts"
    assert routing.plan_tier([4096] * 8) == "none"  # the CUDA select's one-block rows take no hint
    assert routing.plan_tier([32_768] * 8) == "none"
    assert routing.plan_tier([32_769] * 4) == "rungs"
    assert routing.plan_tier([100_000], warm_rows=0) == "none"
    cfg = config.tiny("fp8", 32)
    spec = chains.ChainSpec(slots=2, min_len=40, max_len=60, seed=7)
    ix, ch = make(cfg, spec, "cpu", policy=TINY_POLICY)
    st_ = ch.step()
    wide = torch.zeros(2, 4096, dtype=torch.int32)  # an engine sized for 128k keys a row
    wide[:, : st_.block_table.shape[1]] = st_.block_table
    st_.block_table = wide
    top = chains.drive(ix, st_, 1)
    assert ix.last_tier == "none"
    assert ix.last_buffers.logits.shape[1] <= 256, "the grid must follow the live lengths"
    _, want = topk_stage.exact_reference(ix.last_buffers.logits, cfg.topk, ix.last_buffers.lengths)
    assert_exact(top, want)


def test_device_lengths_need_host_lengths():
    cfg = config.tiny("fp8", 32)
    ix, ch = make(cfg, chains.ChainSpec(slots=1, seed=8), "cpu")
    st_ = ch.step()

    with pytest.raises(ValueError, match="seq_lens_host"):
        ix._host_lengths(torch.empty(1, device="meta"), None)
    assert ix._host_lengths(st_.seq_lens, None) == st_.seq_lens_host


def test_relu_plateau_selects_the_first_k_positions():
    cfg = config.tiny("fp8", 32)
    spec = chains.ChainSpec(slots=2, min_len=200, max_len=300, seed=9)
    ix, ch = make(cfg, spec, "cpu", policy=TINY_POLICY)
    st_ = ch.step()
    st_.weights.zero_()
    top = chains.drive(ix, st_, 1)
    assert torch.equal(top, torch.arange(cfg.topk, dtype=torch.int32).expand(2, -1))


# prefill: every context token's selection ----------------------------------------------------------
def _context_setup(cfg, counts, starts, device, seed=13):
    """A cache holding the keys of len(counts) requests up to their chunks' ends, the requests'
    block tables (pages shuffled over the pool) and the chunks' packed queries and weights."""
    block, fmt = cfg.block_size, cfg.key_format
    g = torch.Generator().manual_seed(seed)
    n_keys = [cfg.n_keys(s + c) for s, c in zip(starts, counts, strict=True)]
    pages = max(1, -(-max(n_keys) // block))
    pool = torch.randperm(len(counts) * pages + 3, generator=g)[: len(counts) * pages]
    table = pool.view(len(counts), pages).to(torch.int32).to(device)
    cache = PagedKeyCache(len(counts) * pages + 3, block, cfg.head_dim, fmt, device)
    topk_backend = "auto" if torch.device(device).type == "cuda" else "reference"
    ix = Indexer(cfg, cache, max_requests=64, topk_backend=topk_backend)
    for r, n in enumerate(n_keys):
        keys = torch.randn(n, cfg.head_dim, generator=g).to(device)
        ix.write_keys(table, torch.full((n,), r, device=device), torch.arange(n, device=device),
                      keys)  # fmt: skip
    total = sum(counts)
    q = torch.randn(total, cfg.n_heads, cfg.head_dim, generator=g).to(device)
    w = torch.randn(total, cfg.n_heads, generator=g).abs().to(device)
    return ix, table, q, w


def _check_context_topk(ix, table, q, w, counts, starts, chunk_tokens, every=1):
    """context_topk against each (every-th) token's own decode step (tier none, via prefill), and
    one logits chunk against chunks of ``chunk_tokens``."""
    got = ix.context_topk(q, w, table, counts, starts=starts, chunk_tokens=chunk_tokens)
    assert got.shape == (sum(counts), ix.config.topk)
    t = 0
    for r, (s, c) in enumerate(zip(starts, counts, strict=True)):
        for p in range(s, s + c):
            if t % every == 0:
                seq = torch.tensor([p + 1], device=q.device)
                want = ix.prefill(q[t : t + 1], w[t : t + 1], seq, table[r : r + 1],
                                  [("token", t)], seq_lens_host=[p + 1])  # fmt: skip
                assert_exact(got[t : t + 1].cpu(), want.cpu(), f"request {r}, position {p}")
                ix.finish([("token", t)])
            t += 1
    one = ix.context_topk(q, w, table, counts, starts=starts)  # a single logits chunk
    assert_exact(one.cpu(), got.cpu(), f"one chunk vs chunks of {chunk_tokens} tokens")
    return got


@pytest.mark.parametrize("fmt", ["fp8", "fp4"])
def test_context_topk_equals_each_tokens_decode_step(fmt):
    """Every prefill token's selection is the decode step's (tier none) for a row of its position
    + 1 tokens with its query: requests with and without a cached prefix (a chunk starting at
    position 70), contexts shorter than K keys (padding -1), several logits chunks."""
    counts, starts = [9, 40, 23], [0, 70, 3]
    cfg = config.tiny(fmt, 32)
    ix, table, q, w = _context_setup(cfg, counts, starts, test_device())
    got = _check_context_topk(ix, table, q, w, counts, starts, chunk_tokens=16)
    assert (got[0] == -1).sum() == cfg.topk - cfg.n_keys(1)  # position 0 sees no key


@pytest.mark.gpu
@pytest.mark.parametrize(("preset", "fmt"), [("v4-flash", "fp8"), ("v4-pro", "fp4")])
def test_context_topk_real_shapes_gpu(preset, fmt):
    """The same at real shapes: 64 heads, d = 128, K = 512 / 1024, a 6000-token context and a
    2000-token chunk after a 9000-token prefix, every 97th token checked."""
    cfg = config.preset(preset).with_(key_format=fmt)
    counts, starts = [6000, 2000], [0, 9000]
    ix, table, q, w = _context_setup(cfg, counts, starts, "cuda")
    _check_context_topk(ix, table, q, w, counts, starts, chunk_tokens=1500, every=97)


def test_prefill_bench_row_agrees_with_torch_on_the_cpu():
    """``flashrt dsv4-indexer bench --prefill``'s row (timings on a GPU only): every token's
    selection equals torch's top-K of the same e4m3 queries' logits at this seed (the logits
    and the top-K through the reference backends here: the kernels have their own tests)."""
    from flashrt_dsv4_indexer import bench

    for fmt in ("fp8", "fp4"):
        row = bench.prefill_row(config.tiny(fmt, 32), 300, device="cpu", backend="reference")
        assert (row["keys"], row["tokens_equal_to_torch"]) == (75, 300), row


def test_context_topk_errors_say_what_was_expected():
    cfg = config.tiny("fp8", 32)
    ix, table, q, w = _context_setup(cfg, [5, 6], [0, 0], "cpu")
    with pytest.raises(ValueError, match="must agree"):
        ix.context_topk(q, w, table, [11])
    with pytest.raises(ValueError, match=r"sum\(token_counts\) = 12"):
        ix.context_topk(q, w, table, [5, 7])
    with pytest.raises(ValueError, match=">= 0"):
        ix.context_topk(q, w, table, [5, 6], starts=[0, -1])
    with pytest.raises(ValueError, match="chunk_tokens must be >= 1, got 0"):
        ix.context_topk(q, w, table, [5, 6], chunk_tokens=0)
    with pytest.raises(ValueError, match="pages of 32"):
        ix.context_topk(q, w, table, [5, 6], starts=[0, 4000])
    assert ix.context_topk(q[:0], w[:0], table, [0, 0]).shape == (0, cfg.topk)


# CUDA graphs ----------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("preset", ["v4-flash", "v4-pro"])
def test_decode_step_graph_replay_is_bit_identical(preset):
    cfg = config.preset(preset)
    spec = chains.ChainSpec(slots=4, min_len=20_000, max_len=60_000, next_n=2, churn=0.0, seed=10)
    # 5k-15k keys: the default plan is the hint-free tier; v4-pro's policy captures the hinted one
    policy = (
        routing.RoutingPolicy(min_assist_n=2048) if preset == "v4-pro" else routing.DEFAULT_POLICY
    )
    ix, ch = make(cfg, spec, "cuda", policy=policy)
    graph = ix.capture(4, 2, ix.config.n_keys(spec.max_len + 64 * 2), q_dtype=torch.float32)
    assert graph.tier == ("rungs" if preset == "v4-pro" else "none")
    for _ in range(3):
        st_ = ch.step()
        chains.drive(ix, st_, 2) if st_.new else None
        saved = [t.clone() for t in (ix.state.lines, ix.state.prev, ix.state.kth)]
        eager = ix.decode_step(st_.q, st_.weights, st_.seq_lens, st_.block_table, st_.request_ids,
                               seq_lens_host=st_.seq_lens_host)  # fmt: skip
        eager_tier = ix.last_tier
        for t, s in zip((ix.state.lines, ix.state.prev, ix.state.kth), saved, strict=True):
            t.copy_(s)
        replay = graph.replay(st_.q, st_.weights, st_.seq_lens, st_.block_table, st_.request_ids,
                              seq_lens_host=st_.seq_lens_host)  # fmt: skip
        torch.cuda.synchronize()
        assert_exact(replay.cpu(), eager.cpu(), f"graph ({graph.tier}) vs eager ({eager_tier})")
        buf = graph.buf
        _, want = topk_stage.exact_reference(buf.logits, cfg.topk, buf.lengths)
        assert_exact(replay, want)


@pytest.mark.gpu
def test_capture_without_reserved_buffers_raises():
    cfg = config.preset("v4-flash")
    spec = chains.ChainSpec(slots=2, min_len=5000, max_len=6000, churn=0.0, seed=11)
    ix, ch = make(cfg, spec, "cuda")
    st_ = ch.step()
    chains.drive(ix, st_, 1)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with pytest.raises(RuntimeError, match="before CUDA-graph capture"):
        with torch.cuda.stream(s), torch.cuda.graph(g, stream=s):
            ix.reserve(3, 1, 8)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("preset", "fmt", "slots", "lens", "next_n"),
    [
        ("v4-flash", "fp8", 2, (260_000, 520_000), 1),  # list tier
        ("v4-pro", "fp4", 16, (20_000, 120_000), 2),  # rungs tier, MTP
        ("v4-flash", "fp8", 64, (250_000, 320_000), 1),  # counts tier
        ("v3.2", "fp8", 4, (1000, 9000), 4),  # short rows, K = 2048, MTP 4 (rungs here)
    ],
)
def test_real_chain_steps_are_exact_gpu(preset, fmt, slots, lens, next_n):
    cfg = config.preset(preset).with_(key_format=fmt)
    spec = chains.ChainSpec(slots=slots, min_len=lens[0], max_len=lens[1], next_n=next_n,
                            churn=0.2, compact=0.2, seed=12, steps_headroom=8)  # fmt: skip
    policy = routing.RoutingPolicy(min_assist_n=2048, list_max_batch=4, counts_min_work=1 << 22)
    ix, ch = make(cfg, spec, "cuda", policy=policy)
    for _ in range(3):
        st_ = ch.step()
        top = chains.drive(ix, st_, next_n)
        buf = ix.last_buffers
        _, want = topk_stage.exact_reference(buf.logits, cfg.topk, buf.lengths)
        assert_exact(top, want, f"{preset} step ({ix.last_tier})")
