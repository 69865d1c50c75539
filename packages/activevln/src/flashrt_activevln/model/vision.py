"""The Qwen2.5-VL vision tower: patch embedding, 2-D RoPE, windowed and full attention blocks,
2x2 patch merger. ``vision_forward`` takes the processor's ``pixel_values`` [N, patch_dim] and
the per-image grids (t, h, w) and returns the merged embeddings [N / 4, out_hidden] in the
processor's (row-major merged-unit) order."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from flashrt_activevln.config import VisionConfig
from flashrt_activevln.model.ops import Ops
from flashrt_activevln.model.rope import vision_cos_sin

MLP_ALIGN = 16  # elements: a bf16 row stride of a multiple of 32 bytes keeps cuBLAS aligned
GATE_UP = "mlp.gate_up_proj."  # fused gate|up weight and bias (``fuse_gate_up``), per block


def pad_mlp(w: dict, cfg: VisionConfig) -> dict:
    """A copy of the weights whose vision MLPs have their intermediate size padded with zeros to
    a multiple of ``MLP_ALIGN`` (Qwen2.5-VL: 3420 -> 3424). With 3420 the gate / up outputs and
    the down projection's input have a row stride that is not 16-byte aligned, and cuBLAS falls
    back to 2-element-aligned kernels (on the H200 about 40 TFLOP/s at one image). The same
    function: the padded gate / up outputs are 0 (zero rows and biases), silu(0) * 0 = 0, and they
    meet zero columns of the down projection. The caller's originals are freed with its dict."""
    n = cfg.intermediate_size
    pad = -n % MLP_ALIGN
    if pad == 0:
        return w
    w = dict(w)
    for i in range(cfg.depth):
        p = f"visual.blocks.{i}.mlp."
        for name in ("gate_proj", "up_proj"):
            for part in ("weight", "bias"):
                t = w[p + f"{name}.{part}"]
                w[p + f"{name}.{part}"] = torch.cat([t, t.new_zeros(pad, *t.shape[1:])])
        down = w[p + "down_proj.weight"]
        w[p + "down_proj.weight"] = torch.cat([down, down.new_zeros(down.shape[0], pad)], 1)
    return w


def fuse_gate_up(w: dict, cfg: VisionConfig) -> dict:
    """A copy of the weights with every block's gate and up projections (weights and biases)
    row-concatenated under ``GATE_UP``: one linear per MLP instead of two, its output the
    gate|up tensor ``Ops.swiglu_halves`` takes. The separate tensors become views of the fused
    ones (each weight held once)."""
    w = dict(w)
    for i in range(cfg.depth):
        p = f"visual.blocks.{i}."
        for part in ("weight", "bias"):
            names = [p + f"mlp.{n}_proj.{part}" for n in ("gate", "up")]
            cat = torch.cat([w[n] for n in names])
            w[p + GATE_UP + part] = cat
            rows = w[names[0]].shape[0]
            w[names[0]], w[names[1]] = cat[:rows], cat[rows:]
    return w


def unpad_mlp(w: dict, cfg: VisionConfig) -> dict:
    """Views of ``pad_mlp``'s weights at the checkpoint's shapes (for loading into HF), without
    ``fuse_gate_up``'s fused tensors."""
    n = cfg.intermediate_size
    w = dict(w)
    for i in range(cfg.depth):
        for part in ("weight", "bias"):
            w.pop(f"visual.blocks.{i}." + GATE_UP + part, None)
        p = f"visual.blocks.{i}.mlp."
        for name in ("gate_proj.weight", "gate_proj.bias", "up_proj.weight", "up_proj.bias"):
            w[p + name] = w[p + name][:n]
        w[p + "down_proj.weight"] = w[p + "down_proj.weight"][:, :n]
    return w


