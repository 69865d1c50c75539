"""Qwen2.5-VL (the ActiveVLN policy) in plain torch over flashrt-kernels ops."""

from __future__ import annotations

import torch

from flashrt_activevln.config import ModelConfig
from flashrt_activevln.model.ops import FEW_QUERIES, Ops
from flashrt_activevln.model.positions import mrope_positions
from flashrt_activevln.model.text import KVPool, decoder_forward, fuse_projections
from flashrt_activevln.model.vision import VisionPlan, fuse_gate_up, pad_mlp, vision_forward

__all__ = ["KVPool", "Ops", "Qwen25VL", "VisionPlan", "mrope_positions"]


class Qwen25VL:
    """Weights (HF names) + config + the op choices; stateless apart from the weights and a cache
    of vision plans (per list of image grids: index tables and segment bounds on the device)."""

    def __init__(self, cfg: ModelConfig, weights: dict[str, torch.Tensor], ops: Ops | None = None):
        self.cfg = cfg
        self.ops = ops or Ops()
        if self.ops.fused_weights:  # fused q|k|v, gate|up launches
            weights = fuse_projections(weights, cfg.text)
        self.w = fuse_gate_up(pad_mlp(weights, cfg.vision), cfg.vision)
        self.dtype = weights["model.embed_tokens.weight"].dtype
        self.device = weights["model.embed_tokens.weight"].device
        self._plans: dict[tuple, VisionPlan] = {}  # per list of image grids

    def new_pool(self, rows: int, capacity: int) -> KVPool:
        return KVPool(self.cfg.text, rows, capacity, self.dtype, self.device)

    def vision(
        self, pixel_values: torch.Tensor, grids: list[tuple[int, int, int]], after_block=None
    ) -> torch.Tensor:
        key = tuple(tuple(g) for g in grids)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = VisionPlan(self.cfg.vision, grids, self.device)
        pixels = pixel_values.to(self.device)
        return vision_forward(self.w, self.cfg.vision, pixels, plan, self.ops, after_block)

    def embed(
        self,
        ids: torch.Tensor,
        image_embeds: torch.Tensor | None = None,
        image_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """ids [B, Q] -> [B, Q, H]; the image slots (``image_mask``, default: every image token)
        take ``image_embeds`` rows in order. The runtime passes the mask of its turns' image
        spans, so an image token that a reply happens to contain is embedded as a token."""
        x = self.w["model.embed_tokens.weight"][ids]
        if image_embeds is not None:
            mask = ids == self.cfg.image_token_id if image_mask is None else image_mask
            x = x.masked_scatter(mask[..., None], image_embeds.to(x.dtype))
        return x

    def embed_step(
        self, ids: torch.Tensor, image_index: torch.Tensor, image: torch.Tensor | None
    ) -> torch.Tensor:
        """``embed`` with fixed shapes and no host read (it runs inside a captured step): ids
        [B, Q]; ``image_index`` [B, Q] names the row of ``image`` [N, H] each image slot takes,
        -1 elsewhere (a token's embedding). The same values as ``embed`` with that slot mask."""
        x = self.w["model.embed_tokens.weight"][ids]
        if image is None:
            return x
        take = image[image_index.clamp_min(0)].to(x.dtype)
        return torch.where((image_index >= 0)[..., None], take, x)

    def decode(
        self, embeds, positions, pool, lengths, new_visible, q_lens=None, extent=None,
        live_index=None, chain_lens=None, after_layer=None,
    ) -> torch.Tensor:  # fmt: skip
        """``q_lens`` / ``live_index``: live tokens per row and their flat positions, for the
        packed forward; ``extent``: max(lengths) + Q known on the host; ``chain_lens``: each
        row's leading causal queries, before its tree; ``after_layer``: a hook (``decoder_forward``)."""
        return decoder_forward(
            self.w, self.cfg.text, embeds, positions, pool, lengths, new_visible, self.ops,
            q_lens, extent, live_index, chain_lens, after_layer,
        )  # fmt: skip

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM head over the verified rows. Up to ``FEW_QUERIES`` rows it is a few-row step
        (batch-invariant with ``decode_linear``); more rows (a batch of trees) read the vocabulary
        once through the prefill linear instead (batch-invariant with ``prefill_linear``): the
        few-row kernel re-reads the 151936 x 2048 weight for every 64 rows."""
        few = hidden.shape[0] <= FEW_QUERIES
        return self.ops.text_linear(hidden, self.w["lm_head.weight"], None, few_queries=few)

    def full_logits(
        self, ids: list[int], pixel_values: torch.Tensor | None, grids: list[tuple[int, int, int]]
    ) -> torch.Tensor:
        """Logits [len(ids), vocab] of one sequence from scratch (the oracle comparison)."""
        emb = self.vision(pixel_values, grids) if grids else None
        t = torch.tensor([ids], device=self.device)
        pos, _ = mrope_positions(
            ids, grids, self.cfg.image_token_id, self.cfg.vision.spatial_merge_size
        )
        n = len(ids)
        pool = self.new_pool(1, n)
        causal = torch.ones(n, n, dtype=torch.bool, device=self.device).tril()[None]
        lengths = torch.zeros(1, dtype=torch.long, device=self.device)
        h = self.decode(self.embed(t, emb), pos[:, None].to(self.device), pool, lengths, causal)
        return self.logits(h[0])
