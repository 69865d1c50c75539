"""Kernel options of the fast preset on a decode step in bf16: a row's hidden states do not
depend on which other rows share the step (batch invariance), and stay faithful to the
reference options. (On this CPU the reference ops are row-invariant at these sizes as well;
the invariance check is meant for the kernels' GPU paths, where cuBLAS is not.)"""

import pytest
import torch

from flashrt_activevln.config import tiny
from flashrt_activevln.model import Ops, Qwen25VL
from flashrt_activevln.weights import random_state

FAST = Ops(
    rms_norm="kernel",
    attention="gqa",
    vision_attention="segmented",
    decode_linear="batch_invariant",
)


def _decode_step(model, rows, seed):
    """A committed prefix of 20 random tokens per row, then one step of 1 pending token + a
    3-node tree; returns row 0's hidden states."""
    g = torch.Generator().manual_seed(seed)
    cfg = model.cfg.text
    pool = model.new_pool(rows, 64)
    n = 20
    pre = torch.randint(0, cfg.vocab_size, (rows, n), generator=g)
    pre[0] = torch.arange(n) % cfg.vocab_size  # row 0 is the same in every batch
    pos = torch.arange(n).expand(3, rows, n)
    causal = torch.ones(n, n, dtype=torch.bool).tril().expand(rows, n, n)
    zeros = torch.zeros(rows, dtype=torch.long)
    model.decode(model.embed(pre), pos, pool, zeros, causal)
    ids = torch.randint(0, cfg.vocab_size, (rows, 4), generator=g)
    ids[0] = torch.tensor([3, 5, 7, 9])
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    depth = torch.tensor([0, 1, 1, 2])
    p = (n + depth).expand(3, rows, 4)
    h = model.decode(model.embed(ids), p, pool, torch.full((rows,), n), tree.expand(rows, 4, 4))
    return h[0]


def test_fast_kernels_batch_invariant_and_faithful():
    cfg = tiny()
    w = random_state(cfg, seed=2, std=0.2, dtype=torch.bfloat16)
    fast = Qwen25VL(cfg, w, FAST)
    one, three, eight = (_decode_step(fast, b, seed=b) for b in (1, 3, 8))
    assert torch.equal(one, three) and torch.equal(one, eight)
    ref = _decode_step(Qwen25VL(cfg, w, Ops()), 1, seed=1).float()
    w64 = {k: v.double() for k, v in w.items()}
    exact = _decode_step(Qwen25VL(cfg, w64, Ops()), 1, seed=1)
    e_ref = (ref.double() - exact).abs().max().item()
    e_fast = (one.double() - exact).abs().max().item()
    assert e_fast <= 2 * e_ref + 1e-2, (e_fast, e_ref)


def test_fused_projections_equal_separate_ones():
    """fuse_projections adds the q|k|v and gate|up weights without copies of the separate ones
    (they become views); the fused q|k|v launch is bit-equal to three batch-invariant linears,
    and the fused SwiGLU rounds once: faithful to the separate path."""
    from flashrt_activevln.model.text import GATE_UP, QKV, fuse_projections

    cfg = tiny()
    w = random_state(cfg, seed=3, std=0.2, dtype=torch.bfloat16)
    fw = fuse_projections(w, cfg.text)
    p = "model.layers.0."
    for n in ("self_attn.q_proj.weight", "mlp.up_proj.weight"):
        assert torch.equal(fw[p + n], w[p + n])
        assert (
            fw[p + n].untyped_storage().data_ptr()
            == fw[p + (QKV if "attn" in n else GATE_UP)].untyped_storage().data_ptr()
        )
    h = torch.randn(3, 5, cfg.text.hidden_size, generator=torch.Generator().manual_seed(0))
    h = h.to(torch.bfloat16)
    t = cfg.text
    sizes = (t.num_heads * t.head_dim, t.num_kv_heads * t.head_dim, t.num_kv_heads * t.head_dim)
    biases = [fw[p + f"self_attn.{n}_proj.bias"] for n in "qkv"]
    fused = FAST.qkv(h, fw[p + QKV], sizes, biases)
    for n, got in zip("qkv", fused, strict=True):
        want = FAST.text_linear(
            h, fw[p + f"self_attn.{n}_proj.weight"], fw[p + f"self_attn.{n}_proj.bias"], True
        )
        assert torch.equal(got, want), n
    g = FAST.text_linear(h, fw[p + "mlp.gate_proj.weight"], None, True)
    u = FAST.text_linear(h, fw[p + "mlp.up_proj.weight"], None, True)
    exact = torch.nn.functional.silu(g.float()) * u.float()
    got = FAST.gate_up_swiglu(h, fw[p + GATE_UP]).float()
    sep = FAST.swiglu(g, u).float()
    assert (got - exact).abs().max() <= (sep - exact).abs().max() + 1e-6


