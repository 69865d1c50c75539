"""``topk``: the public entry point (validation, backend dispatch, out= buffers, custom op).

Contract ``exact``: every backend returns bit for bit ``reference.topk`` (the k highest-ranked
elements -- NaN highest, ties at the K-th value by lowest index -- listed in ascending index order,
pads index -1 / value -inf), whatever ``hint`` and ``state`` hold. ``sorted=True`` reorders the
result by rank (``reference.sort_by_rank``). ``lengths`` entries are clamped to ``[0, N]``.
"""

from __future__ import annotations

import torch

from flashrt_kernels.backends import resolve_backend
from flashrt_kernels.checks import check_int, check_out, check_tensor
from flashrt_kernels.topk import reference
from flashrt_kernels.topk.state import STATE_WORDS

OP = "topk"
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_K = 4096  # the Triton and CUDA backends select up to this many per row
IMPLEMENTED = ("cuda", "triton", "reference")


def _validate(scores, k, lengths, out_values, out_indices, hint, state):
    check_tensor(OP, "scores", scores, dtypes=DTYPES, ndim=2, last_dim_contiguous=True)
    b, n = scores.shape
    check_int(OP, "k", k, low=1)
    dev = scores.device
    if lengths is not None:
        check_tensor(OP, "lengths", lengths, dtypes=(torch.int32,), shape=[b], device=dev,
                     contiguous=True)  # fmt: skip
    if out_values is not None:
        check_out(OP, "out_values", out_values, shape=(b, k), dtype=scores.dtype, device=dev)
    if out_indices is not None:
        check_out(OP, "out_indices", out_indices, shape=(b, k), dtype=torch.int32, device=dev)
    if hint is not None:
        check_tensor(OP, "hint", hint, dtypes=(torch.int32,), shape=[b, k], device=dev,
                     contiguous=True)  # fmt: skip
    if state is not None:
        check_out(OP, "state", state, shape=(b, STATE_WORDS), dtype=torch.int32, device=dev)


def topk_into(scores, k, lengths, out_values, out_indices, hint, state, backend) -> None:
    """Writes ``out_values`` / ``out_indices`` (and ``state``); inputs validated. No host sync."""
    which = resolve_backend(OP, backend, scores.device, IMPLEMENTED)
    if which in ("triton", "cuda") and k > MAX_K:
        if backend == which:
            raise ValueError(f"{OP}: backend {which!r} supports k <= {MAX_K}, got {k}")
        which = "reference"
    if which == "reference" or scores.shape[0] == 0:
        v, i = reference.topk(scores, k, lengths)
        out_values.copy_(v)
        out_indices.copy_(i)
        if state is not None:
            from flashrt_kernels.topk.select import publish_reference_state

            publish_reference_state(scores, k, lengths, v, i, state)
        return
    if which == "cuda":
        from flashrt_kernels.topk import cuda_select

        cuda_select.launch(scores, k, lengths, out_values, out_indices, state, hint)
        return
    from flashrt_kernels.topk import select

    select.launch(scores, k, lengths, out_values, out_indices, state, hint)


def topk(
    scores: torch.Tensor,
    k: int,
    *,
    lengths: torch.Tensor | None = None,
    out_values: torch.Tensor | None = None,
    out_indices: torch.Tensor | None = None,
    hint: torch.Tensor | None = None,
    state: torch.Tensor | None = None,
    sorted: bool = False,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic top-``k`` of each row of ``scores`` [B, N] over its first ``lengths[b]``.

    Returns ``(values [B, k] scores.dtype, indices [B, k] int32)``; ``out_values`` /
    ``out_indices`` are written when given (no allocation then on the hint-free path: CUDA-graph
    safe). ``hint`` int32 [B, k]: the previous step's indices (any content; see ``hints``).
    ``state`` int32 [B, STATE_WORDS]: caller-owned, read as a guess and republished (``state``).
    The selection is listed in ascending index order; ``sorted=True`` lists it by rank instead
    (one extra sort of the [B, k] result). ``backend``: ``"auto"`` (``"cuda"`` -- the CUDA C++
    select, needs CuPy -- else ``"triton"`` on a GPU; ``"reference"`` on a CPU), or one of them.
    """
    _validate(scores, k, lengths, out_values, out_indices, hint, state)
    if torch.compiler.is_compiling():
        v, i = torch.ops.flashrt.topk(scores, k, lengths, hint, backend)
        return reference.sort_by_rank(v, i) if sorted else (v, i)
    b = scores.shape[0]
    if out_values is None:
        out_values = torch.empty((b, k), dtype=scores.dtype, device=scores.device)
    if out_indices is None:
        out_indices = torch.empty((b, k), dtype=torch.int32, device=scores.device)
    topk_into(scores, k, lengths, out_values, out_indices, hint, state, backend)
    if sorted:
        v, i = reference.sort_by_rank(out_values, out_indices)
        out_values.copy_(v)
        out_indices.copy_(i)
    return out_values, out_indices


@torch.library.custom_op("flashrt::topk", mutates_args=())
def _topk_op(
    scores: torch.Tensor,
    k: int,
    lengths: torch.Tensor | None,
    hint: torch.Tensor | None,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    b = scores.shape[0]
    v = torch.empty((b, k), dtype=scores.dtype, device=scores.device)
    i = torch.empty((b, k), dtype=torch.int32, device=scores.device)
    topk_into(scores, k, lengths, v, i, hint, None, backend)
    return v, i


@_topk_op.register_fake
def _(scores, k, lengths, hint, backend):
    b = scores.shape[0]
    return scores.new_empty((b, k)), scores.new_empty((b, k), dtype=torch.int32)
