"""Host side of the exact select: launch plan, workspace, and the launches of one call.

One call is ``R`` counting rounds over ``S`` programs per row, one collecting pass and one
finishing program per row (``kernels``); with ``S = 1`` (short rows, large batches) it is the
finishing program alone.

With a hint (guess, verify, refine). Guess: round 0 counts the smallest current score at the
hinted positions (entries outside ``[0, length)`` ignored) and that key + 1, the published K-th
key of the previous step and that key + 1, the published accepted key (when ``state`` says
valid), and the hinted key less about 0.2%, 1.6% and 12% in value (no sample is drawn: the hint is
the guess). Verify: those eight counts are exact. Refine: round 1 places eight thresholds inside
the bracket the counts define (log-count interpolation, the bracket ends + 1 / - 1, the key
midpoint); a row still unresolved keeps refining in its finishing program, so exactness never
depends on the hint. Seed lines with exact counts (``seeds``) take the place of round 0.

Nothing is allocated per call once a workspace exists for (device, B, S, chunk, capacity): the
finishing program leaves the counting totals zeroed for the next call. Calls sharing a workspace
must be ordered on one stream (as within one CUDA graph); concurrent calls on several streams are
not supported.
"""

from __future__ import annotations

import math

import torch
import triton

from flashrt_kernels.backends import sm_count, triton_interpreter_active
from flashrt_kernels.topk import kernels as kn
from flashrt_kernels.topk import reference
from flashrt_kernels.topk import state as st

_WORKSPACES: dict[tuple, dict[str, torch.Tensor]] = {}
ROUNDS = 2  # counting rounds of the multi-program path (round 0 guesses, round 1 refines)
RMAX = 2  # round slots in the workspace (a power of two >= ROUNDS)


def capacity(k: int) -> int:
    """Candidates a row may compact for the finishing program: 2x the padded k, at least 4096
    (64 under the interpreter, so that small test rows exercise the counting rounds)."""
    return max(64 if triton_interpreter_active() else 4096, 2 * triton.next_power_of_2(k))


