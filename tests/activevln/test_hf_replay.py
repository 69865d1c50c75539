"""The whole multi-turn runtime against HF transformers generate (test oracle only): float64,
unconstrained greedy, B = 2 with the tree; every frame HF can replay gets the same reply."""

import pytest

from flashrt_activevln.data import synthetic_episodes
from flashrt_activevln.presets import preset

pytest.importorskip("transformers")


def test_runtime_replies_equal_hf_generate(make_engine, tiny64):
    from flashrt_activevln.hf_baseline import hf_model, replay_hf

    eps = synthetic_episodes(2, seed=5, mean_frames=3, min_frames=3, height=60, width=80)
    opt = preset(
        "reference", dtype="float64", max_new_tokens=6, batch_size=2, grammar_tree_budget=8
    )
    eng = make_engine(tiny64, opt)
    ours = {(r.episode, r.frame): r.tokens for r in eng.replay(eps)}
    hf, times = replay_hf(hf_model(eng.model.cfg, eng.model.w), eng.proc, eps, ours)
    assert len(hf) >= 3 and len(times) == len(hf)
    assert any(frame > 0 for _, frame in hf)  # later turns (history in the KV) are compared
    for key, toks in hf.items():
        assert toks == ours[key], key
