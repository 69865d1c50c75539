"""Hazard 5 (ties, plateaus, inf/NaN, N < K, degenerate hints): every tier's selection equals the
deterministic top-K bit for bit; plus the exactness check of the research notes against
torch.topk's value multiset."""

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from flashrt_dsv4_indexer import reference, topk_stage
from flashrt_kernels.testing.assertions import assert_exact
from flashrt_kernels.testing.strategies import seeds, sizes, test_device
from flashrt_kernels.testing.values import make_values

HINTS = ("none", "prev", "zeros", "duplicates", "out_of_range", "bottom_k")


def make_hint(kind, scores, lengths, k, g):
    b, n = scores.shape
    if kind == "zeros":
        return torch.zeros(b, k, dtype=torch.int32)
    if kind == "duplicates":
        return torch.full((b, k), 3, dtype=torch.int32)
    if kind == "out_of_range":
        return torch.randint(-5, 2 * n + 5, (b, k), generator=g).int()
    if kind == "bottom_k":
        return torch.argsort(scores.nan_to_num(0.0), 1)[:, :k].int() if n >= k else None
    if kind == "prev":
        return reference.topk(scores + 0.1 * torch.randn(b, n, generator=g), k, lengths)[1]
    return None


def check_selection(case):
    dev = test_device()
    g = torch.Generator().manual_seed(case["seed"])
    b, n, k = case["b"], case["n"], case["k"]
    scores = make_values(case["kind"], (b, n), torch.float32, case["seed"])
    lengths = torch.randint(0, n + 1, (b,), generator=g).int()
    lengths[0] = n
    hint = make_hint(case["hint"], scores, lengths, k, g)
    tier = "none" if hint is None else case["tier"]
    want_v, want_i = topk_stage.exact_reference(scores, k, lengths)
    v, i = topk_stage.select(scores.to(dev), k, lengths.to(dev), tier=tier, backend=case["backend"],
                             prev_indices=None if hint is None else hint.to(dev))  # fmt: skip
    assert_exact(i.cpu(), want_i, "indices")
    assert_exact(v.cpu(), want_v, "values")
    # the research notes' check: value multiset = torch.topk's over the valid prefix, indices
    # distinct and in range, -1 exactly in the K - min(K, len) padding slots
    for r in range(b):
        m = int(lengths[r])
        kk = min(k, m)
        assert (i[r, kk:] == -1).all() and (i[r, :kk] >= 0).all() and (i[r, :kk] < m).all()
        assert i[r, :kk].unique().numel() == kk
        if kk:
            tv = torch.topk(scores[r, :m], kk).values
            gv = scores[r, i[r, :kk].long().cpu()]
            assert torch.equal(gv.sort().values.nan_to_num(9e9), tv.sort().values.nan_to_num(9e9))


@given(
    b=st.integers(1, 4), n=sizes(1, 300), k=st.sampled_from([1, 8, 16, 64]),
    kind=st.sampled_from(["normal", "ties", "zeros", "relu_plateau", "inf", "nan", "outlier"]),
    hint=st.sampled_from(HINTS), tier=st.sampled_from(topk_stage.TIERS), seed=seeds(),
)  # fmt: skip
@example(b=2, n=10, k=16, kind="normal", hint="none", tier="none", seed=0)  # N < K
@example(b=1, n=257, k=64, kind="zeros", hint="zeros", tier="list", seed=1)  # plateau > K
@example(b=3, n=129, k=8, kind="ties", hint="duplicates", tier="counts", seed=2)
@example(b=2, n=64, k=16, kind="inf", hint="bottom_k", tier="rungs", seed=3)
@example(b=2, n=64, k=16, kind="nan", hint="out_of_range", tier="rungs", seed=4)
def test_every_tier_selects_the_deterministic_top_k(b, n, k, kind, hint, tier, seed):
    check_selection(
        dict(b=b, n=n, k=k, kind=kind, hint=hint, tier=tier, seed=seed, backend="reference")
    )


def test_tie_class_larger_than_any_capacity_fills_by_index():
    s = torch.zeros(1, 5000)
    s[0, 4000:] = -1.0
    v, i = topk_stage.select(s, 512, torch.tensor([5000], dtype=torch.int32), tier="rungs", backend="reference",
                             prev_indices=torch.arange(4000, 4512).int()[None])  # fmt: skip
    assert torch.equal(i[0], torch.arange(512, dtype=torch.int32))
    assert (v == 0).all()


def test_list_admission_never_counts_padding_and_demotes_below_k():
    k, cap = 16, 10
    claims = torch.tensor(
        [[7, 9, 5], [3, 4, 2], [0, 0, 16], [11, 9, 0], [4, 12, 3]], dtype=torch.int32
    )
    ok, n_seg = topk_stage.list_admission(claims, cap, k)
    # row 0: 7 + 9 >= 16 in two segments; row 1: 9 real candidates < K: demoted (a claim padded
    # with sentinels to K would have been admitted); row 2: one void segment; row 3: void first
    # segment; row 4: void second segment needed
    assert ok.tolist() == [True, False, False, False, False]
    assert n_seg.tolist() == [2, 0, 0, 0, 0]


def test_unknown_tier_raises():
    with pytest.raises(ValueError, match="tier must be one of"):
        topk_stage.select(torch.zeros(1, 4), 2, torch.tensor([4], dtype=torch.int32), tier="fast")


@pytest.mark.gpu
@given(
    b=st.integers(1, 16), n=sizes(1, 70000), k=st.sampled_from([512, 1024, 2048]),
    kind=st.sampled_from(["normal", "ties", "zeros", "relu_plateau", "inf", "nan", "outlier"]),
    hint=st.sampled_from(HINTS), tier=st.sampled_from(["none", "rungs"]), seed=seeds(),
)  # fmt: skip
def test_every_tier_selects_the_deterministic_top_k_gpu(b, n, k, kind, hint, tier, seed):
    check_selection(dict(b=b, n=n, k=k, kind=kind, hint=hint, tier=tier, seed=seed,
                         backend="auto"))  # fmt: skip


def test_the_stage_finds_flashrt_kernels_topk_in_a_fresh_process():
    """``from flashrt_kernels import topk`` once gave the lazily bound *function* (no ``.topk``),
    so every tier silently ran the torch reference sort in any process that had not imported the
    subpackage first (the H200 benchmark's ~125 us top-K)."""
    import subprocess
    import sys

    code = (
        "import flashrt_kernels\n"
        "from flashrt_dsv4_indexer import topk_stage\n"
        "mod = topk_stage.kernels_topk()\n"
        "assert mod is not None and mod.__name__ == 'flashrt_kernels.topk', mod\n"
        "assert flashrt_kernels.topk is mod and callable(mod.topk)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
