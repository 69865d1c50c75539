"""GQA decode and tree-verify attention over a KV pool: the public op.

Kernels and the batch-invariance argument: ``gqa_kernels`` (split-KV tiles that pack every query
head sharing a KV head, and the query tokens, into one program; a combine pass); geometry and
workspace layout: ``splits``.

Contracts:
- ``faithful`` vs ``reference.gqa_attention``: ``|out - ref| <= ATOL_V[dtype] * max|v| +
  RTOL[dtype] * |ref|`` (probabilities rounded to the K/V dtype for the PV product: at most
  2^-8 (bf16) / 2^-11 (fp16) of max|v|, with a 2x margin; ``RTOL`` is one output ulp, since both
  sides are rounded once);
- ``exact`` across batch compositions, batch order, pool rows and padded ``q_max``;
- K/V slots at or past ``cache_lens + q_lens`` are never read; rows and padded query slots with no
  live query do no KV work and output zeros;
- with ``query_invariant=True`` (``invariant_kernels``): ``exact`` per query, the bits a function
  of the query and its visible logical key sequence only (not of ``q_len``, ``q_max``, the tree,
  the other nodes, the batch, nor the prefix / new-node cut): a greedy chain of ``q = 1`` steps
  and a tree verification holding the same path agree bit for bit. Same ``faithful`` bound.
"""

from __future__ import annotations

import math

import torch

from flashrt_kernels.attention import reference
from flashrt_kernels.attention.gqa_kernels import ATOL_V, RTOL, launch_gqa_tiles
from flashrt_kernels.attention.invariant_kernels import launch_invariant
from flashrt_kernels.attention.splits import workspace_numel
from flashrt_kernels.backends import resolve_backend
from flashrt_kernels.checks import check_float, check_no_alias, check_out, check_tensor

__all__ = ["ATOL_V", "RTOL", "gqa_attention", "workspace_numel"]

OP = "gqa_attention"
DTYPES = (torch.bfloat16, torch.float16)
IMPLEMENTED = ("triton", "reference")
MAX_HEAD_DIM = 256
MAX_Q = 1024


def validate_cache(op, q_heads, head_dim, dtype, device, k_cache, v_cache):
    check_tensor(op, "k_cache", k_cache, dtypes=(dtype,), ndim=4, device=device,
                 last_dim_contiguous=True)  # fmt: skip
    check_tensor(op, "v_cache", v_cache, dtypes=(dtype,), shape=list(k_cache.shape),
                 device=device, last_dim_contiguous=True)  # fmt: skip
    hkv = k_cache.shape[2]
    if k_cache.shape[3] != head_dim:
        raise ValueError(f"{op}: k_cache head dim must be {head_dim} (q's), got {k_cache.shape[3]}")
    if q_heads % hkv:
        raise ValueError(f"{op}: q heads ({q_heads}) must be a multiple of kv heads ({hkv})")


def validate_lengths(op, bsz, device, **named):
    for name, t in named.items():
        if t is not None:
            check_tensor(op, name, t, dtypes=(torch.int32,), shape=[bsz], device=device,
                         contiguous=True)  # fmt: skip


