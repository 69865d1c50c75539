"""Temporally correlated score chains: rows that drift from step to step as decode scores do.

``ScoreChain(batch, n, ...)`` holds one latent row per batch entry. Each ``step()`` returns
``(scores [B, n], lengths int32 [B])``: the latent of every row moves by an AR(1) step
``x <- rho x + sqrt(1 - rho**2) e`` (``rho = sqrt(1 - drift**2)``; small ``drift`` = strongly
correlated steps), rows are independent of each other, each row's valid length grows by
``growth`` per step (capped at ``n``; positions past it hold garbage that must be ignored), and a
row is *cold* (redrawn from scratch, no correlation with its past) at its first step and then with
probability ``cold_prob`` per step. ``scale`` and an optional ReLU (``relu=True``: exact-zero
plateaus, as a ReLU-weighted logit sum has) shape the values. Deterministic in the seed on a
given device (the generator lives on ``device``).
"""

from __future__ import annotations

import math

import torch


class ScoreChain:
    def __init__(self, batch: int, n: int, *, drift: float = 0.05, growth: int = 0,
                 start_lengths: torch.Tensor | list[int] | None = None, cold_prob: float = 0.0,
                 relu: bool = False, scale: float = 1.0, dtype: torch.dtype = torch.float32,
                 seed: int = 0, device: torch.device | str = "cpu") -> None:  # fmt: skip
        if not 0.0 <= drift <= 1.0 or not 0.0 <= cold_prob <= 1.0:
            raise ValueError("ScoreChain: drift and cold_prob must be in [0, 1]")
        self.batch, self.n, self.growth, self.relu = batch, n, growth, relu
        self.drift, self.cold_prob, self.scale, self.dtype = drift, cold_prob, scale, dtype
        self.device = torch.device(device)
        self.gen = torch.Generator(device=self.device)
        self.gen.manual_seed(int(seed))
        if start_lengths is None:
            lens = torch.full((batch,), n, dtype=torch.int32)
        else:
            lens = torch.as_tensor(start_lengths, dtype=torch.int32).clamp(0, n)
        self.lengths = lens.to(self.device)
        self.latent = torch.empty((batch, n), device=self.device)
        self.cold = torch.ones(batch, dtype=torch.bool, device=self.device)
        self.t = 0

    def _randn(self, *shape) -> torch.Tensor:
        return torch.randn(shape, generator=self.gen, device=self.device)

    def step(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Advance one step; returns (scores in ``dtype``, lengths). ``self.cold`` marks the rows
        redrawn at this step."""
        fresh = self._randn(self.batch, self.n)
        if self.t == 0:
            self.latent = fresh
        else:
            rho = math.sqrt(1.0 - self.drift**2)
            moved = rho * self.latent + self.drift * fresh
            u = torch.rand((self.batch,), generator=self.gen, device=self.device)
            self.cold = u < self.cold_prob
            redraw = self._randn(self.batch, self.n)
            self.latent = torch.where(self.cold[:, None], redraw, moved)
            self.lengths = (self.lengths + self.growth).clamp(max=self.n)
        x = self.latent * self.scale
        if self.relu:
            x = x.clamp_min(0.0)
        self.t += 1
        return x.to(self.dtype), self.lengths.clone()

    def steps(self, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [self.step() for _ in range(count)]
