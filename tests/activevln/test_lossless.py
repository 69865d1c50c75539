"""The lossless options: ``attention_kernel="gqa_invariant"`` (query-invariant pool attention,
split into a causal launch over long rows' chains and a tree launch over gathered trees when a
step holds rows longer than the tree launch) and
``prefill_linear="batch_invariant"``; the ``lossless`` preset replays the same greedy replies with
and without the tree and at every batch size, bit for bit (bf16 on the GPU)."""

import pytest
import torch

from flashrt_activevln.data import synthetic_episodes
from flashrt_activevln.model.ops import INVARIANT_TREE, Ops
from flashrt_activevln.presets import Options, preset


def _mixed_step(seed, device="cpu", dtype=torch.bfloat16):
    """Four rows over one pool layer, q [B, H, Q, D] as the decoder passes it: a causal prefill
    row longer than ``INVARIANT_TREE``, a prefill chain followed by a tree (longer than that in
    all), a short tree row and an empty row; and each row's chain length."""
    g = torch.Generator().manual_seed(seed)
    b, h, hkv, d, q, cap = 4, 4, 2, 16, INVARIANT_TREE + 8, 180
    k = torch.randn(b, cap, hkv, d, generator=g).to(device, dtype)
    v = torch.randn(b, cap, hkv, d, generator=g).to(device, dtype)
    qs = torch.randn(b, h, q, d, generator=g).to(device, dtype)
    lengths = torch.tensor([7, 30, 12, 0], device=device)
    chain = torch.tensor([q - 2, INVARIANT_TREE + 1, 1, 0])
    parents = [-1, 0, 0, 1, 2]  # node i sees itself, its ancestors and its row's chain
    q_lens = chain + torch.tensor([0, len(parents), len(parents), 0])
    vis = torch.eye(q, dtype=torch.bool).repeat(b, 1, 1)
    for r in range(b):
        c = int(chain[r])
        vis[r, :c, :c] = torch.ones(c, c, dtype=torch.bool).tril()
        if r in (1, 2):
            for i, p in enumerate(parents):
                vis[r, c + i, :c] = True
                if p >= 0:
                    vis[r, c + i] |= vis[r, c + p]
    live = torch.arange(q)[None] < q_lens[:, None]
    vis &= live[:, None, :]
    extent = int(lengths.max()) + q
    return qs, k, v, lengths, vis.to(device), q_lens.to(device), chain.to(device), extent


def test_mixed_step_splits_into_tree_and_causal_launches():
    """Each query's output is that of the launch holding it, bit for bit: the long rows' chains
    from one causal launch; the short row, and the long row's tree (its chain then committed
    keys), from one tree launch; and every live query is faithful to the reference."""
    qs, k, v, lengths, vis, q_lens, chain, extent = _mixed_step(0)
    scale = 0.25
    out = Ops(attention="gqa_invariant").attend_pool(qs, k, v, lengths, vis, extent, scale, q_lens,
                                                     chain)  # fmt: skip
    ref = Ops().attend_pool(qs, k, v, lengths, vis, extent, scale).float()
    from flashrt_kernels.attention import gqa_attention

    qq = qs.transpose(1, 2).contiguous()
    lens, ql = lengths.to(torch.int32), q_lens.to(torch.int32)
    t = INVARIANT_TREE
    causal = gqa_attention(qq, k, v, lens, ql * torch.tensor([1, 0, 0, 0], dtype=torch.int32),
                           scale=scale, query_invariant=True)  # fmt: skip
    assert torch.equal(out[0], causal[0])
    c1 = int(chain[1])
    chain1 = gqa_attention(qq[1:2, :c1].contiguous(), k[1:2], v[1:2], lens[1:2],
                           torch.tensor([c1], dtype=torch.int32), scale=scale,
                           query_invariant=True)  # fmt: skip
    assert torch.equal(out[1, :c1], chain1[0])
    n = int(q_lens[1]) - c1
    tree1 = gqa_attention(qq[1:2, c1 : c1 + n].contiguous(), k[1:2], v[1:2], lens[1:2] + c1,
                          torch.tensor([n], dtype=torch.int32),
                          tree_mask=vis[1:2, c1 : c1 + n, c1 : c1 + n].contiguous(),
                          scale=scale, query_invariant=True)  # fmt: skip
    assert torch.equal(out[1, c1 : c1 + n], tree1[0])
    short = gqa_attention(qq[2:3, :t].contiguous(), k[2:3], v[2:3], lens[2:3], ql[2:3],
                          tree_mask=vis[2:3, :t, :t], scale=scale, query_invariant=True)  # fmt: skip
    assert torch.equal(out[2, : int(q_lens[2])], short[0, : int(q_lens[2])])
    for r in range(3):
        m = int(q_lens[r])
        err = (out[r, :m].float() - ref[r, :m]).abs().max().item()
        assert err <= 2e-2, (r, err)


