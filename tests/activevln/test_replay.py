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