def _validate(q, k_cache, v_cache, cache_lens, q_lens, cache_rows, tree_mask, scale, out,
              workspace, query_invariant, chain_lens=None):  # fmt: skip
    check_tensor(OP, "q", q, dtypes=DTYPES, ndim=4, last_dim_contiguous=True)
    bsz, q_max, hq, d = q.shape
    if not (1 <= d <= MAX_HEAD_DIM and 1 <= q_max <= MAX_Q and bsz >= 1):
        raise ValueError(
            f"{OP}: q must be [B >= 1, 1 <= q_max <= {MAX_Q}, Hq, 1 <= d <= {MAX_HEAD_DIM}], "
            f"got {list(q.shape)}"
        )
    validate_cache(OP, hq, d, q.dtype, q.device, k_cache, v_cache)
    validate_lengths(OP, bsz, q.device, cache_lens=cache_lens, q_lens=q_lens,
                     cache_rows=cache_rows, chain_lens=chain_lens)  # fmt: skip
    if not isinstance(query_invariant, bool):
        raise TypeError(f"{OP}: query_invariant must be a bool, got {type(query_invariant)}")
    if chain_lens is not None:
        if tree_mask is None or tree_mask.dtype != torch.int64:
            raise ValueError(f"{OP}: chain_lens needs a bit-row (int64 [B, q_max]) tree_mask")
        if query_invariant:
            raise ValueError(
                f"{OP}: chain_lens is not supported with query_invariant=True (launch the "
                "chains causally and the trees with their own bit rows)"
            )
    if tree_mask is not None:
        if query_invariant and q_max > 64:
            raise ValueError(
                f"{OP}: query_invariant tree verification takes at most 64 nodes, q_max={q_max}"
            )
        if tree_mask.dtype == torch.int64:
            if q_max > 64 and chain_lens is None:
                raise ValueError(
                    f"{OP}: a bit-packed tree_mask holds at most 64 nodes, q_max={q_max}"
                )
            check_tensor(OP, "tree_mask", tree_mask, shape=[bsz, q_max], device=q.device,
                         last_dim_contiguous=True)  # fmt: skip
        else:
            check_tensor(OP, "tree_mask", tree_mask, dtypes=(torch.bool,),
                         shape=[bsz, q_max, q_max], device=q.device, last_dim_contiguous=True)  # fmt: skip
    if scale is not None:
        check_float(OP, "scale", scale, positive=True)
    if out is not None:
        check_out(OP, "out", out, shape=q.shape, dtype=q.dtype, device=q.device)
        for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
            check_no_alias(OP, [("out", out), (name, t)])
    if workspace is not None:
        need = workspace_numel(bsz, q_max, hq, k_cache.shape[2], d, k_cache.shape[1],
                               query_invariant=query_invariant)  # fmt: skip
        check_tensor(OP, "workspace", workspace, dtypes=(torch.float32,), ndim=1,
                     device=q.device, contiguous=True)  # fmt: skip
        if workspace.numel() < need:
            raise ValueError(
                f"{OP}: workspace must hold >= {need} fp32 elements, got {workspace.numel()}"
            )


def gqa_attention_into(q, k_cache, v_cache, cache_lens, q_lens, cache_rows, tree_mask, scale,
                       out, workspace, backend, query_invariant=False,
                       chain_lens=None) -> None:  # fmt: skip
    """Writes ``out``; inputs validated, ``workspace`` sized. No allocation, no host sync."""
    which = resolve_backend(OP, backend, q.device, IMPLEMENTED)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if which == "reference":
        if query_invariant:
            ref = reference.gqa_attention_invariant(q, k_cache, v_cache, cache_lens, q_lens,
                                                    cache_rows=cache_rows, tree_mask=tree_mask,
                                                    scale=scale)  # fmt: skip
        else:
            ref = reference.gqa_attention(q, k_cache, v_cache, cache_lens, q_lens,
                                          cache_rows=cache_rows, tree_mask=tree_mask,
                                          scale=scale, chain_lens=chain_lens)  # fmt: skip
        out.copy_(ref)
        return
    if tree_mask is None:
        mask, mode = None, 0
    elif tree_mask.dtype == torch.int64:
        mask, mode = tree_mask, 2
    else:
        mask, mode = tree_mask.view(torch.uint8), 1
    if query_invariant:
        launch_invariant(q, k_cache, v_cache, out, cache_lens, q_lens, cache_rows=cache_rows,
                         mask=mask, mask_mode=mode, workspace=workspace, scale=scale)  # fmt: skip
        return
    launch_gqa_tiles(q, k_cache, v_cache, out, cache_lens, q_lens, q_starts=None,
                     cache_rows=cache_rows, mask=mask, mask_mode=mode, q_max=q.shape[1],
                     split=True, workspace=workspace, scale=scale,
                     chain_lens=chain_lens)  # fmt: skip


