"""The pieces of a text step that run inside its CUDA graph, on the CPU: the KV pool's flat-slot
moves (the deferred incremental commit, padded to a fixed count) leave the pool as the direct
commit does and touch nothing else; the indexed embedding equals the masked scatter; a graph's
inputs must keep their names."""

import pytest
import torch

from flashrt_activevln.model import Qwen25VL
from flashrt_activevln.model.ops import Ops


def _pool(model, rows, capacity, seed):
    pool = model.new_pool(rows, capacity)
    g = torch.Generator().manual_seed(seed)
    pool.k.copy_(torch.randn(pool.k.shape, generator=g, dtype=pool.k.dtype))
    pool.v.copy_(torch.randn(pool.v.shape, generator=g, dtype=pool.v.dtype))
    return pool


def _direct(pool, moves):
    """The commit written out slot by slot: gather every accepted slot, then write."""
    k, v = pool.k.clone(), pool.v.clone()
    for row, start, acc in moves:
        for i, a in enumerate(acc):
            pool.k[:, row, start + i] = k[:, row, start + a]
            pool.v[:, row, start + i] = v[:, row, start + a]


@pytest.mark.parametrize("size", [None, 12, 40])
def test_padded_moves_equal_the_direct_commit(tiny64, size):
    cfg, w, _ = tiny64
    model = Qwen25VL(cfg, w, Ops())
    moves = [(0, 3, [0, 2, 5]), (2, 0, [1, 2, 3, 7]), (1, 9, [0, 1]), (3, 4, [])]
    src, dst = model.new_pool(4, 20).move_slots(moves, size)
    assert src.size == (6 if size is None else size)  # moves already in place are left out
    got, want = _pool(model, 4, 20, 1), _pool(model, 4, 20, 1)
    got.move(torch.from_numpy(src), torch.from_numpy(dst))
    _direct(want, moves)
    assert torch.equal(got.k, want.k) and torch.equal(got.v, want.v)
    commit = _pool(model, 4, 20, 1)
    commit.commit(moves)
    assert torch.equal(commit.k, want.k) and torch.equal(commit.v, want.v)


def test_padding_without_moves_changes_nothing(tiny64):
    cfg, w, _ = tiny64
    model = Qwen25VL(cfg, w, Ops())
    pool = _pool(model, 2, 8, 2)
    before = pool.k.clone(), pool.v.clone()
    src, dst = pool.move_slots([(0, 2, [0, 1]), (1, 0, [])], 6)  # all in place: pads only
    pool.move(torch.from_numpy(src), torch.from_numpy(dst))
    assert torch.equal(pool.k, before[0]) and torch.equal(pool.v, before[1])
    with pytest.raises(ValueError, match="moves for a size"):
        pool.move_slots([(0, 0, [3, 4])], 1)


def test_indexed_embedding_equals_the_masked_scatter(tiny64):
    cfg, w, _ = tiny64
    model = Qwen25VL(cfg, w, Ops())
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, cfg.text.vocab_size, (3, 10), generator=g)
    mask = torch.rand(3, 10, generator=g) < 0.4
    n = int(mask.sum())
    image = torch.randn(n + 5, cfg.text.hidden_size, generator=g, dtype=torch.float64)
    index = torch.full((3, 10), -1, dtype=torch.long)
    index[mask] = torch.arange(n)
    want = model.embed(ids, image[:n], mask)
    assert torch.equal(model.embed_step(ids, index, image), want)  # rows past n never taken
    assert torch.equal(model.embed_step(ids, torch.full_like(index, -1), None), model.embed(ids))


def test_a_graph_keeps_its_input_names(tiny64):
    from flashrt_activevln.graphs import StepGraphs
    from flashrt_activevln.staging import Staging

    cfg, w, _ = tiny64
    model = Qwen25VL(cfg, w, Ops(attention="gqa"))
    pool = model.new_pool(2, 64)
    graphs = StepGraphs(model, pool, Staging("cpu"), 4, 0, None, True)
    graphs.capture_all([(4, 16)], constrained=False)
    x = {k: v for k, v in graphs.graphs[(4, 16)].inputs.items() if k != "vis"}
    with pytest.raises(ValueError, match="the graph has"):
        graphs.run(x, 16)
