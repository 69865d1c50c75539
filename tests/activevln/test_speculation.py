"""Exact acceptance: greedy tree verification follows the argmax path; tree sampling has plain
sampling's output distribution (chi-square tests over seeded draws)."""

import math

import pytest
import torch

from flashrt_activevln.data import synthetic_episodes
from flashrt_activevln.presets import preset
from flashrt_activevln.speculation import (
    Sampling,
    constrain,
    greedy_choices,
    penalize,
    target_probs,
    verify_greedy,
    verify_sample,
)


def chi2_critical(dof: int, z: float = 3.72) -> float:
    """Wilson-Hilferty upper quantile of chi-square (z = 3.72: p about 1e-4)."""
    a = 2.0 / (9 * dof)
    return dof * (1 - a + z * math.sqrt(a)) ** 3


# A tree over a 6-token vocabulary: root children 0, 1; node0 (tok 2) children 2, 3; node1 (tok 4)
# child 4 (tok 2); node4 (tok 2) is a leaf.
TOKENS = [2, 4, 0, 5, 2]
PARENTS = [-1, -1, 0, 0, 1]


def _exact(logits, s, history):
    """Plain sampling's probability of every sequence the tree step can emit: walk the tree; at
    each node, a token that is not a drafted child ends the step (it is the bonus)."""
    children = {-1: [], **{i: [] for i in range(len(TOKENS))}}
    for i, p in enumerate(PARENTS):
        children[p].append(i)
    out = {}

    def walk(node, path, prob):
        row = node + 1
        p = target_probs(
            penalize(logits[row], history + [TOKENS[i] for i in path], s.repetition_penalty), s
        )
        drafted = {TOKENS[c]: c for c in children[node]}
        for tok in range(logits.shape[1]):
            q = prob * float(p[tok])
            if q == 0:
                continue
            if tok in drafted:
                walk(drafted[tok], path + [drafted[tok]], q)
            else:
                out[tuple(TOKENS[i] for i in path) + (tok,)] = q

    walk(-1, [], 1.0)
    return out


@pytest.mark.parametrize(
    "s",
    [
        Sampling(True, 1.0, 1.0, 1.0),
        Sampling(True, 0.7, 0.9, 1.0),
        Sampling(True, 1.3, 0.8, 1.5),  # per-path repetition penalty
    ],
)
def test_tree_sampling_distribution_equals_plain(s):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(len(TOKENS) + 1, 6, generator=g, dtype=torch.float64) * 1.5
    logits[:, 2] += 1.0  # make the drafted tokens likely enough to be accepted often
    history = [1, 3]
    exact = _exact(logits, s, history)
    assert abs(sum(exact.values()) - 1) < 1e-9
    n = 6000
    counts: dict = {}
    gen = torch.Generator().manual_seed(1)
    for _ in range(n):
        acc, bonus = verify_sample(logits, TOKENS, PARENTS, s, gen, history)
        seq = tuple(TOKENS[i] for i in acc) + (bonus,)
        assert seq in exact, seq
        counts[seq] = counts.get(seq, 0) + 1
    # pool rare outcomes into one cell so every expected count is >= 5
    stat, dof, rare_o, rare_e = 0.0, -1, 0, 0.0
    for seq, p in exact.items():
        e, o = n * p, counts.get(seq, 0)
        if e < 5:
            rare_o, rare_e = rare_o + o, rare_e + e
            continue
        stat += (o - e) ** 2 / e
        dof += 1
    if rare_e > 0:
        stat += (rare_o - rare_e) ** 2 / max(rare_e, 1e-12)
        dof += 1
    assert stat < chi2_critical(dof), (stat, dof)


def test_greedy_follows_argmax_path():
    logits = torch.full((len(TOKENS) + 1, 6), -1.0, dtype=torch.float64)
    logits[0, 2] = 5  # root -> tok 2 (node 0)
    logits[1, 5] = 5  # node 0 -> tok 5 (node 3)
    logits[4, 1] = 5  # node 3 -> tok 1: not drafted: the bonus
    assert verify_greedy(greedy_choices(logits).tolist(), TOKENS, PARENTS) == ([0, 3], 1)
    logits[0, 2], logits[0, 3] = -1, 5  # root argmax undrafted: nothing accepted
    assert verify_greedy(greedy_choices(logits).tolist(), TOKENS, PARENTS) == ([], 3)


@pytest.mark.parametrize("seed", range(20))
def test_constrained_greedy_equals_masked_argmax(seed):
    """The gathered argmax over allowed tokens picks what argmax over a -inf-masked vocabulary
    picks, ties included (small integer logits make ties common); pad-only rows: unconstrained."""
    g = torch.Generator().manual_seed(seed)
    rows, vocab, width = 12, 40, 5
    logits = torch.randint(-3, 3, (rows, vocab), generator=g).to(torch.float32)
    allowed = torch.full((rows, width), -1, dtype=torch.long)
    masked = logits.clone()
    for r in range(rows):
        n = int(torch.randint(0, width + 1, (), generator=g))
        if n:
            kids = torch.randperm(vocab, generator=g)[:n].sort().values
            allowed[r, :n] = kids
            masked[r] = float("-inf")
            masked[r, kids] = logits[r, kids]
    assert torch.equal(greedy_choices(logits, allowed), masked.argmax(-1))
    assert torch.equal(constrain(logits, allowed), masked)


def test_engine_tree_sampling_matches_plain_sampling(make_engine, tiny64):
    """Two-sample chi-square over the first reply token of many one-frame episodes (each
    episode draws from its own seeded generator), tree vs no tree."""
    eps = synthetic_episodes(150, seed=3, mean_frames=1, height=28, width=28, max_frames=1)
    hist = []
    for budget in (0, 12):
        opt = preset(
            "reference",
            dtype="float64",
            do_sample=True,
            temperature=1.0,
            top_p=0.95,
            max_new_tokens=3,
            grammar_tree_budget=budget,
            constrain_to_grammar=True,
            batch_size=8,
            seed=budget + 1,
        )
        out = make_engine(tiny64, opt).replay(eps)
        hist.append([tuple(r.tokens[:2]) for r in out])
    cats = sorted(set(hist[0]) | set(hist[1]))
    a = [hist[0].count(c) for c in cats]
    b = [hist[1].count(c) for c in cats]
    stat, dof = 0.0, -1
    for x, y in zip(a, b, strict=True):
        if x + y >= 5:
            stat += (x - y) ** 2 / (x + y)
            dof += 1
    assert dof >= 1
    assert stat < chi2_critical(dof), (stat, dof, cats, a, b)
