"""Top-K benchmark: ours (hint-free and with the previous step's hint) vs ``torch.topk``.

fp32 scores from a correlated chain (``testing.chains.ScoreChain``, drift 0.02): input set ``t``
is step ``t`` of the chain and its hint is the exact top-k indices of step ``t - 1``. Every timing
is a CUDA graph over the rotated sets (``benchmarking.time_graph_us``); ``torch.topk`` runs with
``sorted=False`` (its fastest mode). "ours" is the default backend (CUDA where CuPy is installed);
``triton_us`` is the Triton backend's hint-free time in the same run. The floor is one read of the
scores.
The hinted call gets no ``state`` (it would be republished from the same step on every replay).
"""

from __future__ import annotations

import torch

from flashrt_kernels.benchmarking import floor_us, rotation, time_graph_us
from flashrt_kernels.registry import register_benchmark
from flashrt_kernels.testing.chains import ScoreChain
from flashrt_kernels.topk import reference
from flashrt_kernels.topk import state as st
from flashrt_kernels.topk.api import topk

BATCHES = (1, 8, 64)
LENGTHS = (8192, 32768, 131072, 262144, 1 << 20)
KS = (512, 1024, 2048)
MAX_ELEMS = 16 * 2**20
DRIFT = 0.02
REP = 40  # ms of graph replays per timing


def _sets(b, n, k, count):
    chain = ScoreChain(b, n, drift=DRIFT, seed=b * 7 + n + k, device="cuda")
    prev = chain.step()[0]
    out = []
    for _ in range(count):
        x = chain.step()[0]
        hint = topk(prev, k)[1]
        ov = torch.empty((b, k), device="cuda")
        oi = torch.empty((b, k), dtype=torch.int32, device="cuda")
        out.append((x, hint, ov, oi))
        prev = x
    return out


def _admitted_and_exact(sets, k) -> tuple[float, bool]:
    """Fraction of rows the hint admitted, and whether both paths match the reference exactly."""
    x, hint, ov, oi = sets[-1]
    want = reference.topk(x, k)
    state = st.new_state(x.shape[0], "cuda")
    hv, hi = topk(x, k, hint=hint, state=state)
    fv, fi = topk(x, k)
    exact = all(torch.equal(a.view(torch.int32), b.view(torch.int32))
                for a, b in ((hv, want[0]), (fv, want[0]), (hi, want[1]), (fi, want[1])))  # fmt: skip
    return float((state[:, st.ROUNDS] <= 1).float().mean()), exact


@register_benchmark(
    "topk", "topk", "exact top-K (hint-free, previous-step hint) vs torch.topk",
    plots={"by_length": {"x": "N", "ys": ["torch_us", "ours_us", "hint_us", "floor_us"],
                         "by": ["B", "K"]}},
)  # fmt: skip
def run(quick: bool = False) -> list[dict]:
    rows = []
    batches, lengths = (BATCHES[:2], LENGTHS[::2]) if quick else (BATCHES, LENGTHS)
    for b in batches:
        for n in lengths:
            if b * n > MAX_ELEMS:
                continue
            for k in KS:
                nbytes = b * n * 4
                sets = _sets(b, n, k, rotation(nbytes, limit=16))
                free = [
                    lambda s=s, k=k: topk(s[0], k, out_values=s[2], out_indices=s[3]) for s in sets
                ]
                hinted = [
                    lambda s=s, k=k: topk(s[0], k, hint=s[1], out_values=s[2], out_indices=s[3])
                    for s in sets
                ]
                base = [lambda s=s, k=k: torch.topk(s[0], k, sorted=False) for s in sets]
                tri = [
                    lambda s=s, k=k: topk(
                        s[0], k, out_values=s[2], out_indices=s[3], backend="triton"
                    )
                    for s in sets
                ]
                t_free, t_hint = time_graph_us(free, rep_ms=REP), time_graph_us(hinted, rep_ms=REP)
                t_tri = time_graph_us(tri, rep_ms=REP)
                t_torch = time_graph_us(base, rep_ms=REP)
                fl = floor_us(nbytes)
                adm, exact = _admitted_and_exact(sets, k)
                rows.append(
                    {
                        "B": b,
                        "N": n,
                        "K": k,
                        "torch_us": t_torch,
                        "ours_us": t_free,
                        "x_torch": t_torch / t_free,
                        "triton_us": t_tri,
                        "hint_us": t_hint,
                        "x_hintfree": t_free / t_hint,
                        "hint_x_torch": t_torch / t_hint,
                        "admitted": adm,
                        "exact": exact,
                        "floor_us": fl,
                        "floor_frac": fl / t_free,
                        "hint_floor_frac": fl / t_hint,
                    }
                )
                print({c: round(v, 2) if isinstance(v, float) else v for c, v in rows[-1].items()},
                      flush=True)  # fmt: skip
                del sets
    return rows