def test_invariant_attention_needs_query_lengths_for_long_steps():
    qs, k, v, lengths, vis, _, _, extent = _mixed_step(1)
    with pytest.raises(ValueError, match="needs q_lens"):
        Ops(attention="gqa_invariant").attend_pool(qs, k, v, lengths, vis, extent, 0.25)


def test_lossless_preset_and_option_checks():
    opt = preset("lossless")
    assert opt.attention_kernel == "gqa_invariant" and opt.prefill_linear == "batch_invariant"
    assert opt.grammar_tree_budget > 0 and opt.cuda_graphs
    with pytest.raises(ValueError, match="needs packed_prefill"):
        Options(attention_kernel="gqa_invariant")
    with pytest.raises(ValueError, match="at most 63 nodes"):
        preset("lossless", grammar_tree_budget=64)
    with pytest.raises(ValueError, match="prefill_linear"):
        Options(prefill_linear="fast")
    with pytest.raises(ValueError, match="prefill_linear"):
        Ops(prefill_linear="cublas")
    assert Ops(prefill_linear="batch_invariant").fused_weights


def test_presets_send_chains_and_tree_bit_rows():
    """Both kernel presets send each row's chain and tree bit rows, not bool [B, Q, Q] masks; the
    reference attention, the padded forward and tree-less replays keep the bool mask."""
    from flashrt_activevln.runtime import uses_bit_rows

    assert uses_bit_rows(preset("fast")) and uses_bit_rows(preset("lossless"))
    assert not uses_bit_rows(preset("fast", grammar_tree_budget=0))
    assert not uses_bit_rows(preset("fast", grammar_tree_budget=65))
    assert not uses_bit_rows(preset("reference", grammar_tree_budget=16))


def test_lossless_replay_identical_across_tree_and_batch_cpu(monkeypatch):
    """bf16 on the CPU with the kernels' torch references (the interpreter would take many
    minutes): the lossless preset's runtime (a causal launch over prefill chains, trees gathered
    per row behind them, bucketed steps) replays with the tree at B=3, trees on prefill rows
    included (and with the vision ahead), the greedy replies it replays without the tree at B=1,
    with far fewer forwards.
    The kernels' own bits are the GPU test's below."""
    from flashrt_activevln.engine_setup import random_engine

    monkeypatch.setenv("TRITON_INTERPRET", "0")  # backend "auto" then takes the references

    episodes = synthetic_episodes(3, seed=3, mean_frames=3, min_frames=2, height=60, width=80)
    replies, forwards = {}, {}
    for budget, bs, ahead in ((16, 3, 0), (0, 1, 0), (16, 1, 0), (16, 3, 2)):
        opt = preset("lossless", grammar_tree_budget=budget, batch_size=bs, vision_ahead=ahead,
                     constrain_to_grammar=True, max_new_tokens=24)  # fmt: skip
        eng = random_engine("tiny", opt, "cpu")
        out = eng.replay(episodes)
        replies[budget, bs, ahead] = {(r.episode, r.frame): r.tokens for r in out}
        forwards[budget, bs] = eng.stats.forwards
    assert len(replies[0, 1, 0]) == sum(len(e.frames) for e in episodes)
    assert replies[16, 3, 0] == replies[0, 1, 0] == replies[16, 1, 0] == replies[16, 3, 2]
    assert 2 * forwards[16, 1] < forwards[0, 1]