def test_vision_gate_up_fused_weights_are_views_and_the_same_function(tiny64):
    """fuse_gate_up row-concatenates each block's gate|up weight and bias (the separate tensors
    become views of them); the tower over the fused weights (one linear, then SwiGLU of the two
    halves) gives the separate-weights tower's embeddings (float64)."""
    from flashrt_activevln.model.vision import GATE_UP, VisionPlan, fuse_gate_up, vision_forward

    cfg, w, _ = tiny64
    vc = cfg.vision
    fused = fuse_gate_up(w, vc)
    p = "visual.blocks.0."
    for part in ("weight", "bias"):
        cat = fused[p + GATE_UP + part]
        assert cat.shape[0] == 2 * vc.intermediate_size
        gate, up = fused[p + f"mlp.gate_proj.{part}"], fused[p + f"mlp.up_proj.{part}"]
        assert torch.equal(gate, w[p + f"mlp.gate_proj.{part}"])
        assert torch.equal(up, w[p + f"mlp.up_proj.{part}"])
        assert gate.untyped_storage().data_ptr() == cat.untyped_storage().data_ptr()
    pix = torch.randn(24, w["visual.patch_embed.proj.weight"][0].numel(),
                      generator=torch.Generator().manual_seed(4)).double()  # fmt: skip
    plan = VisionPlan(vc, [(1, 4, 6)], "cpu")
    a = vision_forward(w, vc, pix, plan, Ops())
    b = vision_forward(fused, vc, pix, plan, Ops())
    assert (a - b).abs().max().item() <= 1e-12


def test_ops_activation_option_is_checked():
    with pytest.raises(ValueError, match="Ops.activation"):
        Ops(activation="fused")


def _gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    return torch.device("cuda")


@pytest.mark.gpu
def test_vision_kernels_rope_exact_swiglu_faithful_tower_faithful(tiny64):
    """On the GPU: the vision rotary through rope_qk is bit-identical to the torch rotation;
    swiglu_halves with activation="kernel" is silu_mul (2 ulp of the fp32 product); the whole
    tower with the fast preset's vision kernels stays as close to float64 as the reference
    ops in bf16 (within 2x)."""
    from flashrt_activevln.model.rope import apply_vision_rope
    from flashrt_activevln.model.vision import VisionPlan, fuse_gate_up, pad_mlp, vision_forward

    dev = _gpu()
    cfg, w64, _ = tiny64
    vc = cfg.vision
    kern = Ops(rms_norm="kernel", vision_attention="segmented", activation="kernel")
    g = torch.Generator().manual_seed(6)
    qkv = torch.randn(300, 3, vc.num_heads, vc.head_dim, generator=g).to(torch.bfloat16).to(dev)
    ang = (torch.rand(300, vc.head_dim, generator=g) * 50).to(dev)
    q, k = kern.vision_rope(qkv[:, 0], qkv[:, 1], ang.cos(), ang.sin())
    assert torch.equal(q, apply_vision_rope(qkv[:, 0], ang.cos(), ang.sin()))
    assert torch.equal(k, apply_vision_rope(qkv[:, 1], ang.cos(), ang.sin()))
    gu = torch.randn(37, 2 * 96, generator=g).to(torch.bfloat16).to(dev)
    got = kern.swiglu_halves(gu).float()
    exact = torch.nn.functional.silu(gu[:, :96].double()) * gu[:, 96:].double()
    ulp = 2.0**-7
    assert ((got - exact).abs() <= 2 * ulp * exact.abs() + 1e-30).all()

    w = {n: t.to(torch.bfloat16).to(dev) for n, t in w64.items() if n.startswith("visual.")}
    w = fuse_gate_up(pad_mlp(w, vc), vc)
    pix = torch.randn(96, w["visual.patch_embed.proj.weight"][0].numel(), generator=g)
    plan = VisionPlan(vc, [(1, 8, 12)], dev)
    exact = vision_forward(fuse_gate_up(pad_mlp(w64, vc), vc), vc, pix.double(),
                           VisionPlan(vc, [(1, 8, 12)], "cpu"), Ops())  # fmt: skip
    ref = vision_forward(w, vc, pix.to(dev), plan, Ops()).double().cpu()
    fast = vision_forward(w, vc, pix.to(dev), plan, kern).double().cpu()
    e_ref, e_fast = (ref - exact).abs().max().item(), (fast - exact).abs().max().item()
    assert e_fast <= 2 * e_ref + 1e-3, (e_fast, e_ref)
