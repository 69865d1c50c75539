"""The Qwen2.5 text decoder over a per-row KV pool.

One forward runs B rows of Q new tokens each. Row b's new tokens go to KV slots
``lengths[b] .. lengths[b] + Q - 1``; query i of row b sees every committed slot
(``< lengths[b]``) and the new slots ``j`` with ``new_visible[b, i, j]`` (causal for a chain of
prompt tokens, ancestors for a draft tree, only itself for padding), or, in the packed forward,
the same mask as int64 bit rows ``[B, Q]`` after each row's causal chain of ``chain_lens[b]``
tokens (``flashrt_kernels.attention.reference.unpack_tree_mask``). Slots past a row's new tokens
are never seen, so whatever an earlier episode left there cannot reach the output.
"""

from __future__ import annotations

import numpy as np
import torch

from flashrt_activevln.config import TextConfig
from flashrt_activevln.model.ops import FEW_QUERIES, Ops
from flashrt_activevln.model.rope import apply_text_rope, mrope_cos_sin

QKV = "self_attn.qkv_proj.weight"  # fused weights (``fuse_projections``), per layer prefix
GATE_UP = "mlp.gate_up_proj.weight"


def fuse_projections(w: dict, cfg: TextConfig) -> dict:
    """A copy of the weights with q|k|v and gate|up of every layer row-concatenated (``QKV``,
    ``GATE_UP``) for the fused decode launches; the separate weights become views of them, so
    the model holds each weight once (the caller's originals are freed when it drops its dict)
    and the prefill path reads the same values."""
    w = dict(w)
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        for fused, parts in (
            (QKV, [f"self_attn.{n}_proj.weight" for n in "qkv"]),
            (GATE_UP, ["mlp.gate_proj.weight", "mlp.up_proj.weight"]),
        ):
            cat = torch.cat([w[p + n] for n in parts])
            w[p + fused] = cat
            start = 0
            for n in parts:
                rows = w[p + n].shape[0]
                w[p + n] = cat[start : start + rows]
                start += rows
    return w