def gqa_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_lens: torch.Tensor,
    q_lens: torch.Tensor,
    *,
    cache_rows: torch.Tensor | None = None,
    tree_mask: torch.Tensor | None = None,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    workspace: torch.Tensor | None = None,
    backend: str = "auto",
    query_invariant: bool = False,
    chain_lens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode / tree-verify GQA attention over a KV pool layer (see ``reference.gqa_attention``).

    q ``[B, q_max, Hq, d]`` (bf16/fp16); caches ``[rows, capacity, Hkv, d]``; ``cache_lens``,
    ``q_lens`` (and ``cache_rows``, the pool row of each batch row) int32 ``[B]``; the new tokens'
    K/V must already be appended and ``cache_lens + q_lens <= capacity``. ``tree_mask``: bool
    ``[B, q_max, q_max]`` or bit rows int64 ``[B, q_max]``; None = causal. ``chain_lens`` int32
    ``[B]`` (with bit rows): row b's first ``chain_lens[b]`` new tokens are a causal chain (a
    frame's prompt), and bit ``t`` of a later query's row is node ``chain_lens[b] + t`` (trees of
    up to 64 nodes after a chain of any length; ``reference.unpack_tree_mask``). With ``out`` and
    ``workspace`` (fp32, ``workspace_numel(...)`` elements) nothing is allocated.
    Contract: ``faithful`` to the reference (module docstring), ``exact`` across batch
    compositions, pool rows and padded ``q_max``. ``query_invariant``: each query's bits depend
    only on it and its visible logical key sequence (module docstring; tree masks of at most 64
    nodes; its own workspace size, ``workspace_numel(..., query_invariant=True)``).
    """
    _validate(q, k_cache, v_cache, cache_lens, q_lens, cache_rows, tree_mask, scale, out,
              workspace, query_invariant, chain_lens)  # fmt: skip
    if torch.compiler.is_compiling():
        if out is None:
            return torch.ops.flashrt.gqa_attention(q, k_cache, v_cache, cache_lens, q_lens,
                                                   cache_rows, tree_mask, scale, backend,
                                                   query_invariant, chain_lens)  # fmt: skip
        torch.ops.flashrt.gqa_attention_out(q, k_cache, v_cache, cache_lens, q_lens, cache_rows,
                                            tree_mask, scale, out, workspace, backend,
                                            query_invariant, chain_lens)  # fmt: skip
        return out
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if workspace is None:
        n = workspace_numel(q.shape[0], q.shape[1], q.shape[2], k_cache.shape[2], q.shape[3],
                            k_cache.shape[1], query_invariant=query_invariant)  # fmt: skip
        workspace = torch.empty(n, dtype=torch.float32, device=q.device)
    gqa_attention_into(q, k_cache, v_cache, cache_lens, q_lens, cache_rows, tree_mask, scale,
                       out, workspace, backend, query_invariant, chain_lens)  # fmt: skip
    return out


@torch.library.custom_op("flashrt::gqa_attention", mutates_args=())
def _gqa_attention_op(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_lens: torch.Tensor,
    q_lens: torch.Tensor, cache_rows: torch.Tensor | None, tree_mask: torch.Tensor | None,
    scale: float | None, backend: str, query_invariant: bool = False,
    chain_lens: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    return gqa_attention(q, k_cache, v_cache, cache_lens, q_lens, cache_rows=cache_rows,
                         tree_mask=tree_mask, scale=scale, backend=backend,
                         query_invariant=query_invariant, chain_lens=chain_lens)  # fmt: skip


@_gqa_attention_op.register_fake
def _(q, k_cache, v_cache, cache_lens, q_lens, cache_rows, tree_mask, scale, backend,
      query_invariant=False, chain_lens=None):  # fmt: skip
    return torch.empty_like(q, memory_format=torch.contiguous_format)


@torch.library.custom_op("flashrt::gqa_attention_out", mutates_args=("out", "workspace"))
def _gqa_attention_out_op(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_lens: torch.Tensor,
    q_lens: torch.Tensor, cache_rows: torch.Tensor | None, tree_mask: torch.Tensor | None,
    scale: float | None, out: torch.Tensor, workspace: torch.Tensor, backend: str,
    query_invariant: bool = False, chain_lens: torch.Tensor | None = None,
) -> None:  # fmt: skip
    gqa_attention_into(q, k_cache, v_cache, cache_lens, q_lens, cache_rows, tree_mask, scale,
                       out, workspace, backend, query_invariant, chain_lens)  # fmt: skip
