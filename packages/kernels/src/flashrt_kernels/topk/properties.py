"""Properties of the top-K family, run by the tests (both scales) and ``flashrt check``.

Every check compares bit for bit with ``reference.topk`` evaluated on the CPU: values (their bits)
and indices, pads included, into poisoned output buffers.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from flashrt_kernels.backends import backend_runs_on
from flashrt_kernels.registry import Property, register_property
from flashrt_kernels.testing import (
    assert_exact,
    dtypes,
    make_values,
    poison,
    seeds,
    sizes,
    test_device,
    value_kinds,
)
from flashrt_kernels.testing.chains import ScoreChain
from flashrt_kernels.topk import reference, select
from flashrt_kernels.topk import state as st_
from flashrt_kernels.topk.api import topk

KINDS = ("normal", "ties", "zeros", "relu_plateau", "inf", "nan", "huge", "denormal", "outlier")
HINTS = ("previous", "zeros", "duplicates", "out_of_range", "bottom", "random")
STATES = ("none", "published", "stale", "garbage")
REAL_N = (8192, 32768, 131072, 262144, 1 << 20)
MAX_ELEMS = 16 * 2**20


def _backends(scale: str) -> tuple[str, ...]:
    """The kernel backends a scale checks: Triton everywhere, CUDA where it runs (real scale)."""
    if scale == "small":
        return ("triton",)
    return tuple(b for b in ("cuda", "triton") if backend_runs_on(b, test_device()))


def _cases(scale: str, hinted: bool = False, max_cols: int = 600):
    if scale == "small":
        d = {
            "rows": sizes(1, 4 if max_cols > 300 else 2),
            "cols": sizes(1, max_cols, (1, 2, 63, 64, 65, 127, 128, 129, 255, 256, 257, max_cols)),
            "k": st.sampled_from((1, 2, 7, 31, 32, 33, 64, 100, 300, 700)),
            "split": st.sampled_from((None, 1, 2, 3, 5)),
        }
    else:
        d = {
            "rows": st.sampled_from((1, 2, 8, 64)),
            "cols": st.sampled_from(REAL_N + (5000, 100003)),
            "k": st.sampled_from((512, 1024, 2048, 1, 3000, 4096)),
            "split": st.sampled_from((None, None, 1, 7)),
        }
    d.update(
        dtype=dtypes(torch.float32, torch.bfloat16, torch.float16),
        kind=value_kinds(*KINDS),
        lengths=st.sampled_from(("none", "full", "random")),
        seed=seeds(),
        backend=st.sampled_from(_backends(scale)),
    )
    if hinted:
        d.update(hint=st.sampled_from(HINTS), state=st.sampled_from(STATES),
                 drift=st.sampled_from((0.0, 0.01, 0.1, 1.0)))  # fmt: skip
    return st.fixed_dictionaries(d)


def _examples(scale: str, hinted: bool = False):
    base = {"dtype": torch.float32, "kind": "normal", "lengths": "none", "seed": 0,
            "backend": "triton"}  # fmt: skip
    extra = {"hint": "previous", "state": "published", "drift": 0.01} if hinted else {}
    if scale == "small":
        shapes = [(1, 1, 1, None), (2, 64, 64, 2), (3, 129, 200, 3), (1, 600, 33, 5)]
        out = [{**base, **extra, "rows": r, "cols": c, "k": k, "split": s} for r, c, k, s in shapes]
        out.append({**out[1], "kind": "zeros", "k": 7})
        out.append({**out[3], "kind": "ties", "lengths": "random"})
        return out
    shapes = [(1, 1 << 20, 512, None), (8, 131072, 2048, None), (64, 8192, 1024, None)]
    out = [{**base, **extra, "rows": r, "cols": c, "k": k, "split": s} for r, c, k, s in shapes]
    out.append({**out[0], "kind": "zeros", "k": 2048})  # ties far beyond any capacity
    out.append({**out[1], "kind": "relu_plateau", "lengths": "random"})
    # one-block rows: candidates in per-warp regions (normal), or too many of them (zeros)
    out.append({**out[2], "rows": 2, "cols": 32768, "k": 2048})
    out.append({**out[2], "rows": 2, "cols": 32768, "k": 2048, "kind": "zeros"})
    return [{**case, "backend": b} for b in _backends(scale) for case in out]


def _rows(case) -> int:
    return max(1, min(case["rows"], MAX_ELEMS // case["cols"]))


def _lengths(case, rows, device):
    if case["lengths"] == "none":
        return None
    n = case["cols"]
    if case["lengths"] == "full":
        return torch.full((rows,), n, dtype=torch.int32, device=device)
    g = torch.Generator().manual_seed(case["seed"])
    lens = torch.randint(0, n + 3, (rows,), generator=g, dtype=torch.int32)
    lens[0] = min(n, max(0, case["k"] - 1))  # fewer valid elements than k
    return lens.to(device)


def _expect(x, k, lens):
    return reference.topk(x.cpu(), k, lens.cpu() if lens is not None else None)


def _assert_same(got, want, what):
    (v, i), (rv, ri) = got, want
    assert_exact(i, ri, what=f"{what} indices")
    bits = torch.int32 if v.dtype == torch.float32 else torch.int16
    assert_exact(v.cpu().view(bits), rv.view(bits), what=f"{what} value bits")


def _run(x, k, lens, case, hint=None, state=None):
    rows = x.shape[0]
    ov = poison(torch.empty((rows, k), dtype=x.dtype, device=x.device))
    oi = poison(torch.empty((rows, k), dtype=torch.int32, device=x.device))
    if case["split"] is None:
        topk(x, k, lengths=lens, out_values=ov, out_indices=oi, hint=hint, state=state,
             backend=case["backend"])  # fmt: skip
    elif case["backend"] == "cuda":
        from flashrt_kernels.topk import cuda_select

        cuda_select.launch(x, k, lens, ov, oi, state, hint, case["split"])
    else:
        select.launch(x, k, lens, ov, oi, state, hint, case["split"])
    return ov, oi


def _check_matches_reference(case) -> None:
    device, rows, k, n = test_device(), _rows(case), case["k"], case["cols"]
    x = make_values(case["kind"], (rows, n), case["dtype"], case["seed"], device)
    lens = _lengths(case, rows, device)
    state = st_.new_state(rows, device)
    want = _expect(x, k, lens)
    _assert_same(_run(x, k, lens, case, state=state), want, "hint-free top-k")
    check_state(state, x, k, lens, want[0])
    if case["backend"] == "cuda" and case["kind"] == "normal" and lens is None:
        check_cuda_bound(state, k, n, case["split"])


def check_cuda_bound(state, k, n, split) -> None:
    """The CUDA backend's hint-free bound on unstructured rows it splits: the kk-th largest of
    4 pow2(kk) group maxima admits the row's candidates in the first counting pass (ROUNDS 1),
    about 1.15 kk of them (the smallest of pow2(kk) maxima admitted kk ln kk: > 6 kk at 512)."""
    from flashrt_kernels.topk import cuda_select

    if split is None and n <= cuda_select.SHORT_MAX:
        return  # one block: no bound
    if split is None and cuda_select._use_clusters(state.shape[0], n, state.device, None, None,
                                                   False) is not None:  # fmt: skip
        return  # thread-block clusters: every row read once, no bound
    kk = min(k, n)
    rounds, count = state[:, st_.ROUNDS].cpu(), state[:, st_.ACCEPTED_COUNT].cpu()
    assert bool((rounds == 1).all()), f"the bound did not admit the candidates: rounds {rounds}"
    loose = count > 2 * kk + 16
    assert not bool(loose.any()), f"bound admits {count.max().item()} keys for k = {kk}"


def check_state(state, x, k, lens, want_values) -> None:
    """The published state's words are what ``state`` documents (exact keys and counts)."""
    s = state.cpu().long()
    x, rows, n = x.cpu(), x.shape[0], x.shape[1]
    length = torch.full((rows,), n) if lens is None else lens.cpu().long().clamp(0, n)
    kk = length.clamp(max=k)
    keys = reference.order_key(x).long()
    valid = torch.arange(n)[None, :] < length[:, None]
    assert torch.equal(s[:, st_.VALID], (kk > 0).long()), "state VALID"
    assert torch.equal(s[:, st_.LENGTH], length) and bool((s[:, st_.K] == k).all()), "LENGTH/K"
    for r in range(rows):
        if kk[r] == 0:
            continue
        kth = reference.order_key(want_values[r, : kk[r]]).min()
        assert s[r, st_.KTH_KEY] == kth, f"row {r}: KTH_KEY {s[r, st_.KTH_KEY]} != {kth}"
        cnt = (valid[r] & (keys[r] >= s[r, st_.ACCEPTED_KEY])).sum()
        assert s[r, st_.ACCEPTED_COUNT] == cnt, f"row {r}: ACCEPTED_COUNT"
        assert s[r, st_.ACCEPTED_COUNT] >= kk[r], f"row {r}: accepted threshold admits < k"
        counted = int(s[r, st_.ROUNDS]) >= 1
        assert s[r, st_.N_TRIED] == (8 if counted else 0), f"row {r}: N_TRIED"
        for i in range(int(s[r, st_.N_TRIED])):
            c = (valid[r] & (keys[r] >= s[r, st_.TRIED_KEY + i])).sum()
            assert s[r, st_.TRIED_COUNT + i] == c, f"row {r}: TRIED_COUNT[{i}]"


