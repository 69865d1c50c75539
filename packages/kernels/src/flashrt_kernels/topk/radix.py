"""Hint-free exact select (placeholder: the Triton kernels land next)."""

from __future__ import annotations

import torch

from flashrt_kernels.topk import reference
from flashrt_kernels.topk import state as st


def publish_reference_state(scores, k, lengths, values, state) -> None:
    b, n = scores.shape
    lens = torch.full((b,), n, device=scores.device) if lengths is None else lengths.long()
    lens = lens.clamp(0, n)
    last = (torch.minimum(lens, torch.full_like(lens, k)) - 1).clamp(min=0)
    kth = reference.order_key(torch.gather(values.float(), 1, last[:, None]))[:, 0]
    state.zero_()
    state[:, st.VALID] = (lens > 0).int()
    state[:, st.KTH_KEY] = kth
    state[:, st.ACCEPTED_KEY] = kth
    state[:, st.ACCEPTED_COUNT] = torch.minimum(lens, torch.full_like(lens, k)).int()
    state[:, st.PATH] = st.PATH_RADIX
    state[:, st.LENGTH] = lens.int()
    state[:, st.K] = k


def select(scores, k, lengths, out_values, out_indices, state) -> None:
    v, i = reference.topk(scores, k, lengths)
    out_values.copy_(v)
    out_indices.copy_(i)
    if state is not None:
        publish_reference_state(scores, k, lengths, v, state)