def patch_positions(grid: tuple[int, int, int], merge: int) -> torch.Tensor:
    """(row, col) of every patch in the processor's order (merged units row-major, then the
    merge x merge patches inside a unit row-major), repeated over t: [t*h*w, 2]."""
    t, h, w = grid
    hh = torch.arange(h).view(h // merge, merge, 1, 1).expand(-1, -1, w // merge, merge)
    ww = torch.arange(w).view(1, 1, w // merge, merge).expand(h // merge, merge, -1, -1)
    hh = hh.permute(0, 2, 1, 3).reshape(-1)
    ww = ww.permute(0, 2, 1, 3).reshape(-1)
    return torch.stack([hh, ww], dim=-1).repeat(t, 1)


def window_order(
    grid: tuple[int, int, int], merge: int, window_units: int
) -> tuple[torch.Tensor, list[int]]:
    """Merged-unit permutation that groups units by window (windows row-major, units row-major
    inside a window; edge windows are smaller) and the window sizes in units."""
    t, h, w = grid
    gh, gw = h // merge, w // merge
    order, sizes = [], []
    for ti in range(t):
        base = ti * gh * gw
        for wy in range(0, gh, window_units):
            for wx in range(0, gw, window_units):
                ys = torch.arange(wy, min(wy + window_units, gh))
                xs = torch.arange(wx, min(wx + window_units, gw))
                idx = (ys[:, None] * gw + xs[None, :]).reshape(-1) + base
                order.append(idx)
                sizes.append(idx.numel())
    return torch.cat(order), sizes


class VisionPlan:
    """Everything about a list of image grids that does not depend on pixels (cacheable)."""

    def __init__(self, cfg: VisionConfig, grids: list[tuple[int, int, int]], device):
        m, unit = cfg.spatial_merge_size, cfg.merge_unit
        wu = cfg.window_size // m // cfg.patch_size
        perms, win_bounds, full_bounds, pos = [], [0], [0], []
        offset = 0
        for g in grids:
            n_units = g[0] * (g[1] // m) * (g[2] // m)
            order, sizes = window_order(g, m, wu)
            perms.append(order + offset)
            for s in sizes:
                win_bounds.append(win_bounds[-1] + s * unit)
            full_bounds.append(full_bounds[-1] + n_units * unit)
            pos.append(patch_positions(g, m))
            offset += n_units
        unit_perm = torch.cat(perms)
        self.patch_perm = (unit_perm[:, None] * unit + torch.arange(unit)).reshape(-1).to(device)
        self.unit_inverse = torch.argsort(unit_perm).to(device)
        self.window_bounds = win_bounds
        self.full_bounds = full_bounds
        # the segment bounds as the segmented kernel takes them, uploaded once per plan
        self.window_cu = torch.tensor(win_bounds, dtype=torch.int32, device=device)
        self.full_cu = torch.tensor(full_bounds, dtype=torch.int32, device=device)
        hw = torch.cat(pos).to(device)[self.patch_perm]
        self.cos, self.sin = vision_cos_sin(hw, cfg.head_dim, cfg.rope_theta)


def vision_block(x, delta, w, p, cfg: VisionConfig, plan: VisionPlan, full: bool, ops: Ops):
    """One block on the residual stream ``x + delta`` (``delta``: the previous block's MLP
    output, or None): returns (the stream after attention, this block's MLP output), so each
    residual add is the input of the norm that follows it (one launch with the norm kernel)."""
    n = x.shape[0]
    heads = cfg.num_heads
    h, x = ops.add_norm(x, delta, w[p + "norm1.weight"], 1e-6)
    qkv = ops.linear(h, w[p + "attn.qkv.weight"], w[p + "attn.qkv.bias"]).view(n, 3, heads, -1)
    q, k = ops.vision_rope(qkv[:, 0], qkv[:, 1], plan.cos, plan.sin)
    bounds, cu = (plan.full_bounds, plan.full_cu) if full else (plan.window_bounds, plan.window_cu)
    a = ops.attend_segments(q, k, qkv[:, 2], bounds, cfg.head_dim**-0.5, cu).reshape(n, -1)
    attn = ops.linear(a, w[p + "attn.proj.weight"], w[p + "attn.proj.bias"])
    h, x = ops.add_norm(x, attn, w[p + "norm2.weight"], 1e-6)
    if p + GATE_UP + "weight" in w:
        m = ops.swiglu_halves(ops.linear(h, w[p + GATE_UP + "weight"], w[p + GATE_UP + "bias"]))
    else:
        g = ops.linear(h, w[p + "mlp.gate_proj.weight"], w[p + "mlp.gate_proj.bias"])
        u = ops.linear(h, w[p + "mlp.up_proj.weight"], w[p + "mlp.up_proj.bias"])
        m = ops.swiglu(g, u)
    return x, ops.linear(m, w[p + "mlp.down_proj.weight"], w[p + "mlp.down_proj.bias"])


def vision_forward(
    w: dict, cfg: VisionConfig, pixel_values: torch.Tensor, plan: VisionPlan, ops: Ops,
    after_block=None,
) -> torch.Tensor:  # fmt: skip
    """The tower and merger; ``after_block(i)``, when given, is called after block ``i``'s work
    is issued (where a CUDA graph capture may start its next piece)."""
    dtype = w["visual.patch_embed.proj.weight"].dtype
    proj = w["visual.patch_embed.proj.weight"].reshape(cfg.hidden_size, -1)
    x = ops.linear(pixel_values.to(dtype), proj)[plan.patch_perm]
    full = set(cfg.fullatt_block_indexes)
    delta = None
    for i in range(cfg.depth):
        x, delta = vision_block(x, delta, w, f"visual.blocks.{i}.", cfg, plan, i in full, ops)
        if after_block is not None:
            after_block(i)
    x, _ = ops.add_norm(x, delta, w["visual.merger.ln_q.weight"], 1e-6)
    x = x.reshape(-1, cfg.hidden_size * cfg.merge_unit)
    x = F.gelu(ops.linear(x, w["visual.merger.mlp.0.weight"], w["visual.merger.mlp.0.bias"]))
    x = ops.linear(x, w["visual.merger.mlp.2.weight"], w["visual.merger.mlp.2.bias"])
    return x[plan.unit_inverse]
