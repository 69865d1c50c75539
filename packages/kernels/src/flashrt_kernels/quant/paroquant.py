"""ParoQuant rotated INT4 format: channel scales, rotation layers of disjoint channel pairs, and
group-128 asymmetric uint4 weights.

Checkpoint tensors: ``pairs`` int16 [krot, K] (pair p of layer l is channels ``pairs[l, 2p]`` and
``pairs[l, 2p + 1]``, both inside one group of 128), ``theta`` [krot, K/2] (the angle of pair p),
``channel_scales`` [1, K], and the quantized weight in AWQ or GPTQ packing (``int4.from_awq`` /
``from_gptq``). One layer maps (x_i, x_j) -> (c x_i + s x_j, -s x_i + c x_j), c = cos, s = sin;
layers apply in order after the channel scale. Weights are stored rotated, ``W' = R(W / cs)`` row
by row, so ``W' . R(x * cs) = W . x`` up to rounding.

Host-side torch code, run once at load; cos and sin are computed here in fp32 (from the fp32 angle)
so every kernel uses the same coefficients. Contract of ``rotate_activations``: it is the
specification (fp32: the channel scale product, then per layer two products and one sum each
rounded separately, layer by layer).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flashrt_kernels.quant.int4 import Int4Weight, from_awq, from_gptq, quantize_int4

GROUP = 128


@dataclass
class Rotation:
    pair_i: torch.Tensor  # int32 [krot, K/2]
    pair_j: torch.Tensor  # int32 [krot, K/2]
    cos: torch.Tensor  # fp32 [krot, K/2]
    sin: torch.Tensor  # fp32 [krot, K/2]
    channel_scales: torch.Tensor  # fp32 [K]

    @property
    def layers(self) -> int:
        return self.pair_i.shape[0]


@dataclass
class RotatedInt4Weight:
    rotation: Rotation
    weight: Int4Weight


def rotation_from_checkpoint(pairs, theta, channel_scales) -> Rotation:
    krot, k = pairs.shape
    if k % GROUP or theta.shape != (krot, k // 2):
        raise ValueError(
            f"paroquant: pairs must be [krot, K] with K % {GROUP} == 0 and theta [krot, K/2], "
            f"got {tuple(pairs.shape)} and {tuple(theta.shape)}"
        )
    p = pairs.to(torch.int64).reshape(krot, k // 2, 2)
    pi, pj = p[..., 0], p[..., 1]
    for layer in range(krot):
        used = torch.cat([pi[layer], pj[layer]])
        if used.unique().numel() != k:
            raise ValueError(f"paroquant: the pairs of layer {layer} are not disjoint")
    if not torch.equal(pi // GROUP, pj // GROUP):
        raise ValueError(f"paroquant: a pair crosses a group of {GROUP} channels")
    t = theta.float()
    return Rotation(
        pi.to(torch.int32).contiguous(), pj.to(torch.int32).contiguous(),
        torch.cos(t).contiguous(), torch.sin(t).contiguous(),
        channel_scales.float().reshape(-1).contiguous(),
    )  # fmt: skip


def from_checkpoint(pairs, theta, channel_scales, qweight, qzeros, scales, packing="awq",
                    pad_to: int = 1) -> RotatedInt4Weight:  # fmt: skip
    if packing not in ("awq", "gptq"):
        raise ValueError(f"paroquant: packing must be 'awq' or 'gptq', got {packing!r}")
    conv = from_awq if packing == "awq" else from_gptq
    return RotatedInt4Weight(
        rotation_from_checkpoint(pairs, theta, channel_scales),
        conv(qweight, qzeros, scales, pad_to=pad_to),
    )


def _apply_layers(v: torch.Tensor, rot: Rotation, inverse: bool = False) -> torch.Tensor:
    order = range(rot.layers - 1, -1, -1) if inverse else range(rot.layers)
    for layer in order:
        i, j = rot.pair_i[layer].long(), rot.pair_j[layer].long()
        c, s = rot.cos[layer], -rot.sin[layer] if inverse else rot.sin[layer]
        xi, xj = v[:, i], v[:, j]
        v[:, i] = c * xi + s * xj
        v[:, j] = -s * xi + c * xj
    return v


def rotate_activations(x: torch.Tensor, rot: Rotation) -> torch.Tensor:
    """fp32 [rows, K]: R(x * channel_scales)."""
    return _apply_layers(x.float() * rot.channel_scales, rot)


def unrotate(v: torch.Tensor, rot: Rotation) -> torch.Tensor:
    """Inverse of ``rotate_activations`` (up to rounding)."""
    return _apply_layers(v.float().clone(), rot, inverse=True) / rot.channel_scales


def rotate_weight(w: torch.Tensor, rot: Rotation) -> torch.Tensor:
    """fp32 [N, K]: R(W / channel_scales), row by row."""
    return _apply_layers(w.float() / rot.channel_scales, rot)


def random_rotation(k: int, layers: int = 8, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Checkpoint-style (pairs int16, theta fp16, channel_scales fp16) for tests: random disjoint
    pairs inside each group of 128, random angles, scales near 1."""
    g = torch.Generator().manual_seed(seed)
    pairs = torch.empty(layers, k, dtype=torch.int16)
    for layer in range(layers):
        perm = torch.cat(
            [torch.randperm(GROUP, generator=g) + b for b in range(0, k, GROUP)]
        )  # within-group permutation
        pairs[layer] = perm.to(torch.int16)
    theta = (torch.rand(layers, k // 2, generator=g) * 2 - 1).to(torch.float16)
    cs = (0.5 + torch.rand(1, k, generator=g)).to(torch.float16)
    return pairs, theta, cs


def quantize_rotated(w: torch.Tensor, rot: Rotation, pad_to: int = 1) -> RotatedInt4Weight:
    """Rotate then group-quantize a float weight (for tests and for building checkpoints)."""
    return RotatedInt4Weight(rot, quantize_int4(rotate_weight(w, rot), GROUP, pad_to))
