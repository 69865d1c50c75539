"""Grammar trie over real token ids, the online prior, option validation, replay-set folders."""

import json

import numpy as np
import pytest

from flashrt_activevln.data import JsonlLog, read_replay_set, synthetic_episodes, write_replay_set
from flashrt_activevln.grammar import GrammarTrie, parse_actions, replies
from flashrt_activevln.presets import Options, preset
from flashrt_activevln.tiny_tokenizer import build_tiny_tokenizer


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()[0]


@pytest.mark.parametrize("dataset,n", [("r2r", 10 + 100 + 1000), ("rxr", 1110)])
def test_every_reply_is_a_trie_path(tok, dataset, n):
    eos = tok.token_to_id("<|im_end|>")
    trie = GrammarTrie.from_tokenizer(tok, dataset, eos)
    rs = replies(dataset)
    assert len(rs) == n
    for r in rs[::7]:
        node = trie.root
        for t in tok.encode(r, add_special_tokens=False).ids + [eos]:
            node = trie.step(node, t)
            assert node is not None, r
        assert node.terminal and not node.children
    assert trie.step(trie.root, tok.token_to_id(" kitchen")) is None


def test_draft_is_connected_and_prior_learns(tok):
    eos = tok.token_to_id("<|im_end|>")
    trie = GrammarTrie.from_tokenizer(tok, "r2r", eos)
    seen = tok.encode("turn left 30 degrees, stop", add_special_tokens=False).ids + [eos]
    for _ in range(5):
        trie.observe(seen)
    nodes, parents = trie.draft(trie.root, len(seen) + 4)
    for i, p in enumerate(parents):
        assert p < i
        assert (nodes[i].parent is trie.root) if p == -1 else (nodes[i].parent is nodes[p])
    assert [n.token for n in nodes[: len(seen)]] == seen  # the learned reply ranks first
    assert trie.draft(None, 8) == ([], [])


def _learned_trie(tok):
    eos = tok.token_to_id("<|im_end|>")
    trie = GrammarTrie.from_tokenizer(tok, "r2r", eos)
    for k, text in enumerate(["turn left 30 degrees, stop", "move forward 50cm", "stop",
                              "turn right 15 degrees, move forward 25cm"]):  # fmt: skip
        for _ in range(k + 1):
            trie.observe(tok.encode(text, add_special_tokens=False).ids + [eos])
    return trie


def _score(trie, start, node):
    p = 1.0
    while node is not start:
        p *= trie.child_prob(node.parent, node)
        node = node.parent
    return p


def test_draft_rows_without_a_binding_total_is_draft(tok):
    trie = _learned_trie(tok)
    mid = trie.nodes[3]
    starts = [trie.root, mid, None, trie.root, mid]  # shared start nodes, an empty row
    budgets = [32, 16, 8, 0, 5]
    got = trie.draft_rows(starts, budgets, 10**6)
    assert got == [trie.draft(n, b) for n, b in zip(starts, budgets, strict=True)]


@pytest.mark.parametrize("total", [1, 7, 40, 63])
def test_draft_rows_takes_the_likeliest_nodes_over_the_rows(tok, total):
    """Each row keeps a prefix of its own draft; the prefixes hold ``total`` nodes in all, and
    no row's next node scores above the least likely node taken (a greedy global choice)."""
    trie = _learned_trie(tok)
    starts = [trie.root, trie.nodes[3], trie.root, trie.nodes[9]]
    budgets = [32, 32, 12, 32]
    got = trie.draft_rows(starts, budgets, total)
    solo = [trie.draft(n, b) for n, b in zip(starts, budgets, strict=True)]
    taken, least, best_left = 0, 1.0, 0.0
    for (nodes, parents), (sn, sp), start in zip(got, solo, starts, strict=True):
        k = len(nodes)
        assert nodes == sn[:k] and parents == sp[:k]
        taken += k
        least = min([least] + [_score(trie, start, n) for n in nodes])
        if k < len(sn):
            best_left = max(best_left, _score(trie, start, sn[k]))
    assert taken == min(total, sum(len(sn) for sn, _ in solo))
    assert best_left <= least * (1 + 1e-12)
    with pytest.raises(ValueError, match="start nodes"):
        trie.draft_rows(starts, budgets[:2], total)


def test_parse_actions():
    assert parse_actions("turn left 15 degrees, move forward 75cm, stop") == [
        ("left", 15),
        ("forward", 75),
        ("stop",),
    ]
    assert parse_actions("turn left 60 degrees", "r2r") == []
    assert parse_actions("turn left 60 degrees", "rxr") == [("left", 60)]


@pytest.mark.parametrize(
    "kw,msg",
    [
        ({"grammar_tree_budget": -1}, "grammar_tree_budget"),
        ({"grammar_step_budget": 5000}, "grammar_step_budget"),
        ({"batch_size": 0}, "batch_size"),
        ({"attention_kernel": "flash"}, "attention_kernel"),
        ({"packed_prefill": "yes"}, "packed_prefill"),
        ({"temperature": 0.5}, "do_sample"),
        ({"do_sample": True, "top_p": 0.0}, "top_p"),
        ({"dataset": "reverie"}, "dataset"),
        ({"vision_stream": True}, "vision_ahead"),
        ({"vision_stream": 1, "vision_ahead": 2}, "vision_stream"),
    ],
)
def test_invalid_options_rejected(kw, msg):
    with pytest.raises(ValueError, match=msg):
        Options(**kw)


def test_presets():
    assert preset("fast").grammar_tree_budget > 0 and preset("reference").grammar_tree_budget == 0
    with pytest.raises(ValueError, match="unknown preset"):
        preset("turbo")
    with pytest.raises(ValueError, match="unknown option"):
        preset("fast", tree=3)


def test_replay_set_roundtrip_and_log(tmp_path):
    eps = synthetic_episodes(2, seed=4, mean_frames=3, height=48, width=64)
    write_replay_set(tmp_path / "set", eps)
    back = read_replay_set(tmp_path / "set")
    assert [e.id for e in back] == [e.id for e in eps]
    assert [e.instruction for e in back] == [e.instruction for e in eps]
    from flashrt_activevln.runtime import load_frame

    assert np.array_equal(load_frame(back[1].frames[-1]), eps[1].frames[-1])
    log = JsonlLog(tmp_path / "log.jsonl")

    class R:
        episode, frame, row, text, tokens, actions, forwards = (
            "e",
            0,
            0,
            "stop",
            [1],
            [("stop",)],
            2,
        )

    log(R)
    log.close()
    assert json.loads((tmp_path / "log.jsonl").read_text())["actions"] == [["stop"]]
    with pytest.raises(FileNotFoundError):
        read_replay_set(tmp_path / "missing")


def test_synthetic_geometry():
    eps = synthetic_episodes(4, seed=0, mean_frames=3)
    assert eps[0].frames[0].shape == (480, 640, 3) and eps[0].frames[0].dtype == np.uint8
