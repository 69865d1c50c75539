"""CUDA graphs (``graphs.py``): a captured and replayed decode step (with the previous step's
commit and image rows) gives the eager step's logits and greedy choices bit for bit (bf16, the fast kernels: batch-invariant linears and the pool
attention kernel, whose bits depend on neither the padded query count nor the row count), for
the capturing call and for a replay with other inputs; the replayed vision tower gives the eager
tower's embeddings bit for bit."""

import pytest
import torch

from flashrt_activevln import graphs as graphs_module
from flashrt_activevln.graphs import StepGraphs, VisionGraphs, all_buckets, buckets
from flashrt_activevln.model import Qwen25VL
from flashrt_activevln.model.ops import Ops


def _cuda_model(tiny64, ops):
    """The tiny model in bf16 on the GPU (the test skips without one)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    cfg, w64, _ = tiny64
    return Qwen25VL(cfg, {k: v.to("cuda", torch.bfloat16) for k, v in w64.items()}, ops)


def _step(cfg, b, q, seed):
    g = torch.Generator().manual_seed(seed)
    q_lens = torch.randint(1, q + 1, (b,), generator=g)
    q_lens[0] = q
    lengths = torch.randint(8, 40, (b,), generator=g)
    ids = torch.randint(0, cfg.text.vocab_size, (b, q), generator=g)
    pos = (lengths[:, None] + torch.arange(q))[None].expand(3, b, q).contiguous()
    vis = torch.rand(b, q, q, generator=g) < 0.5
    vis |= torch.eye(q, dtype=torch.bool)
    vis &= torch.ones(q, q, dtype=torch.bool).tril()
    img = torch.zeros(b, q, dtype=torch.bool)
    img[0, 1:4] = True  # row 0 carries three image rows
    moves = [(r, int(lengths[r]) - 5, [1, 3]) for r in range(b)]  # the last step's commit
    return {"ids": ids, "pos": pos, "lengths": lengths, "vis": vis, "q_lens": q_lens,
            "img": img}, moves  # fmt: skip


def _pad(x, q_b, tokens, max_verify):
    """The step at bucket shapes, as ``Engine._inputs`` pads it."""
    b, q = x["ids"].shape
    ids = torch.zeros(b, q_b, dtype=torch.long)
    ids[:, :q] = x["ids"]
    image_index = torch.full((b, q_b), -1, dtype=torch.long)
    image_index[:, :q][x["img"]] = torch.arange(int(x["img"].sum()))
    pos = torch.zeros(3, b, q_b, dtype=torch.long)
    pos[:, :, :q] = x["pos"]
    vis = torch.eye(q_b, dtype=torch.bool).repeat(b, 1, 1)
    vis[:, :q, :q] = x["vis"]
    lens = x["q_lens"]
    live = (torch.arange(q_b)[None] < lens[:, None]).reshape(-1).nonzero()[:, 0]
    free = (torch.arange(q_b)[None] >= lens[:, None]).reshape(-1).nonzero()[0]
    live = torch.cat([live, free.expand(tokens - live.numel())])
    verify = [r * q_b + j for r in range(b) for j in range(int(lens[r]))]
    verify += [0] * (max_verify - len(verify))
    return {"ids": ids, "image_index": image_index, "pos": pos, "lengths": x["lengths"],
            "vis": vis, "q_lens": lens, "live": live, "verify": torch.tensor(verify)}  # fmt: skip


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_captured_decode_step_is_bit_identical_to_eager(tiny64, device):
    """The captured step (the last step's commit, the embedding with image rows, the decoder,
    the LM head, the choices) against the same work done eagerly with the direct commit and
    the masked-scatter embedding, for the capturing call and for a replay (on the CPU the
    bucketed step runs eagerly in float64: the padding and the in-step commit checked)."""
    from flashrt_activevln.staging import Staging

    dev = torch.device(device)
    cfg = tiny64[0]
    if device == "cpu":
        model = Qwen25VL(cfg, tiny64[1], Ops())
    else:
        model = _cuda_model(tiny64, Ops(rms_norm="kernel", attention="gqa",
                                        decode_linear="batch_invariant"))  # fmt: skip
    b, q = 3, 9
    pool = model.new_pool(b, 128)
    torch.manual_seed(0)
    pool.k.normal_()
    pool.v.normal_()
    max_verify, max_moves = b * q, 2 * b + 3
    graphs = StepGraphs(model, pool, Staging(dev), max_verify, max_moves, None, True, 8)
    for seed in (1, 2):  # the capturing call, then a replay with other inputs
        x, moves = _step(cfg, b, q, seed)
        image = torch.randn(3, cfg.text.hidden_size, device=dev).to(model.dtype)
        tokens, q_b = buckets(int(x["q_lens"].sum()), q, b)
        host = _pad(x, q_b, tokens, max_verify)
        host["move_src"], host["move_dst"] = (torch.from_numpy(a)
                                              for a in pool.move_slots(moves, max_moves))  # fmt: skip
        k0, v0 = pool.k.clone(), pool.v.clone()
        got_logits, got_choices = graphs.run(host, 40 + q_b, image)
        got_k = pool.k.clone()
        pool.k.copy_(k0)
        pool.v.copy_(v0)
        pool.commit(moves)
        e = {k: v.to(dev) for k, v in x.items()}
        live = (torch.arange(q, device=dev)[None] < e["q_lens"][:, None]).reshape(-1)
        live = live.nonzero()[:, 0]
        embeds = model.embed(e["ids"], image, e["img"])
        hidden = model.decode(embeds, e["pos"], pool, e["lengths"], e["vis"], e["q_lens"],
                              40 + q, live)  # fmt: skip
        want = model.logits(hidden.reshape(b * q, -1)[live])
        n = live.numel()
        assert torch.equal(got_logits[:n], want), seed
        assert torch.equal(got_choices[:n], want.argmax(-1)), seed
        for r in range(b):  # the committed prefix as the direct commit left it
            lo = int(x["lengths"][r])
            assert torch.equal(got_k[:, r, :lo], pool.k[:, r, :lo]), (seed, r)


@pytest.mark.gpu
def test_replayed_vision_tower_is_bit_identical_to_eager(tiny64):
    dev = torch.device("cuda")
    cfg = tiny64[0]
    model = _cuda_model(tiny64, Ops(rms_norm="kernel", vision_attention="segmented"))
    m = cfg.vision.spatial_merge_size
    grids = [(1, 4 * m, 6 * m)] * 2  # two images of 4 x 6 merged units
    n = sum(t * h * w for t, h, w in grids)
    graphs = VisionGraphs(model)
    for seed in (1, 2):
        g = torch.Generator().manual_seed(seed)
        pixels = torch.randn(n, cfg.vision.patch_dim, generator=g).to(dev)
        got = graphs.run(pixels, grids).clone()
        assert torch.equal(got, model.vision(pixels, grids)), seed


@pytest.mark.parametrize("coarser", [(8, 16), (16,), ()])
@pytest.mark.parametrize("rows,queries", [(1, 40), (3, 70), (8, 200)])
def test_all_buckets_covers_every_step_shape(rows, queries, coarser, monkeypatch):
    """``all_buckets`` (what ``capture_graphs`` captures) holds the bucket of every step of at
    most ``queries`` queries per row, and a bucket holds its step, for the default token steps
    and the finer ones the A/B tool tries (this test runs on any machine)."""
    monkeypatch.setattr(graphs_module, "COARSER_PAST", coarser)
    found = set(all_buckets(rows, queries))
    for q in range(1, queries + 1):
        for t in range(1, rows * q + 1):
            t_b, q_b = buckets(t, q, rows)
            assert (t_b, q_b) in found, (t, q)
            assert t <= t_b <= rows * q_b and q <= q_b, (t, q, t_b, q_b)


@pytest.mark.gpu
def test_graphs_captured_ahead_give_the_same_replies(tiny64):
    """``Engine.capture_graphs`` captures every bucket before the replay: the replay then
    captures nothing and replies as a replay that captured its graphs as it went."""
    _cuda_model(tiny64, Ops())  # skips without CUDA
    from flashrt_activevln.data import synthetic_episodes
    from flashrt_activevln.presets import preset
    from flashrt_activevln.runtime import Engine

    cfg, w64, proc = tiny64
    w = {k: t.to("cuda", torch.bfloat16) for k, t in w64.items()}
    episodes = synthetic_episodes(4, seed=2, mean_frames=3, min_frames=2)
    opt = preset("fast", batch_size=3, grammar_tree_budget=8, constrain_to_grammar=True)
    replies = []
    for ahead in (False, True):
        eng = Engine(Qwen25VL(cfg, dict(w), Engine.ops_for(opt)), proc, opt)
        if ahead:
            assert eng.capture_graphs(episodes) > 0
        out = eng.replay(episodes)
        replies.append({(r.episode, r.frame): r.tokens for r in out})
        if ahead:
            assert eng.stats.graph_captures == 0
    assert replies[0] == replies[1]


def test_frames_through_the_vision_graph_give_the_same_replies(make_engine, tiny64):
    """With cuda_graphs and gpu_preprocess the frames go through ``VisionGraphs.run_frames``
    (the preprocessing in front of the tower; eager on the CPU): the same replies as the
    preprocessed pixels through the tower, float64."""
    from flashrt_activevln.data import synthetic_episodes
    from flashrt_activevln.presets import preset

    episodes = synthetic_episodes(3, seed=4, mean_frames=3, height=60, width=80, min_frames=2)
    replies = []
    for graphs in (False, True):
        opt = preset("reference", dtype="float64", batch_size=2, grammar_tree_budget=8,
                     constrain_to_grammar=True, packed_prefill=True, attention_kernel="gqa",
                     gpu_preprocess=True, cuda_graphs=graphs, max_new_tokens=16)  # fmt: skip
        eng = make_engine(tiny64, opt)
        if graphs:
            eng.vision_graphs.run = None  # the frames path must not fall back to pixels
        replies.append({(r.episode, r.frame): r.tokens for r in eng.replay(episodes)})
    assert replies[0] == replies[1]


@pytest.mark.gpu
def test_replayed_frames_graph_is_bit_identical_to_eager(tiny64):
    """``run_frames``: uint8 frames copied into the graph, preprocessed and run through the tower
    inside it, against the eager preprocessing and tower, for the capture and a replay."""
    from flashrt_activevln.frames import pinned_copy

    cfg, _, proc = tiny64
    model = _cuda_model(tiny64, Ops(rms_norm="kernel", vision_attention="segmented"))
    graphs = VisionGraphs(model, proc)
    for seed in (1, 2):
        g = torch.Generator().manual_seed(seed)
        frames = [torch.randint(0, 256, (60, 80, 3), generator=g, dtype=torch.uint8)
                  for _ in range(3)]  # fmt: skip
        got, grid = graphs.run_frames([pinned_copy(f.numpy()) for f in frames])
        pixels, want_grid = proc.gpu_preprocess_batch(torch.stack(frames).cuda())
        assert grid == want_grid
        assert torch.equal(got, model.vision(pixels, [grid] * 3)), seed


def test_capture_splits_are_even():
    from flashrt_activevln.graphs import splits

    assert splits(36, 4) == {8, 17, 26}
    assert splits(32, 4) == {7, 15, 23}
    assert splits(2, 4) == {0}
    assert splits(5, 1) == frozenset()
    for layers in range(1, 40):
        for pieces in range(1, 6):
            cuts = sorted(splits(layers, pieces))
            bounds = [-1, *cuts, layers - 1]
            sizes = [b - a for a, b in zip(bounds, bounds[1:], strict=False)]
            size = -(-layers // pieces)  # every piece but the last holds this many layers
            assert sizes[:-1] == [size] * (len(sizes) - 1), (layers, pieces, sizes)
            assert 0 < sizes[-1] <= size and len(sizes) <= pieces, (layers, pieces, sizes)