def plan(b: int, n: int, device: torch.device, split: int | None = None):
    """(S, chunk, BLOCK, num_warps): programs per row, elements per program, block, warps."""
    if triton_interpreter_active() or device.type != "cuda":
        block, warps, min_chunk, target = 128, 4, 128, 8
    else:
        block, warps, min_chunk, target = 1024, 4, 4096, 2 * sm_count(device.index or 0)
    if split is None:  # one program per row up to 2 min_chunk; else enough to fill the GPU
        split = 1 if n <= 2 * min_chunk else min(math.ceil(target / max(b, 1)), n // min_chunk)
        split = max(1, split)
    chunk = max(block, triton.cdiv(triton.cdiv(max(n, 1), split), block) * block)
    split = max(1, triton.cdiv(max(n, 1), chunk))
    return split, chunk, block, warps


def workspace(device, b: int, split: int, chunk: int, cap: int) -> dict[str, torch.Tensor]:
    key = (str(device), b, split, chunk, cap)
    ws = _WORKSPACES.get(key)
    if ws is None:
        i32 = {"dtype": torch.int32, "device": device}
        sp = triton.next_power_of_2(split)
        segcap = min(chunk, cap)
        ws = {
            "th": torch.zeros((b, RMAX, kn.G), **i32),
            "tc": torch.zeros((b, RMAX, kn.G), **i32),  # zero between calls
            "pc": torch.zeros((b, RMAX, split, kn.G), **i32),
            "nseg": torch.zeros((b, split), **i32),
            "pfx": torch.zeros((b, sp), **i32),
            "seg": torch.zeros((b, split * segcap), **i32),
            "ck": torch.zeros((b, cap), **i32),  # a row's candidates in index order: keys
            "ci": torch.zeros((b, cap), **i32),  # ... and indices
            "no_state": torch.zeros((b, st.STATE_WORDS), **i32),  # read as "no valid state"
            "no_hint": torch.zeros((b, 1), **i32),
        }
        _WORKSPACES[key] = ws
    return ws


def launch(scores, k, lengths, out_values, out_indices, state, hint, split=None, seeds=None,
           block_maxima=None) -> None:  # fmt: skip
    """All launches of one call. ``hint`` int32 [B, k] or None; ``seeds`` = (keys [B, 8],
    exact counts [B, 8]) replaces round 0 (no counting pass); ``block_maxima`` [B, N/32] lets
    the collecting pass skip blocks below the row's threshold."""
    b, n = scores.shape
    s_split, chunk, block, warps = plan(b, n, scores.device, split)
    cap = capacity(k)
    ws = workspace(scores.device, b, s_split, chunk, cap)
    sp = triton.next_power_of_2(s_split)
    has_len, has_state, hinted = lengths is not None, state is not None, hint is not None
    precounted = seeds is not None
    first_pc = 1 if precounted else 0
    ln = lengths if has_len else ws["nseg"]
    hn = hint if hinted else ws["no_hint"]
    stt = state if has_state else ws["no_state"]
    bm = block_maxima if block_maxima is not None else scores
    bits = torch.int32 if scores.dtype == torch.float32 else torch.int16
    segcap = min(chunk, cap)
    kp = triton.next_power_of_2(k)
    ns = 64 if triton_interpreter_active() else 512
    common = dict(HAS_LEN=has_len, RMAX=RMAX, FIRST_PC=first_pc)
    if precounted:
        ws["th"][:, 0].copy_(seeds[0])
        ws["tc"][:, 0].copy_(seeds[1])
    rounds = 0
    if s_split > 1 or precounted:
        rounds = ROUNDS
        for rnd in range(first_pc, ROUNDS):
            kn._count_kernel[(b, s_split)](
                scores, scores.stride(0), ln, hn, stt, ws["th"], ws["tc"], ws["pc"],
                n, k, chunk, s_split, cap,
                ROUND=rnd, HINTED=hinted, HAS_STATE=has_state, KP=kp if hinted else 1,
                STATE_WORDS=st.STATE_WORDS, NS=ns, BLOCK=block, num_warps=warps, **common,
                enable_fp_fusion=True,
            )  # fmt: skip
        kn._collect_kernel[(b, s_split)](
            scores, scores.stride(0), ln, ws["th"], ws["tc"], ws["pc"], ws["nseg"], ws["seg"],
            out_values.view(bits), out_indices, scores.view(bits), bm, bm.stride(0),
            n, k, chunk, s_split, cap, segcap,
            NR=rounds, SP=sp, HAS_BMAX=block_maxima is not None, BLOCK=block, num_warps=warps,
            **common, enable_fp_fusion=True,
        )  # fmt: skip
    kn._finish_kernel[(b,)](
        scores, scores.stride(0), ln, hn, ws["th"], ws["tc"], ws["pc"], ws["nseg"], ws["pfx"],
        ws["seg"], ws["ck"], ws["ci"], stt, out_values.view(bits), out_indices, scores.view(bits),
        n, k, s_split, cap, segcap,
        NR=rounds, HINTED=hinted, HAS_STATE=has_state, SP=sp, LOG_SP=sp.bit_length() - 1,
        KP=kp if hinted else 1, KO=kp, STATE_WORDS=st.STATE_WORDS, NS=ns, BLOCK=block,
        num_warps=warps, **common, enable_fp_fusion=True,
    )  # fmt: skip


def publish_reference_state(scores, k, lengths, values, indices, state) -> None:
    """The state words a kernel publishes that do not depend on its path, computed with torch
    (for the reference backend): the K-th key is accepted, nothing was counted."""
    b, n = scores.shape
    lens = torch.full((b,), n, device=scores.device) if lengths is None else lengths.long()
    lens = lens.clamp(0, n)
    kk = torch.minimum(lens, torch.full_like(lens, k))
    keys = reference.order_key(scores)
    sel = torch.where(indices >= 0, indices, torch.zeros_like(indices)).long()
    picked = torch.where(
        indices >= 0, torch.gather(keys, 1, sel), torch.full_like(indices, 2**31 - 1)
    )
    kth = picked.min(1).values
    valid = torch.arange(n, device=scores.device)[None, :] < lens[:, None]
    at_least = (valid & (keys >= kth[:, None])).sum(1)
    state.zero_()
    state[:, st.VALID] = (kk > 0).int()
    state[:, st.KTH_KEY] = torch.where(kk > 0, kth, torch.zeros_like(kth))
    state[:, st.ACCEPTED_KEY] = state[:, st.KTH_KEY]
    state[:, st.ACCEPTED_COUNT] = torch.where(kk > 0, at_least, torch.zeros_like(at_least)).int()
    state[:, st.LENGTH] = lens.int()
    state[:, st.K] = k
