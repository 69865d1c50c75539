"""The lossless options: ``attention_kernel="gqa_invariant"`` (query-invariant pool attention,
split into a tree launch and a causal launch when a step mixes trees with long prefill rows) and
``prefill_linear="batch_invariant"``; the ``lossless`` preset replays the same greedy replies with
and without the tree and at every batch size, bit for bit (bf16 on the GPU)."""

import pytest
import torch

from flashrt_activevln.data import synthetic_episodes
from flashrt_activevln.model.ops import INVARIANT_TREE, Ops
from flashrt_activevln.presets import Options, preset


def _mixed_step(seed, device="cpu", dtype=torch.bfloat16):
    """Three rows over one pool layer: a causal prefill row longer than ``INVARIANT_TREE``, a
    tree row and an empty row; q [B, H, Q, D] as the decoder passes it."""
    g = torch.Generator().manual_seed(seed)
    b, h, hkv, d, q, cap = 3, 4, 2, 16, INVARIANT_TREE + 6, 160
    k = torch.randn(b, cap, hkv, d, generator=g).to(device, dtype)
    v = torch.randn(b, cap, hkv, d, generator=g).to(device, dtype)
    qs = torch.randn(b, h, q, d, generator=g).to(device, dtype)
    lengths = torch.tensor([7, 30, 0], device=device)
    q_lens = torch.tensor([q, 5, 0], device=device)
    vis = torch.eye(q, dtype=torch.bool).repeat(b, 1, 1)
    vis[0] = torch.ones(q, q, dtype=torch.bool).tril()
    parents = [-1, 0, 0, 1, 2]  # a small tree: node i sees itself and its ancestors
    for i, p in enumerate(parents):
        if p >= 0:
            vis[1, i] |= vis[1, p]
    live = torch.arange(q)[None] < q_lens.cpu()[:, None]
    vis &= live[:, None, :]
    return qs, k, v, lengths, vis.to(device), q_lens, int(lengths.max()) + q


def test_mixed_step_splits_into_tree_and_causal_launches():
    """Each row's output is its own launch's (bit for bit) and faithful to the reference."""
    qs, k, v, lengths, vis, q_lens, extent = _mixed_step(0)
    scale = 0.25
    out = Ops(attention="gqa_invariant").attend_pool(qs, k, v, lengths, vis, extent, scale, q_lens)
    ref = Ops().attend_pool(qs, k, v, lengths, vis, extent, scale).float()
    from flashrt_kernels.attention import gqa_attention

    qq = qs.transpose(1, 2).contiguous()
    lens, ql = lengths.to(torch.int32), q_lens.to(torch.int32)
    causal = gqa_attention(qq, k, v, lens, ql * torch.tensor([1, 0, 0], dtype=torch.int32),
                           scale=scale, query_invariant=True)  # fmt: skip
    t = INVARIANT_TREE
    tree = gqa_attention(qq[:, :t].contiguous(), k, v, lens,
                         ql * torch.tensor([0, 1, 1], dtype=torch.int32),
                         tree_mask=vis[:, :t, :t], scale=scale, query_invariant=True)  # fmt: skip
    assert torch.equal(out[0], causal[0])
    assert torch.equal(out[1, :5], tree[1, :5])
    for r, n in ((0, int(q_lens[0])), (1, 5)):
        err = (out[r, :n].float() - ref[r, :n]).abs().max().item()
        assert err <= 2e-2, (r, err)


def test_invariant_attention_needs_query_lengths_for_long_steps():
    qs, k, v, lengths, vis, _, extent = _mixed_step(1)
    with pytest.raises(ValueError, match="needs q_lens"):
        Ops(attention="gqa_invariant").attend_pool(qs, k, v, lengths, vis, extent, 0.25)


def test_lossless_preset_and_option_checks():
    opt = preset("lossless")
    assert opt.attention_kernel == "gqa_invariant" and opt.prefill_linear == "batch_invariant"
    assert opt.grammar_tree_budget > 0 and opt.cuda_graphs
    with pytest.raises(ValueError, match="needs packed_prefill"):
        Options(attention_kernel="gqa_invariant")
    with pytest.raises(ValueError, match="prefill_linear"):
        Options(prefill_linear="fast")
    with pytest.raises(ValueError, match="prefill_linear"):
        Ops(prefill_linear="cublas")
    assert Ops(prefill_linear="batch_invariant").fused_weights


def test_starting_rows_draft_no_tree(make_engine, tiny64):
    """Under gqa_invariant a prefill row carries no tree (trees are short launches); rows inside
    a reply still draft theirs."""
    opt = preset("reference", dtype="float64", attention_kernel="gqa_invariant",
                 packed_prefill=True, grammar_tree_budget=8)  # fmt: skip
    eng = make_engine(tiny64, opt)
    from flashrt_activevln.runtime import _Row

    ep = synthetic_episodes(1, seed=0, mean_frames=2, height=60, width=80)[0]
    row = _Row(ep, seed=0, node=eng.trie.root, generator=torch.Generator())
    assert row.starting and eng._drafts(row) == ([], [])
    row.starting = False
    assert len(eng._drafts(row)[0]) > 0


@pytest.mark.gpu
def test_lossless_replies_identical_across_tree_and_batch(tiny64):
    """bf16 on the GPU: the lossless preset's greedy replies with the tree at B=3 equal those
    without the tree at B=1, frame for frame, and the tree saves forwards."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from flashrt_activevln.model import Qwen25VL
    from flashrt_activevln.runtime import Engine

    cfg, w64, proc = tiny64
    w = {k: t.to("cuda", torch.bfloat16) for k, t in w64.items()}
    episodes = synthetic_episodes(4, seed=3, mean_frames=4, min_frames=2)
    replies, forwards = {}, {}
    for budget, bs in ((16, 3), (0, 1), (16, 1)):
        opt = preset("lossless", grammar_tree_budget=budget, batch_size=bs,
                     constrain_to_grammar=True, max_new_tokens=24)  # fmt: skip
        eng = Engine(Qwen25VL(cfg, dict(w), Engine.ops_for(opt)), proc, opt)
        out = eng.replay(episodes)
        replies[budget, bs] = {(r.episode, r.frame): r.tokens for r in out}
        forwards[budget, bs] = eng.stats.forwards
    assert replies[16, 3] == replies[0, 1] == replies[16, 1]
    assert forwards[16, 1] < forwards[0, 1]