def _hint(kind, prev, rows, k, n, seed, x):
    g = torch.Generator().manual_seed(seed + 7)
    if kind == "previous":
        return prev
    if kind == "zeros":
        return torch.zeros((rows, k), dtype=torch.int32)
    if kind == "duplicates":
        return prev[:, :1].expand(rows, k).contiguous()
    if kind == "out_of_range":
        h = torch.randint(-(2**31), 2**31 - 1, (rows, k), generator=g, dtype=torch.int32)
        return torch.where(h.abs() < n, h + n, h)
    if kind == "bottom":
        kb = min(k, n)
        low = torch.topk(x.cpu().float().nan_to_num(0.0), kb, largest=False).indices.int()
        return low.repeat(1, -(-k // kb))[:, :k].contiguous()
    return torch.randint(0, max(n, 1), (rows, k), generator=g, dtype=torch.int32)


def _check_hinted(case) -> None:
    device, rows, k, n = test_device(), _rows(case), case["k"], case["cols"]
    if case["kind"] == "normal":
        chain = ScoreChain(rows, n, drift=case["drift"], dtype=case["dtype"], seed=case["seed"],
                           device="cpu")  # fmt: skip
        x0, _ = chain.step()
        x1, _ = chain.step()
    else:
        x0 = make_values(case["kind"], (rows, n), case["dtype"], case["seed"])
        x1 = make_values(case["kind"], (rows, n), case["dtype"], case["seed"] + 1)
    x0, x1 = x0.to(device), x1.to(device)
    lens = _lengths(case, rows, device)
    state = None if case["state"] == "none" else st_.new_state(rows, device)
    prev = _expect(x0, k, lens)[1]
    if case["state"] == "published":
        topk(x0, k, lengths=lens, state=state, backend=case["backend"])
    elif case["state"] == "stale":
        topk(x0.flip(0), k, state=state, backend=case["backend"])
    elif case["state"] == "garbage":
        g = torch.Generator().manual_seed(case["seed"])
        state.copy_(torch.randint(-(2**31), 2**31 - 1, state.shape, generator=g).int())
        state[:, st_.VALID] = 1
    hint = _hint(case["hint"], prev, rows, k, n, case["seed"], x1).to(device)
    want = _expect(x1, k, lens)
    _assert_same(_run(x1, k, lens, case, hint, state), want, f"top-k with a {case['hint']} hint")
    if state is not None:
        check_state(state, x1, k, lens, want[0])
        good = case["hint"] == "previous" and case["kind"] == "normal" and case["drift"] <= 0.01
        if good and lens is None and 8 * k <= n:
            rounds = state[:, st_.ROUNDS].cpu()
            assert bool((rounds <= 1).all()), f"a good hint needed more rounds: {rounds}"


register_property(
    Property("topk", "matches_reference", _cases, _check_matches_reference, _examples)
)
register_property(
    Property(
        "topk",
        "hinted_matches_reference",
        lambda scale: _cases(scale, True, 300),
        _check_hinted,
        lambda scale: _examples(scale, True),
    )
)


CONSUMERS = ("seeded", "seeded_bmax", "hinted_bmax", "list")
LINE_KINDS = ("admit", "too_many", "too_few", "nan_line")
LIST_KINDS = ("complete", "void", "short", "claim_mismatch")


def _consumer_cases(scale: str):
    base = _cases(scale, max_cols=300)
    return st.fixed_dictionaries(
        {
            "base": base,
            "consumer": st.sampled_from(CONSUMERS),
            "line": st.sampled_from(LINE_KINDS),
            "list": st.sampled_from(LIST_KINDS),
            "loose": st.booleans(),  # block maxima an upper bound rather than exact
        }
    )


def _consumer_examples(scale: str):
    ex = _examples(scale)
    out = []
    for i, c in enumerate(CONSUMERS):
        out.append({"base": ex[i % len(ex)], "consumer": c, "line": "admit", "list": "complete",
                    "loose": False})  # fmt: skip
    out.append({**out[0], "line": "too_many", "base": ex[-2]})
    out.append({**out[3], "list": "void"})
    return out


def _block_maxima(x, lens, loose):
    from flashrt_kernels.topk.hints import BLOCK

    b, n = x.shape
    keys = reference.order_key(x).float()  # rank in key space, then map back to the values
    valid = torch.arange(n, device=x.device)[None, :] < (
        n if lens is None else lens.long()[:, None]
    )
    pad = (-n) % BLOCK
    xf = torch.where(valid, x.float(), torch.full_like(x.float(), float("-inf")))
    xf = torch.nn.functional.pad(xf, (0, pad), value=float("-inf")).view(b, -1, BLOCK)
    del keys
    mx = xf.amax(-1)  # NaN-propagating: a block with a NaN has maximum NaN
    return torch.where(torch.isnan(mx), mx, mx + 1.0) if loose else mx


def _check_consumer(case) -> None:
    from flashrt_kernels.topk import hints

    c, base = case["consumer"], case["base"]
    device, rows, k, n = test_device(), _rows(base), base["k"], base["cols"]
    x = make_values(base["kind"], (rows, n), base["dtype"], base["seed"], device)
    lens = _lengths(base, rows, device)
    want = _expect(x, k, lens)
    ov = poison(torch.empty((rows, k), dtype=x.dtype, device=device))
    oi = poison(torch.empty((rows, k), dtype=torch.int32, device=device))
    bm = _block_maxima(x, lens, case["loose"]) if c.endswith("bmax") else None
    xc = x.cpu()
    comp = reference.composite_key(xc, lens.cpu() if lens is not None else None)
    keys = reference.order_key(xc)
    valid = comp > -(2**63)
    if c.startswith("seeded"):
        kk = min(k, n)
        ranks = {"admit": [kk - 1, min(n - 1, kk + kk // 2), 0], "too_many": [n - 1],
                 "too_few": [max(0, kk // 2 - 1)], "nan_line": [0]}[case["line"]]  # fmt: skip
        sorted_vals = torch.sort(comp, 1, descending=True).values
        line_keys = (sorted_vals[:, ranks] >> 32) + 1
        lines = torch.stack([torch.tensor([_key_value(int(v)) for v in r]) for r in line_keys])
        if case["line"] == "nan_line":
            lines[:] = float("nan")
        lk = reference.order_key(lines)
        counts = (valid[:, None, :] & (keys[:, None, :] >= lk[:, :, None])).sum(-1).int()
        seeds = hints.SeedLines(lines.to(device), counts.to(device))
        hints.topk_seeded(x, k, seeds, block_maxima=bm, lengths=lens, out_values=ov,
                          out_indices=oi)  # fmt: skip
        _assert_same((ov, oi), want, f"{c} top-k ({case['line']} lines)")
    elif c == "hinted_bmax":
        prev = want[1].to(device)
        hints.topk_hinted(x, k, prev, block_maxima=bm, lengths=lens, out_values=ov,
                          out_indices=oi)  # fmt: skip
        _assert_same((ov, oi), want, "hinted top-k with block maxima")
    else:
        g = torch.Generator().manual_seed(base["seed"])
        m = min(n, k + 5) if case["list"] != "short" else max(0, min(n, k) - 1)
        top = torch.sort(comp, 1, descending=True).values[:, :m]
        idx = ((((top >> 32) + 1) << 32) - 1 - top).int()
        idx = torch.where(top > -(2**63), idx, torch.full_like(idx, -1))
        width = m + 3
        li = torch.full((rows, width), -1, dtype=torch.int32)
        li[:, :m] = idx
        perm = torch.argsort(torch.rand((rows, width), generator=g), 1)
        li = torch.gather(li, 1, perm)
        lv = torch.where(
            li >= 0,
            torch.gather(xc.float(), 1, li.clamp(min=0).long()),
            torch.full((rows, width), 7.0),
        )  # sentinel pads with a large value
        claimed = (li >= 0).sum(1).int()
        void = torch.zeros(rows, dtype=torch.bool)
        if case["list"] == "void":
            void[:] = True
        if case["list"] == "claim_mismatch":
            claimed += 1
        cl = hints.CandidateList(lv.to(device), li.to(device), claimed.to(device), void.to(device))
        admitted = hints.list_admitted(cl, k, lens, n).cpu()
        if case["list"] == "complete" and lens is None and k <= n:
            assert bool(admitted.all()), "a complete list of >= k real entries is admitted"
        if case["list"] != "complete":
            assert not bool(admitted.any()), f"a {case['list']} list must be demoted"
        hints.topk_from_list(x, k, cl, lengths=lens, out_values=ov, out_indices=oi,
                             backend="triton")  # fmt: skip
        _assert_same((ov, oi), want, f"top-k from a {case['list']} candidate list")


def _key_value(key: int) -> float:
    return st_.key_to_value(key)


register_property(
    Property(
        "topk", "consumers_match_reference", _consumer_cases, _check_consumer, _consumer_examples
    )  # fmt: skip
)