class KVPool:
    """K and V for every layer and row: [layers, rows, capacity, kv_heads, head_dim] (a layer is
    flashrt_kernels' [rows, capacity, kv_heads, head_dim] pool layout)."""

    def __init__(self, cfg: TextConfig, rows: int, capacity: int, dtype, device):
        shape = (cfg.num_layers, rows, capacity, cfg.num_kv_heads, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.capacity = capacity

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """slots [B, Q] absolute slot of each new token; k/v [B, Q, Hkv, D]."""
        idx = slots[:, :, None, None].expand_as(k)
        self.k[layer].scatter_(1, idx, k)
        self.v[layer].scatter_(1, idx, v)

    def move_slots(
        self, moves: list[tuple[int, int, list[int]]], size: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The flat slot indices (``row * capacity + slot``, int64) of a step's incremental
        commit: for each ``(row, start, accepted)`` the accepted new slots ``start + accepted[i]``
        (ascending) move to ``start + i``; slots already in place are left out. ``size``: pad to
        that many moves (a fixed shape for a CUDA graph) by repeating the first move, or with slot
        0 onto itself when there is none: the pads change no slot."""
        c = self.capacity
        src = [
            row * c + start + a for row, start, acc in moves for i, a in enumerate(acc) if a != i
        ]
        dst = [
            row * c + start + i for row, start, acc in moves for i, a in enumerate(acc) if a != i
        ]
        if size is not None:
            if len(src) > size:
                raise ValueError(f"KVPool.move_slots: {len(src)} moves for a size of {size}")
            pad = (src[0], dst[0]) if src else (0, 0)
            src += [pad[0]] * (size - len(src))
            dst += [pad[1]] * (size - len(dst))
        return np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64)

    def move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copies flat slot ``src[i]`` to ``dst[i]`` in every layer (``move_slots``'s indices, on
        the pool's device): all sources are gathered before anything is written, so the moves may
        overlap; a slot named twice as a destination must get the same source slot. No host read
        and fixed shapes: it runs inside a captured step."""
        n, r, c = self.k.shape[0], self.k.shape[1], self.k.shape[2]
        for pool in (self.k, self.v):
            flat = pool.view(n, r * c, *pool.shape[3:])
            flat.index_copy_(1, dst, flat.index_select(1, src))

    def commit(self, moves: list[tuple[int, int, list[int]]]) -> None:
        """The incremental commit of ``moves`` (``move_slots``) now: only the accepted slots that
        are not in place are copied, nothing else is touched."""
        src, dst = self.move_slots(moves)
        if src.size:
            idx = torch.from_numpy(np.stack([src, dst])).to(self.k.device)
            self.move(idx[0], idx[1])


def visibility(lengths: torch.Tensor, new_visible: torch.Tensor, extent: int) -> torch.Tensor:
    """[B, Q, extent] bool: committed slots plus the allowed new ones."""
    b, q, _ = new_visible.shape
    slots = torch.arange(extent, device=lengths.device)
    committed = (slots[None, :] < lengths[:, None])[:, None, :].expand(b, q, extent)
    rel = slots[None, :] - lengths[:, None]  # [B, extent]
    in_new = (rel >= 0) & (rel < q)
    gathered = torch.gather(new_visible, 2, rel.clamp(0, q - 1)[:, None, :].expand(b, q, extent))
    return committed | (gathered & in_new[:, None, :])


def decoder_forward(
    w: dict,
    cfg: TextConfig,
    embeds: torch.Tensor,
    positions: torch.Tensor,
    pool: KVPool,
    lengths: torch.Tensor,
    new_visible: torch.Tensor,
    ops: Ops,
    q_lens: torch.Tensor | None = None,
    extent: int | None = None,
    live_index: torch.Tensor | None = None,
    chain_lens: torch.Tensor | None = None,
    after_layer=None,
) -> torch.Tensor:
    """embeds [B, Q, H], positions [3, B, Q] -> final-normed hidden states [B, Q, H].

    ``q_lens`` [B] (packed mode): row b's live new tokens are its first ``q_lens[b]``. Then the
    norms, projections, rotary embedding and MLP run over the live tokens alone, packed back to
    back ([T, H]: no work for padding); only live tokens are written to the pool; attention runs
    over the padded view with those query lengths (padded query slots do no work in the kernel,
    and no query sees a padded slot's stale K/V); the padded slots of the output are zeros.
    ``live_index`` [T] int64: the live tokens' flat positions ``b * Q + i`` in order, when the
    caller has them on the host (else they are found on the device: a host read).
    ``chain_lens`` [B] (packed mode): row b's first ``chain_lens[b]`` live tokens are a causal
    chain and the rest a tree over it (``Ops.attend_pool``'s invariant attention uses it; a
    bit-row ``new_visible`` is relative to it).
    ``after_layer(i)``, when given, is called after layer ``i``'s work is issued (where a CUDA
    graph capture may start its next piece)."""
    b, q, _ = embeds.shape
    if b != pool.k.shape[1]:
        raise ValueError(
            f"decoder_forward: {b} rows of tokens for a pool of {pool.k.shape[1]} rows"
        )
    hd, nh, nkv = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
    cos, sin = mrope_cos_sin(positions, hd, cfg.rope_theta, cfg.mrope_section, embeds.dtype)
    slots = lengths[:, None] + torch.arange(q, device=lengths.device)
    if extent is None:
        extent = int(lengths.max()) + q  # a host read
    if extent > pool.capacity:
        raise ValueError(f"decoder_forward: KV extent {extent} exceeds capacity {pool.capacity}")
    few = q <= FEW_QUERIES
    lin = ops.text_linear
    if new_visible.dtype != torch.bool and (q_lens is None or chain_lens is None):
        raise ValueError("decoder_forward: a bit-row mask needs the packed forward's q_lens "
                         "and chain_lens")  # fmt: skip
    if q_lens is None:
        live = None
        x = embeds
    else:
        bad = q_lens.shape != (b,)
        if not bad and q_lens.device.type == "cpu":  # (a device tensor is not read back)
            bad = bool((q_lens < 0).any()) or bool((q_lens > q).any())
        if bad:
            raise ValueError(f"decoder_forward: q_lens must be [{b}] with entries in [0, {q}]")
        live = torch.arange(q, device=q_lens.device)[None, :] < q_lens[:, None]  # [B, Q]
        if new_visible.dtype == torch.bool:  # (bit rows never reach a padded slot)
            new_visible = new_visible & live[:, None, :]  # padded slots are never written: unseen
        if live_index is None:
            live_index = live.reshape(-1).nonzero()[:, 0]
        x = embeds.reshape(b * q, -1)[live_index][None]  # [1, T, H]
        cos = cos.reshape(b * q, hd)[live_index][None]
        sin = sin.reshape(b * q, hd)[live_index][None]
        rows, slots = live_index // q, slots.reshape(-1)[live_index]
    t = x.shape[1]
    eps = cfg.rms_norm_eps
    # the kernels' int32 lengths, converted once per forward rather than in every layer
    att_lens = lengths.to(torch.int32)
    att_q = None if q_lens is None else q_lens.to(torch.int32)
    att_chain = None if chain_lens is None else chain_lens.to(torch.int32)
    steps = None  # the query-invariant launches' split, once for every layer
    if att_q is not None:
        steps = ops.invariant_steps_for(new_visible, att_q, att_chain, embeds.dtype)
    rope_kernel = live is not None and ops.appends_rotary(x) and "model.layers.0." + QKV in w
    if rope_kernel:
        cos, sin = cos[0].contiguous(), sin[0].contiguous()
    delta = None  # the last residual branch's output, added to x by the next norm

    def attend_live(qp: torch.Tensor, i: int) -> torch.Tensor:
        """Packed path: padded queries ``[b * q, nh, hd]`` over layer ``i``'s pool -> the live
        tokens' outputs ``[1, live, nh, hd]``."""
        a = ops.attend_pool(qp.view(b, q, nh, hd).transpose(1, 2), pool.k[i], pool.v[i],
                            att_lens, new_visible, extent, hd**-0.5, att_q, att_chain,
                            steps)  # fmt: skip
        return a.reshape(b * q, nh, hd)[live_index][None]

    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        h, x = ops.add_norm(x, delta, w[p + "input_layernorm.weight"], eps)
        fused = ops.fuses(h, few) and p + QKV in w
        if rope_kernel:
            biases = tuple(w[p + f"self_attn.{n}_proj.bias"] for n in "qkv")
            qs, ks, vs = ops.qkv_unbiased(h[0], w[p + QKV], (nh * hd, nkv * hd, nkv * hd), few)
            qp = qs.new_zeros(b * q, nh, hd)  # padded query slots stay zero (never attended)
            ops.rope_append(qs, ks, vs, cos, sin, pool.k[i], pool.v[i], rows, slots, qp,
                            live_index, biases)  # fmt: skip
            a = attend_live(qp, i)
        else:
            if fused:
                sizes = (nh * hd, nkv * hd, nkv * hd)
                biases = [w[p + f"self_attn.{n}_proj.bias"] for n in "qkv"]
                qs, ks, vs = ops.qkv(h, w[p + QKV], sizes, biases)
            else:
                qs = lin(h, w[p + "self_attn.q_proj.weight"], w[p + "self_attn.q_proj.bias"], few)
                ks = lin(h, w[p + "self_attn.k_proj.weight"], w[p + "self_attn.k_proj.bias"], few)
                vs = lin(h, w[p + "self_attn.v_proj.weight"], w[p + "self_attn.v_proj.bias"], few)
            qs = apply_text_rope(qs.view(-1, t, nh, hd).transpose(1, 2), cos, sin)
            ks = apply_text_rope(ks.view(-1, t, nkv, hd).transpose(1, 2), cos, sin)
            vs = vs.view(-1, t, nkv, hd)
            if live is None:
                pool.write(i, slots, ks.transpose(1, 2), vs)
                a = ops.attend_pool(qs, pool.k[i], pool.v[i], att_lens, new_visible, extent,
                                    hd**-0.5)  # fmt: skip
            else:
                pool.k[i][rows, slots] = ks.transpose(1, 2)[0]
                pool.v[i][rows, slots] = vs[0]
                qp = qs.new_zeros(b * q, nh, hd).index_copy_(0, live_index, qs.transpose(1, 2)[0])
                a = attend_live(qp, i)
        a = a.reshape(-1, t, nh * hd)
        delta = lin(a, w[p + "self_attn.o_proj.weight"], None, few)
        h, x = ops.add_norm(x, delta, w[p + "post_attention_layernorm.weight"], eps)
        if fused:
            m = ops.gate_up_swiglu(h, w[p + GATE_UP])
        elif p + GATE_UP in w:
            m = ops.gate_up_then_swiglu(h, w[p + GATE_UP])
        else:
            g = lin(h, w[p + "mlp.gate_proj.weight"], None, few)
            u = lin(h, w[p + "mlp.up_proj.weight"], None, few)
            m = ops.swiglu(g, u)
        delta = lin(m, w[p + "mlp.down_proj.weight"], None, few)
        if after_layer is not None:
            after_layer(i)
    x, _ = ops.add_norm(x, delta, w["model.norm.weight"], eps)
    if live is None:
        return x
    return x.new_zeros(b * q, x.shape[-1]).index_copy_(0, live_index, x[0]).view(b, q, -1)
