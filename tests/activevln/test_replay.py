"""Batched replay on the CPU reference path in float64: tree speculation (greedy) gives the same
replies frame for frame as plain greedy decoding, at any batch size, with fewer forwards; a
reused row leaks nothing of its previous episode (its stale KV is poisoned with NaN)."""

import pytest
import torch

from flashrt_activevln.data import synthetic_episodes
from flashrt_activevln.presets import preset


def _replay(make_engine, tiny, episodes, **opts):
    opts.setdefault("max_new_tokens", 24)
    opt = preset("reference", dtype="float64", **opts)
    eng = make_engine(tiny, opt)
    out = eng.replay(episodes)
    return {(r.episode, r.frame): r.tokens for r in out}, eng


@pytest.fixture(scope="module")
def episodes():
    return synthetic_episodes(3, seed=0, mean_frames=4, height=60, width=80, min_frames=2)


@pytest.mark.parametrize("constrain", [True, False])
def test_tree_greedy_equals_plain_greedy(make_engine, tiny64, episodes, constrain):
    cap = 24 if constrain else 10
    plain, e0 = _replay(
        make_engine, tiny64, episodes, constrain_to_grammar=constrain, max_new_tokens=cap
    )
    assert len(plain) == sum(len(e.frames) for e in episodes)
    for budget, bs in ((16, 1), (32, 3)):
        tree, e1 = _replay(
            make_engine,
            tiny64,
            episodes,
            constrain_to_grammar=constrain,
            grammar_tree_budget=budget,
            batch_size=bs,
            max_new_tokens=cap,
        )
        assert tree == plain, (budget, bs)
    if constrain:  # grammatical replies: the tree must save forwards
        f0 = e0.stats.as_dict()["decode_forwards_per_reply"]
        f1 = e1.stats.as_dict()["decode_forwards_per_reply"]
        assert f1 * 2 <= f0, (f0, f1)


def test_a_step_budget_changes_no_reply(make_engine, tiny64, episodes):
    """``grammar_step_budget``: one budget over the rows' trees (the likeliest nodes first). The
    replies are plain greedy's, the trees hold at most that many nodes per step."""
    plain, _ = _replay(make_engine, tiny64, episodes, constrain_to_grammar=True)
    full, e_full = _replay(make_engine, tiny64, episodes, constrain_to_grammar=True,
                           grammar_tree_budget=16, batch_size=3)  # fmt: skip
    for cap in (4, 20):
        capped, eng = _replay(make_engine, tiny64, episodes, constrain_to_grammar=True,
                              grammar_tree_budget=16, batch_size=3, grammar_step_budget=cap)  # fmt: skip
        assert capped == plain == full, cap
        nodes = eng.stats.as_dict()["draft_nodes_per_forward"]
        assert 0 < nodes <= cap, (cap, nodes)
    assert e_full.stats.as_dict()["draft_nodes_per_forward"] > 4


def test_reused_row_leaks_no_kv(make_engine, tiny64, episodes):
    opt = preset("reference", dtype="float64", max_new_tokens=12, grammar_tree_budget=8)
    eng = make_engine(tiny64, opt)

    released = []

    def poison(row):
        released.append(row)
        eng.pool.k[:, row] = float("nan")
        eng.pool.v[:, row] = float("nan")

    eng.release_row = poison
    reused = {(r.episode, r.frame): r.tokens for r in eng.replay(episodes)}
    for ep in episodes[1:]:
        fresh, _ = _replay(make_engine, tiny64, [ep], max_new_tokens=12, grammar_tree_budget=8)
        for key, toks in fresh.items():
            assert reused[key] == toks, key
    assert released == [0, 0, 0]
    assert torch.isnan(eng.pool.k[:, 0]).all()  # the poison really was in the reused row


def test_packed_prefill_replies_equal_padded(make_engine, tiny64, episodes):
    """packed_prefill=True (live tokens only, back to back) replays the same replies as the
    padded forward, with tree speculation, at batch sizes 1 and 3."""
    for budget, bs in ((0, 1), (16, 3)):
        padded, _ = _replay(
            make_engine, tiny64, episodes, grammar_tree_budget=budget, batch_size=bs,
            constrain_to_grammar=True,
        )  # fmt: skip
        packed, _ = _replay(
            make_engine, tiny64, episodes, grammar_tree_budget=budget, batch_size=bs,
            constrain_to_grammar=True, packed_prefill=True,
        )  # fmt: skip
        assert packed == padded, (budget, bs)