@pytest.mark.gpu
def test_lossless_replies_identical_across_tree_and_batch(tiny64):
    """bf16 on the GPU: the lossless preset's greedy replies with the tree at B=3 equal those
    without the tree at B=1, frame for frame (and with the vision ahead), and the tree saves
    forwards."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from flashrt_activevln.model import Qwen25VL
    from flashrt_activevln.runtime import Engine

    cfg, w64, proc = tiny64
    w = {k: t.to("cuda", torch.bfloat16) for k, t in w64.items()}
    episodes = synthetic_episodes(4, seed=3, mean_frames=4, min_frames=2)
    replies, forwards = {}, {}
    for budget, bs, ahead in ((16, 3, 0), (0, 1, 0), (16, 1, 0), (16, 3, 2)):
        opt = preset("lossless", grammar_tree_budget=budget, batch_size=bs, vision_ahead=ahead,
                     constrain_to_grammar=True, max_new_tokens=24)  # fmt: skip
        eng = Engine(Qwen25VL(cfg, dict(w), Engine.ops_for(opt)), proc, opt)
        out = eng.replay(episodes)
        replies[budget, bs, ahead] = {(r.episode, r.frame): r.tokens for r in out}
        forwards[budget, bs, ahead] = eng.stats.forwards
    # the vision ahead embeds frames in other image batches: the same bits (batch-invariant tower)
    assert replies[16, 3, 0] == replies[0, 1, 0] == replies[16, 1, 0] == replies[16, 3, 2]
    assert forwards[16, 1, 0] < forwards[0, 1, 0]


@pytest.mark.gpu
def test_lossless_bit_row_masks_give_the_bool_masks_bits(tiny64):
    """bf16 on the GPU: the lossless preset's steps with bit-row masks (chains and tree bit rows,
    the launch split built once a forward) and with bool [B, Q, Q] masks give the same greedy
    replies, frame for frame (the query-invariant kernel's bits do not depend on the mask's
    form). The fast preset promises no such thing: its kernels are faithful only, and a compiler
    may contract the two forms' score arithmetic differently."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from flashrt_activevln.model import Qwen25VL
    from flashrt_activevln.runtime import Engine

    cfg, w64, proc = tiny64
    w = {k: t.to("cuda", torch.bfloat16) for k, t in w64.items()}
    episodes = synthetic_episodes(4, seed=5, mean_frames=4, min_frames=2)
    replies = []
    for bit_rows in (True, False):
        opt = preset("lossless", batch_size=3, grammar_tree_budget=16, constrain_to_grammar=True,
                     max_new_tokens=24)  # fmt: skip
        eng = Engine(Qwen25VL(cfg, dict(w), Engine.ops_for(opt)), proc, opt)
        eng.bit_rows = bit_rows
        replies.append({(r.episode, r.frame): r.tokens for r in eng.replay(episodes)})
    assert replies[0] == replies[1]


def test_lossless_bit_rows_replay_on_the_cpu(monkeypatch):
    """The lossless preset's runtime end to end with bit-row masks (bf16 on the CPU with the
    kernels' torch references): the replies of the bool masks, with the tree at B = 3 and
    without it at B = 1. (The tiny model's replies hardly depend on the tree's masks; the masks
    themselves are compared by the test below.)"""
    from flashrt_activevln.engine_setup import random_engine

    monkeypatch.setenv("TRITON_INTERPRET", "0")  # backend "auto" then takes the references
    episodes = synthetic_episodes(3, seed=3, mean_frames=3, min_frames=2, height=60, width=80)
    replies = {}
    for budget, bs, bit_rows in ((16, 3, True), (16, 3, False), (0, 1, True)):
        opt = preset("lossless", grammar_tree_budget=budget, batch_size=bs,
                     constrain_to_grammar=True, max_new_tokens=24)  # fmt: skip
        eng = random_engine("tiny", opt, "cpu")
        eng.bit_rows = bit_rows
        replies[budget, bs, bit_rows] = {
            (r.episode, r.frame): r.tokens for r in eng.replay(episodes)
        }
    assert replies[16, 3, True] == replies[16, 3, False] == replies[0, 1, True]


@pytest.mark.parametrize("nq", [40, 100])
def test_invariant_steps_from_bit_rows_equal_the_bool_masks(nq):
    """The lossless preset's launch split, built from each row's chain and tree bit rows (what
    the engine sends), equals the split built from the bool [B, Q, Q] mask: the same launches
    and, over every live query and slot of the tree launch, the same mask."""
    from flashrt_activevln.model.ops import invariant_steps
    from flashrt_kernels.attention.properties import random_tree_mask
    from flashrt_kernels.attention.reference import pack_tree_mask, unpack_tree_mask

    rows = [(min(nq - 20, 80), 15), (1, 20), (30, 0), (0, 0), (nq - 40, 37)]
    b = len(rows)
    mask = torch.zeros(b, nq, nq, dtype=torch.bool)
    bits = torch.randint(-(2**62), 2**62, (b, nq))  # noise wherever bits must not matter
    for r, (c, n) in enumerate(rows):
        mask[r, :c, :c] = torch.ones(c, c).tril().bool()
        if n:
            tree = random_tree_mask(n, 6, r)
            mask[r, c : c + n, :c] = True
            mask[r, c : c + n, c : c + n] = tree
            bits[r, c : c + n] = pack_tree_mask(tree[None])[0]
    q_lens = torch.tensor([c + n for c, n in rows], dtype=torch.int32)
    chains = torch.tensor([c for c, _ in rows], dtype=torch.int32)
    want = invariant_steps(mask, q_lens, chains, nq)
    got = invariant_steps(bits, q_lens, chains, nq)
    for name in ("causal_q", "offset", "index"):
        a, g = getattr(want, name), getattr(got, name)
        assert (a is None and g is None) or torch.equal(a, g), name
    t = got.tree_mask.shape[1]
    unpacked = unpack_tree_mask(got.tree_mask, t)
    held = q_lens - (0 if got.offset is None else got.offset)
    for r in range(b):
        n = int(held[r])
        assert torch.equal(unpacked[r, :n, :n], want.tree_mask[r, :n, :n]), r
