"""The reference path against HF transformers' Qwen2_5_VLForConditionalGeneration (test oracle
only) on a tiny random checkpoint written by our writer and read by both loaders.

Bound: float64 logits agree to 1e-9 absolute (both run the same float32 RMSNorm / rotary
arithmetic as HF defines it; only matmul order differs), and greedy tokens are identical."""

import pytest
import torch

from flashrt_activevln.config import tiny
from flashrt_activevln.model import Ops, Qwen25VL
from flashrt_activevln.weights import load_checkpoint, write_random_checkpoint

transformers = pytest.importorskip("transformers")

BOUND = 1e-9


def _sequence(cfg, grids, seed):
    g = torch.Generator().manual_seed(seed)
    ids, pix = [], []
    for t, h, w in grids:
        ids += torch.randint(0, cfg.text.vocab_size - 8, (3,), generator=g).tolist()
        ids += [cfg.vision_start_token_id] + [cfg.image_token_id] * (t * h * w // 4)
        ids += [cfg.vision_end_token_id]
        pix.append(torch.randn(t * h * w, cfg.vision.patch_dim, generator=g, dtype=torch.float64))
    ids += torch.randint(0, cfg.text.vocab_size - 8, (5,), generator=g).tolist()
    return ids, torch.cat(pix)


def _hf_logits(model, cfg, ids, pix, grids):
    t = torch.tensor([ids])
    mm = (t == cfg.image_token_id).int()
    out = model(
        input_ids=t,
        pixel_values=pix,
        image_grid_thw=torch.tensor(grids),
        mm_token_type_ids=mm,
        use_cache=False,
    )
    return out.logits[0]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    cfg = tiny()
    path = write_random_checkpoint(tmp_path_factory.mktemp("ckpt"), cfg, seed=3, std=0.2)
    hf = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(
        str(path), dtype=torch.float64, attn_implementation="sdpa"
    ).eval()
    cfg2, w = load_checkpoint(path, dtype=torch.float64)
    assert cfg2 == cfg
    return cfg, hf, Qwen25VL(cfg, w)


@pytest.mark.parametrize(
    "grids", [[(1, 8, 6)], [(1, 4, 4)], [(1, 10, 14), (1, 6, 8)], [(1, 12, 8)]]
)
def test_logits_match_hf(checkpoint, grids):
    cfg, hf, ours = checkpoint
    ids, pix = _sequence(cfg, grids, seed=len(grids) * 7 + grids[0][1])
    with torch.no_grad():
        ref = _hf_logits(hf, cfg, ids, pix, grids)
        got = ours.full_logits(ids, pix, grids)
    err = (got - ref).abs().max().item()
    assert err <= BOUND, err
    assert torch.equal(got.argmax(-1), ref.argmax(-1))


def test_vision_matches_hf(checkpoint):
    cfg, hf, ours = checkpoint
    grids = [(1, 10, 14), (1, 6, 8)]
    _, pix = _sequence(cfg, grids, seed=1)
    with torch.no_grad():
        ref = hf.model.visual(pix, grid_thw=torch.tensor(grids)).pooler_output
        got = ours.vision(pix, grids)
    assert (got - ref).abs().max().item() <= BOUND


def test_greedy_tokens_match_hf(checkpoint):
    cfg, hf, ours = checkpoint
    grids = [(1, 8, 6)]
    ids, pix = _sequence(cfg, grids, seed=5)
    a, b = list(ids), list(ids)
    with torch.no_grad():
        for _ in range(6):
            a.append(int(_hf_logits(hf, cfg, a, pix, grids)[-1].argmax()))
            b.append(int(ours.full_logits(b, pix, grids)[-1].argmax()))
    assert a == b


def test_float32_logits_match_hf(tmp_path):
    """float32: same math in another order (SDPA vs our softmax attention): bound 1e-4 absolute
    on logits of magnitude ~6 (measured 1.4e-5)."""
    cfg = tiny()
    path = write_random_checkpoint(tmp_path, cfg, seed=3, std=0.2)
    hf = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(
        str(path), dtype=torch.float32
    ).eval()
    _, w = load_checkpoint(path, dtype=torch.float32)
    grids = [(1, 8, 6)]
    ids, pix = _sequence(cfg, grids, seed=1)
    with torch.no_grad():
        ref = _hf_logits(hf, cfg, ids, pix.float(), grids)
        got = Qwen25VL(cfg, w).full_logits(ids, pix.float(), grids)
    assert (got - ref).abs().max().item() <= 1e-4
    assert torch.equal(got.argmax(-1), ref.argmax(-1))


def test_kernel_options_are_faithful_in_bf16(tmp_path):
    """attention_kernel="gqa" + vision_kernel="segmented" (flashrt_kernels' ops; on a CPU their
    reference or the interpreter): bf16 logits stay as close to the float64 reference as the bf16 reference path
    is (within 2x its error), greedy tokens of this sequence identical."""
    from flashrt_activevln.model import Ops

    cfg = tiny()
    path = write_random_checkpoint(tmp_path, cfg, seed=3, std=0.2)
    grids = [(1, 8, 6)]
    ids, pix = _sequence(cfg, grids, seed=1)
    _, w16 = load_checkpoint(path, dtype=torch.bfloat16)
    _, w64 = load_checkpoint(path, dtype=torch.float64)
    with torch.no_grad():
        exact = Qwen25VL(cfg, w64).full_logits(ids, pix, grids)
        ref = Qwen25VL(cfg, w16).full_logits(ids, pix, grids).double()
        kernels = Ops(attention="gqa", vision_attention="segmented")
        gqa = Qwen25VL(cfg, w16, kernels).full_logits(ids, pix, grids).double()
    e_ref = (ref - exact).abs().max().item()
    e_gqa = (gqa - exact).abs().max().item()
    assert e_gqa <= 2 * e_ref + 1e-3, (e_gqa, e_ref)
    assert torch.equal(gqa.argmax(-1), exact.argmax(-1))


def test_vision_mlp_padding_is_the_same_function(tiny64):
    """An intermediate size that is not a multiple of 16 is padded with zeros (``pad_mlp``): the
    padded tower gives the unpadded one's embeddings (float64), and ``unpad_mlp`` restores the
    checkpoint's tensors exactly."""
    from dataclasses import replace

    from flashrt_activevln.model.vision import VisionPlan, pad_mlp, unpad_mlp, vision_forward

    cfg, w, _ = tiny64
    vc = replace(cfg.vision, intermediate_size=cfg.vision.intermediate_size - 3)
    g = torch.Generator().manual_seed(5)
    w = dict(w)
    n = vc.intermediate_size
    for i in range(vc.depth):
        p = f"visual.blocks.{i}.mlp."
        for name in ("gate_proj.weight", "gate_proj.bias", "up_proj.weight", "up_proj.bias"):
            w[p + name] = w[p + name][:n].clone()
        w[p + "down_proj.weight"] = w[p + "down_proj.weight"][:, :n].clone()
    padded = pad_mlp(w, vc)
    assert padded["visual.blocks.0.mlp.gate_proj.weight"].shape[0] % 16 == 0
    back = unpad_mlp(padded, vc)
    assert all(torch.equal(back[k], w[k]) for k in w)
    grid = (1, 4, 6)
    pix = torch.randn(24, w["visual.patch_embed.proj.weight"][0].numel(), generator=g).double()
    plan = VisionPlan(vc, [grid], "cpu")
    a = vision_forward(w, vc, pix, plan, Ops())
    b = vision_forward(padded, vc, pix, plan, Ops())
    assert (a - b).abs().max().item() <= 1e-12
