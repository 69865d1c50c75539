"""Host side of the exact select: launch plan, workspace, and the hint-free radix path.

The hint-free path is five launches whatever the split (see ``kernels``): three histogram passes
over the order key (11 + 11 + 10 bits), one collect pass, one per-row sort of the k candidates.
Nothing is allocated per call once a workspace exists for (device, B, split, capacity): the final
kernel leaves the workspace zeroed for the next call. Calls sharing a workspace must be ordered on
one stream (as within one CUDA graph); concurrent calls on several streams are not supported.
"""

from __future__ import annotations

import functools
import math

import torch
import triton

from flashrt_kernels.backends import triton_interpreter_active
from flashrt_kernels.topk import kernels as kn
from flashrt_kernels.topk import reference
from flashrt_kernels.topk import state as st

_WORKSPACES: dict[tuple, dict[str, torch.Tensor]] = {}


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def plan(b: int, n: int, device: torch.device, split: int | None = None):
    """(S, chunk, BLOCK, num_warps): programs per row, elements per program, block, warps."""
    if triton_interpreter_active() or device.type != "cuda":
        block, warps, min_chunk, target = 128, 4, 128, 8
    else:
        block, warps, min_chunk, target = 2048, 8, 8192, 2 * _sm_count(device.index or 0)
    if split is None:
        split = max(1, min(math.ceil(target / max(b, 1)), math.ceil(n / min_chunk)))
    chunk = max(block, triton.cdiv(triton.cdiv(max(n, 1), split), block) * block)
    split = max(1, triton.cdiv(max(n, 1), chunk))
    return split, chunk, block, warps


def workspace(device, b: int, split: int, cap: int) -> dict[str, torch.Tensor]:
    key = (str(device), b, split, cap)
    ws = _WORKSPACES.get(key)
    if ws is None:
        i32 = {"dtype": torch.int32, "device": device}
        ws = {
            "hist": torch.zeros((b, 3, kn.NB), **i32),
            "cnt": torch.zeros((b,), **i32),
            "tcnt": torch.zeros((b, 4), **i32),
            "th": torch.zeros((b, 4), **i32),
            "lhist": torch.zeros((b, split, kn.NB_LOW), **i32),
            "cand": torch.zeros((b, cap), **i32),
            "no_state": torch.zeros((b, st.STATE_WORDS), **i32),  # read as "no valid state"
        }
        _WORKSPACES[key] = ws
    return ws


def launch(scores, k, lengths, out_values, out_indices, state, hint, cap, split=None,
           seeds=None, block_maxima=None) -> None:  # fmt: skip
    """All launches of one call; ``hint`` None is the hint-free path. ``seeds`` = (keys [B, 4],
    counts [B, 4]) replaces the guesses and their counting pass; ``block_maxima`` [B, N/32]
    lets the collecting pass skip blocks below the accepted threshold."""
    b, n = scores.shape
    s_split, chunk, block, warps = plan(b, n, scores.device, split)
    ws = workspace(scores.device, b, s_split, cap)
    kp = triton.next_power_of_2(k)
    has_len, has_state = lengths is not None, state is not None
    precounted = seeds is not None
    hinted = hint is not None or precounted
    if precounted:
        ws["th"].copy_(seeds[0])
        ws["tcnt"].copy_(seeds[1])
    has_bm = block_maxima is not None
    bm = block_maxima if has_bm else scores
    ln = lengths if has_len else ws["cnt"]
    hn = hint if hint is not None else ws["cnt"]
    stt = state if has_state else ws["no_state"]
    bits = torch.int32 if scores.dtype == torch.float32 else torch.int16
    if s_split == 1 and not hinted:
        kn._row_select_kernel[(b,)](
            scores, scores.stride(0), ln, ws["cand"], stt, out_values.view(bits), out_indices,
            scores.view(bits), n, k,
            HAS_LEN=has_len, HAS_STATE=has_state, CAP=cap, STATE_WORDS=st.STATE_WORDS,
            BLOCK=block, num_warps=warps,
        )  # fmt: skip
        return
    common = (scores, scores.stride(0), ln, ws["hist"])
    for rnd in range(3):
        kn._pass_kernel[(b, s_split)](
            *common, ws["lhist"], ws["cnt"], ws["cand"], hn, stt, ws["tcnt"], ws["th"],
            bm, bm.stride(0), n, k, chunk, s_split, cap,
            ROUND=rnd, HAS_LEN=has_len, HINTED=hinted, NBINS=kn.NB_LOW if rnd == 2 else kn.NB,
            PRECOUNTED=precounted, HAS_BMAX=has_bm and rnd == 1, KP=kp if hinted else 1,
            STATE_WORDS=st.STATE_WORDS, BLOCK=block, num_warps=warps,
        )  # fmt: skip
    kn._collect_kernel[(b, s_split)](
        *common, ws["lhist"], ws["cnt"], ws["cand"], ws["tcnt"], ws["th"],
        n, k, chunk, s_split, cap,
        HAS_LEN=has_len, HINTED=hinted, SP=triton.next_power_of_2(s_split),
        BLOCK=block, num_warps=warps,
    )  # fmt: skip
    kn._finish_kernel[(b,)](
        *common, ws["cnt"], ws["cand"], ws["tcnt"], ws["th"], stt, out_values.view(bits),
        out_indices, scores.view(bits),
        n, k,
        HAS_LEN=has_len, HINTED=hinted, HAS_STATE=has_state, CAP=cap, KO=kp,
        STATE_WORDS=st.STATE_WORDS, num_warps=8 if cap >= 2048 else 4,
    )  # fmt: skip


def select(scores, k, lengths, out_values, out_indices, state, split=None) -> None:
    """Hint-free exact top-k into the out buffers (validated by the caller)."""
    launch(scores, k, lengths, out_values, out_indices, state, None,
           triton.next_power_of_2(k), split)  # fmt: skip


def publish_reference_state(scores, k, lengths, values, state) -> None:
    """The state the radix path publishes, computed with torch (for the reference backend)."""
    b, n = scores.shape
    lens = torch.full((b,), n, device=scores.device) if lengths is None else lengths.long()
    lens = lens.clamp(0, n)
    kk = torch.minimum(lens, torch.full_like(lens, k))
    last = (kk - 1).clamp(min=0)
    kth = reference.order_key(torch.gather(values.float(), 1, last[:, None]))[:, 0]
    keys = reference.order_key(scores)
    valid = torch.arange(n, device=scores.device)[None, :] < lens[:, None]
    at_least = (valid & (keys >= kth[:, None])).sum(1)
    state.zero_()
    state[:, st.VALID] = (kk > 0).int()
    state[:, st.KTH_KEY] = torch.where(kk > 0, kth, torch.zeros_like(kth))
    state[:, st.ACCEPTED_KEY] = state[:, st.KTH_KEY]
    state[:, st.ACCEPTED_COUNT] = torch.where(kk > 0, at_least, torch.zeros_like(at_least)).int()
    state[:, st.PATH] = st.PATH_RADIX
    state[:, st.LENGTH] = lens.int()
    state[:, st.K] = k