def test_bucketed_graph_step_replies_equal_packed(make_engine, tiny64, episodes):
    """cuda_graphs=True pads each step to its token and query buckets (on the CPU the bucketed step
    runs eagerly): the padding tokens, the repeated non-live position and the padded verified
    positions change no reply, greedy or sampled (same seeds), at batch sizes 1 and 3."""
    for budget, bs, sample in ((0, 1, False), (16, 3, False), (8, 3, True)):
        opts = dict(grammar_tree_budget=budget, batch_size=bs, constrain_to_grammar=True,
                    packed_prefill=True, attention_kernel="gqa")  # fmt: skip
        if sample:
            opts.update(do_sample=True, temperature=0.8, top_p=0.9)
        packed, _ = _replay(make_engine, tiny64, episodes, **opts)
        bucketed, eng = _replay(make_engine, tiny64, episodes, cuda_graphs=True, **opts)
        assert bucketed == packed, (budget, bs, sample)
        assert eng.graphs is not None and eng.graphs.graphs  # the bucketed path ran


def test_cuda_graphs_option_needs_packed_gqa():
    with pytest.raises(ValueError, match="cuda_graphs"):
        preset("reference", cuda_graphs=True)
    with pytest.raises(ValueError, match="cuda_graphs"):
        preset("reference", cuda_graphs=True, packed_prefill=True)
    preset("reference", cuda_graphs=True, packed_prefill=True, attention_kernel="gqa")


def test_packed_forward_matches_padded_and_writes_only_live_slots(tiny64):
    """The packed decoder forward: live tokens' hidden states and pool K/V as the padded forward's
    (float64), padded output slots zero, and no pool slot written past a row's live tokens."""
    from flashrt_activevln.model import Qwen25VL
    from flashrt_activevln.model.ops import Ops

    cfg, w, _ = tiny64
    model = Qwen25VL(cfg, w, Ops())
    g = torch.Generator().manual_seed(0)
    b, q = 3, 7
    q_lens = torch.tensor([7, 0, 3])
    lengths = torch.tensor([5, 0, 2])
    ids = torch.randint(0, cfg.text.vocab_size, (b, q), generator=g)
    pos = (lengths[:, None] + torch.arange(q))[None].expand(3, b, q).contiguous()
    vis = torch.ones(q, q, dtype=torch.bool).tril().repeat(b, 1, 1)
    pools = []
    outs = []
    for ql in (None, q_lens):
        pool = model.new_pool(b, 32)
        pool.k.fill_(float("nan"))
        pool.v.fill_(float("nan"))
        for r in range(b):  # the committed prefix; every other slot is stale (NaN)
            pool.k[:, r, : int(lengths[r])] = 0.25
            pool.v[:, r, : int(lengths[r])] = -0.5
        outs.append(model.decode(model.embed(ids), pos, pool, lengths, vis, ql))
        pools.append(pool)
    live = torch.arange(q)[None] < q_lens[:, None]
    torch.testing.assert_close(outs[1][live], outs[0][live], rtol=1e-12, atol=1e-12)
    assert bool((outs[1][~live] == 0).all())
    for r in range(b):
        lo, hi = int(lengths[r]), int(lengths[r] + q_lens[r])
        for t in ("k", "v"):
            got, want = getattr(pools[1], t)[:, r], getattr(pools[0], t)[:, r]
            torch.testing.assert_close(got[:, lo:hi], want[:, lo:hi], rtol=1e-12, atol=1e-12)
            assert bool(got[:, hi:].isnan().all()), (r, t)  # nothing written past the live tokens


def test_vision_ahead_changes_no_reply(make_engine, tiny64, episodes):
    """``vision_ahead``: frames embedded ahead of their turn (behind an earlier step's forward,
    in fewer vision calls) give the same replies, greedy and sampled (the ahead call before and
    after the acceptance), on the padded, packed and bucketed paths; the frames did run ahead."""
    cases = [dict(grammar_tree_budget=16, batch_size=3, constrain_to_grammar=True),
             dict(grammar_tree_budget=8, batch_size=2, do_sample=True, temperature=0.8,
                  top_p=0.9),
             dict(grammar_tree_budget=16, batch_size=3, constrain_to_grammar=True,
                  packed_prefill=True, attention_kernel="gqa", cuda_graphs=True,
                  gpu_preprocess=True)]  # fmt: skip
    for opts in cases:
        base, e0 = _replay(make_engine, tiny64, episodes, **opts)
        for depth in (1, 3):
            ahead, eng = _replay(make_engine, tiny64, episodes, vision_ahead=depth, **opts)
            assert ahead == base, (opts, depth)
            stats = eng.stats.as_dict()
            assert stats["vision_ahead_frames"] > 0, (opts, depth)
            calls, calls0 = eng.stats.vision_calls, e0.stats.vision_calls
            assert calls < calls0 if depth == 3 else calls <= calls0, (opts, depth, calls, calls0)
            assert not eng._embeds  # every frame embedded ahead was used
            assert sum(stats["ms_per_frame"].values()) > 0
        # a stream of its own for the vision ahead: nothing to move on the CPU, the same replies
        streamed, _ = _replay(make_engine, tiny64, episodes, vision_ahead=3, vision_stream=True,
                              **opts)  # fmt: skip
        assert streamed == base, opts


