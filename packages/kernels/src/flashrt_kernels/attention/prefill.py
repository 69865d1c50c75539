"""Packed varlen prefill over a KV pool: the new tokens of several rows back to back.

Row ``b``'s new tokens are ``q[cu_seqlens[b] : cu_seqlens[b + 1]]``; their K/V are already appended
to the pool at ``cache_lens[b] ..``; each attends to the row's committed prefix and causally to the
row's new tokens (``reference.packed_prefill_attention``).

The kernel is the GQA tile kernel of ``decode`` without split-KV (one program per tile of
(token, head) rows and KV head walks the whole visible context; ``splits.PREFILL`` tiles), with
query tiles numbered from the row's own first token: a row's output is bit-identical to the same row run alone, whatever the
other rows (contract ``exact``); against the reference it is ``faithful`` with the bound of
``decode`` (``ATOL_V`` times max|v| plus ``RTOL``).
"""

from __future__ import annotations

import math

import torch

from flashrt_kernels.attention import reference
from flashrt_kernels.attention.decode import (
    DTYPES,
    MAX_HEAD_DIM,
    validate_cache,
    validate_lengths,
)
from flashrt_kernels.attention.gqa_kernels import launch_gqa_tiles
from flashrt_kernels.backends import resolve_backend
from flashrt_kernels.checks import (
    check_float,
    check_int,
    check_no_alias,
    check_out,
    check_tensor,
)

OP = "packed_prefill_attention"
IMPLEMENTED = ("triton", "reference")


def _validate(q, k_cache, v_cache, cu_seqlens, cache_lens, max_seqlen, cache_rows, scale, out):
    check_tensor(OP, "q", q, dtypes=DTYPES, ndim=3, last_dim_contiguous=True)
    t, hq, d = q.shape
    if not 1 <= d <= MAX_HEAD_DIM:
        raise ValueError(f"{OP}: head dim must be in [1, {MAX_HEAD_DIM}], got {d}")
    validate_cache(OP, hq, d, q.dtype, q.device, k_cache, v_cache)
    check_tensor(OP, "cu_seqlens", cu_seqlens, dtypes=(torch.int32,), ndim=1, device=q.device,
                 contiguous=True)  # fmt: skip
    bsz = cu_seqlens.shape[0] - 1
    if bsz < 1:
        raise ValueError(f"{OP}: cu_seqlens must have at least 2 entries, got {bsz + 1}")
    validate_lengths(OP, bsz, q.device, cache_lens=cache_lens, cache_rows=cache_rows)
    check_int(OP, "max_seqlen", max_seqlen, low=0)
    if scale is not None:
        check_float(OP, "scale", scale, positive=True)
    if out is not None:
        check_out(OP, "out", out, shape=q.shape, dtype=q.dtype, device=q.device)
        for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
            check_no_alias(OP, [("out", out), (name, t)])


def packed_prefill_attention_into(q, k_cache, v_cache, cu_seqlens, cache_lens, max_seqlen,
                                  cache_rows, scale, out, backend) -> None:  # fmt: skip
    """Writes ``out`` (tokens past ``cu_seqlens[-1]`` are left untouched); inputs validated."""
    which = resolve_backend(OP, backend, q.device, IMPLEMENTED)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if which == "reference":
        out.copy_(reference.packed_prefill_attention(q, k_cache, v_cache, cu_seqlens, cache_lens,
                                                     cache_rows=cache_rows, scale=scale))  # fmt: skip
        return
    if max_seqlen == 0 or q.shape[0] == 0:
        return
    launch_gqa_tiles(q, k_cache, v_cache, out, cache_lens, None, q_starts=cu_seqlens,
                     cache_rows=cache_rows, mask=None, mask_mode=0, q_max=max_seqlen,
                     split=False, workspace=None, scale=scale)  # fmt: skip


def packed_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cu_seqlens: torch.Tensor,
    cache_lens: torch.Tensor,
    max_seqlen: int,
    *,
    cache_rows: torch.Tensor | None = None,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Packed varlen prefill attention (module docstring). q ``[T, Hq, d]``; ``cu_seqlens`` int32
    ``[B + 1]``; ``cache_lens`` (committed tokens before the new ones) and ``cache_rows`` int32
    ``[B]``; ``max_seqlen`` a host bound on any row's new-token count (it sizes the grid; rows
    longer than it are truncated). With ``out`` nothing is allocated."""
    _validate(q, k_cache, v_cache, cu_seqlens, cache_lens, max_seqlen, cache_rows, scale, out)
    if torch.compiler.is_compiling():
        return torch.ops.flashrt.packed_prefill_attention(
            q, k_cache, v_cache, cu_seqlens, cache_lens, max_seqlen, cache_rows, scale, backend
        )
    if out is None:
        out = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
    packed_prefill_attention_into(q, k_cache, v_cache, cu_seqlens, cache_lens, max_seqlen,
                                  cache_rows, scale, out, backend)  # fmt: skip
    return out


@torch.library.custom_op("flashrt::packed_prefill_attention", mutates_args=())
def _packed_prefill_op(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cu_seqlens: torch.Tensor,
    cache_lens: torch.Tensor, max_seqlen: int, cache_rows: torch.Tensor | None,
    scale: float | None, backend: str,
) -> torch.Tensor:  # fmt: skip
    out = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
    packed_prefill_attention_into(q, k_cache, v_cache, cu_seqlens, cache_lens, max_seqlen,
                                  cache_rows, scale, out, backend)  # fmt: skip
    return out


@_packed_prefill_op.register_fake
def _(q, k_cache, v_cache, cu_seqlens, cache_lens, max_seqlen, cache_rows, scale, backend):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


@torch.library.custom_op("flashrt::packed_prefill_attention_out", mutates_args=("out",))
def _packed_prefill_out_op(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cu_seqlens: torch.Tensor,
    cache_lens: torch.Tensor, max_seqlen: int, cache_rows: torch.Tensor | None,
    scale: float | None, out: torch.Tensor, backend: str,
) -> None:  # fmt: skip
    packed_prefill_attention_into(q, k_cache, v_cache, cu_seqlens, cache_lens, max_seqlen,
                                  cache_rows, scale, out, backend)  # fmt: skip
