"""Rotary embeddings: M-RoPE for the text decoder, 2-D axial RoPE for the vision tower.

Both follow HF transformers' arithmetic: angles in float32 (positions times float32 inverse
frequencies); text cos/sin are then cast to the model dtype, vision rotation runs in float32.
"""

from __future__ import annotations

import torch


def inv_freq(dim: int, theta: float, device=None) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float, device=device) / dim))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def mrope_cos_sin(
    positions: torch.Tensor, head_dim: int, theta: float, section: tuple[int, ...], dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [3, B, Q] (t, h, w) -> cos, sin [B, Q, head_dim] in ``dtype``."""
    f = inv_freq(head_dim, theta, positions.device)
    freqs = positions[..., None].float() * f  # [3, B, Q, hd/2]
    parts = freqs.split(list(section), dim=-1)
    mixed = torch.cat([p[i % 3] for i, p in enumerate(parts)], dim=-1)
    cos, sin = mixed.cos(), mixed.sin()
    return torch.cat((cos, cos), -1).to(dtype), torch.cat((sin, sin), -1).to(dtype)


def apply_text_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, Q, D]; cos/sin [B, Q, D]."""
    return x * cos[:, None] + rotate_half(x) * sin[:, None]


def vision_cos_sin(hw: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, ...]:
    """hw [N, 2] patch (row, col) -> float32 cos, sin [N, head_dim]."""
    f = inv_freq(head_dim // 2, theta, hw.device)
    freqs = hw[..., None].float() * f  # [N, 2, hd/4]
    both = torch.cat([freqs[:, 0], freqs[:, 1]], dim=-1)
    both = torch.cat([both, both], dim=-1)
    return both.cos(), both.sin()


def apply_vision_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [N, H, D] rotated in float32 and cast back; cos/sin [N, D] float32."""
    xf = x.float()
    out = xf * cos[:, None] + rotate_half(xf) * sin[:, None]
    return out.to(x.dtype)