@pytest.mark.gpu
def test_vision_stream_changes_no_reply_on_the_gpu(tiny64):
    """bf16 on the GPU, the fast preset's kernels and graphs: the vision ahead on a stream of its
    own (the next forward waits for a call only where it takes one of its frames) gives the
    same replies, bit for bit, as on the step's stream, greedy and sampled; the frames did run
    there and every one was used."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from flashrt_activevln.model import Qwen25VL
    from flashrt_activevln.runtime import Engine

    cfg, w64, proc = tiny64
    w = {k: t.to("cuda", torch.bfloat16) for k, t in w64.items()}
    episodes = synthetic_episodes(5, seed=5, mean_frames=5, min_frames=2)
    for sampling in ({}, {"do_sample": True, "temperature": 0.8, "top_p": 0.9}):
        replies = {}
        for ahead, stream in ((2, False), (2, True), (4, True)):
            opt = preset("fast", batch_size=3, vision_ahead=ahead, vision_stream=stream,
                         constrain_to_grammar=True, max_new_tokens=24, **sampling)  # fmt: skip
            eng = Engine(Qwen25VL(cfg, dict(w), Engine.ops_for(opt)), proc, opt)
            out = eng.replay(episodes)
            replies[ahead, stream] = {(r.episode, r.frame): r.tokens for r in out}
            assert len(out) == sum(len(e.frames) for e in episodes)  # a reply for every frame
            assert eng.stats.vision_ahead_frames > 0 and not eng._embeds
            assert (eng._vision_stream is not None) == stream
        # (ahead 4 embeds frames in other image batches, which cuBLAS may round otherwise: its
        # replies are only checked for completeness)
        assert replies[2, True] == replies[2, False], sampling


def test_bit_row_masks_are_the_bool_masks(make_engine, tiny64, episodes):
    """With the gqa kernel and the packed forward the engine sends each step's mask as each row's
    causal chain and its tree's bit rows (no [B, Q, Q] mask): on every step of a replay with
    trees (nodes deeper than one among them) they unpack to the bool mask over the live queries
    and slots, and the replies are the bool masks' (float64: the reference attention)."""
    from flashrt_kernels.attention.reference import unpack_tree_mask

    for budget, bs, graphs in ((8, 3, False), (16, 2, True)):
        opt = preset("reference", dtype="float64", grammar_tree_budget=budget, batch_size=bs,
                     constrain_to_grammar=True, packed_prefill=True, attention_kernel="gqa",
                     cuda_graphs=graphs, max_new_tokens=24)  # fmt: skip
        eng = make_engine(tiny64, opt)
        assert eng.bit_rows
        inputs, steps = eng._inputs, []

        def spy(rows, turns, chains, chain_pos, drafts, inputs=inputs, eng=eng, steps=steps):
            host, verified = inputs(rows, turns, chains, chain_pos, drafts)
            eng.bit_rows = False
            plain, _ = inputs(rows, turns, chains, chain_pos, drafts)
            eng.bit_rows = True
            steps.append((host, plain, drafts))
            return host, verified

        eng._inputs = spy
        bits = {(r.episode, r.frame): r.tokens for r in eng.replay(episodes)}
        deep = 0
        for host, plain, drafts in steps:
            assert "vis" not in host and "tree_bits" not in plain
            q = host["ids"].shape[1]
            got = unpack_tree_mask(host["tree_bits"], q, host["chain"])
            for r, n in enumerate(host["q_lens"].tolist()):
                assert torch.equal(got[r, :n, :n], plain["vis"][r, :n, :n])
            deep += sum(p >= 0 for _, parents in drafts for p in parents)
        assert deep > 0, "no tree deeper than one node: the bit rows' ancestors went untested"
        want, _ = _replay(make_engine, tiny64, episodes, grammar_tree_budget=budget,
                          batch_size=bs, constrain_to_grammar=True, packed_prefill=True)  # fmt: skip
        assert bits == want, (budget, bs, graphs)
