import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from flashrt_dsv4_indexer import key_cache as kc
from flashrt_dsv4_indexer import reference
from flashrt_dsv4_indexer.logits import RTOL, Emissions, paged_indexer_logits
from flashrt_kernels.testing.assertions import assert_exact, poison
from flashrt_kernels.testing.strategies import seeds, test_device
from flashrt_kernels.testing.values import make_values

SCALES = {
    "small": dict(h=16, d=32, max_pages=3, max_batch=3),
    "real": dict(h=64, d=128, max_pages=48, max_batch=6),
}
KEY_KINDS = ("normal", "ties", "zeros", "relu_plateau", "outlier")


def build(case, device):
    """A paged cache with scattered blocks, queries, weights and per-token lengths."""
    g = torch.Generator().manual_seed(case["seed"])
    h, d, page, pages = case["h"], case["d"], case["page"], case["pages"]
    b, nn = case["batch"], case["next_n"]
    n_blocks = b * pages + 3
    cache = kc.PagedKeyCache(n_blocks, page, d, case["fmt"], device)
    bt = torch.randperm(n_blocks, generator=g)[: b * pages].reshape(b, pages).int().to(device)
    seq = torch.tensor(case["seq"], dtype=torch.int64)
    n_max = pages * page
    keys = make_values(case["kind"], (b, n_max, d), torch.float32, case["seed"], scale=2.0)
    for r in range(b):
        rows = torch.full((n_max,), r, device=device)
        cache.write(bt, rows, torch.arange(n_max, device=device),
                    kc.hadamard_rotate(keys[r]).to(device))  # fmt: skip
    lens = reference.row_lengths(seq, nn, 1).to(device)
    q = kc.hadamard_rotate(make_values("normal", (b * nn, h, d), torch.float32, case["seed"] + 1))
    w = make_values("normal", (b * nn, h), torch.float32, case["seed"] + 2)
    qc, wf = kc.quantize_queries(q, w)
    return cache, bt, lens, qc.to(device), wf.to(device)


@st.composite
def cases(draw, scale):
    s = SCALES[scale]
    page = draw(st.sampled_from([32, 64, 128]))
    pages = draw(st.integers(1, s["max_pages"]))
    batch = draw(st.integers(1, s["max_batch"]))
    nn = draw(st.integers(1, 4))
    n_max = pages * page
    seq = [draw(st.sampled_from([nn, nn + 1, n_max // 2, n_max - 1, n_max]) | st.integers(0, n_max))
           for _ in range(batch)]  # fmt: skip
    seq = [max(x, nn - 1) for x in seq]
    return dict(h=s["h"], d=s["d"], page=page, pages=pages, batch=batch, next_n=nn, seq=seq,
                fmt=draw(st.sampled_from(["fp8", "fp4"])), kind=draw(st.sampled_from(KEY_KINDS)),
                seed=draw(seeds()))  # fmt: skip


def check_logits(case, edit=None, rtol=None, slack=1e-30):
    dev = test_device()
    cache, bt, lens, qc, wf = build(case, dev)
    if edit is not None:
        edit(cache, bt)
    b, nn = case["batch"], case["next_n"]
    width = case["pages"] * case["page"]
    ref, mag = reference.indexer_logits(qc.cpu(), wf.cpu(), cache.codes.cpu(), cache.scales.cpu(),
                                        case["fmt"], bt.cpu(), lens.cpu(), width, magnitude=True)  # fmt: skip
    em = Emissions.allocate(b * nn, width, 24, dev)
    for t in (em.block_max, em.list_values, em.list_indices):
        poison(t)
    # lines: tightest first, through the reference's own quantiles so segments are populated
    fin = torch.where(torch.isfinite(ref), ref, torch.nan)
    qs = torch.nanquantile(fin, torch.tensor([0.9, 0.6, 0.2], dtype=torch.float64), dim=1).T
    em.lines.copy_(torch.nan_to_num(qs, nan=0.0).float())
    out = poison(torch.empty(b * nn, width, device=dev))
    paged_indexer_logits(qc, wf, cache.codes, cache.scales, bt, lens, key_format=case["fmt"],
                         out=out, emissions=em, backend="triton")  # fmt: skip
    got = out.cpu().double()
    valid = torch.arange(width)[None, :] < lens.cpu().long()[:, None]
    assert torch.equal(torch.isinf(got) & (got < 0), ~valid), "padding must be -inf, valid finite"
    err = (got - ref).abs()[valid]
    bound = (rtol or RTOL[case["fmt"]]) * mag[valid] + slack
    assert (err <= bound).all(), f"worst err/bound {(err / bound).max().item():.3g}"
    # emissions are exact with respect to the logits the kernel wrote
    bm, counts, claims, members = reference.emissions(out.cpu(), lens.cpu(), em.lines.cpu(), 24)
    assert_exact(em.block_max.cpu(), bm, "block maxima")
    assert_exact(em.counts.cpu(), counts, "line counts")
    assert_exact(em.list_claims.cpu(), claims, "list claims")
    assert (claims.sum(1) <= lens.cpu()).all()
    vals, idx = em.list_values.cpu(), em.list_indices.cpu()
    for r in range(b * nn):
        for sg in range(3):
            n = min(int(claims[r, sg]), 24)
            got_i = idx[r, sg * 24 : sg * 24 + n]
            assert (got_i < lens[r].item()).all() and (got_i >= 0).all(), "padding listed"
            if claims[r, sg] <= 24:
                assert torch.equal(got_i.sort().values, members[r][sg].int()), (r, sg)
            else:  # void: the stored ones are genuine members
                assert torch.isin(got_i, members[r][sg].int()).all()
            assert torch.equal(vals[r, sg * 24 : sg * 24 + n], out.cpu()[r, got_i.long()])


EXAMPLES = [
    dict(h=16, d=32, page=32, pages=1, batch=1, next_n=1, seq=[1], fmt="fp8", kind="normal", seed=1),
    dict(h=16, d=32, page=32, pages=2, batch=2, next_n=4, seq=[33, 64], fmt="fp4", kind="ties",
         seed=2),
    dict(h=16, d=32, page=64, pages=3, batch=3, next_n=3, seq=[2, 129, 191], fmt="fp8",
         kind="relu_plateau", seed=3),
    dict(h=16, d=32, page=128, pages=1, batch=1, next_n=2, seq=[127], fmt="fp4", kind="zeros",
         seed=4),
]  # fmt: skip


@given(case=cases("small"))
@example(case=EXAMPLES[0])
@example(case=EXAMPLES[1])
@example(case=EXAMPLES[2])
@example(case=EXAMPLES[3])
def test_logits_faithful_and_emissions_exact(case):
    check_logits(case)


@pytest.mark.parametrize("d", [64, 128])
def test_fp4_keys_of_wider_heads(d):
    """MXFP4 keys wider than the tiny configs' 32: d = 64 takes one scale per two k-pair residues of
    the decoded tile, d = 128 (the real models') one scale per residue (``quant.fp4_tiles``)."""
    check_logits(dict(h=16, d=d, page=32, pages=2, batch=2, next_n=1, seq=[40, 64], fmt="fp4",
                      kind="normal", seed=5))  # fmt: skip


def _unfoldable(kind):
    """Edits MXFP4 keys of the first 128 positions of batch row 0 (one tile of 128 keys: the rest
    keep the folded e4m3 path) so their scales do not fold into e4m3 (``fp4_tiles.fold_factor``):
    a group 12 binades under the key's largest, an all-zero group, or every scale tiny."""

    def edit(cache, bt):
        page = cache.codes.shape[1]
        for pos in range(0, 128, 5):
            blk, off = int(bt[0, pos // page]), pos % page
            sc = cache.scales[blk, off]
            if kind == "spread":
                sc[1] = int(sc.max()) - 12
            elif kind == "zero_group":
                cache.codes[blk, off, 16:32] = 0
                sc[1] = 27  # the quantizer's byte for an all-zero group (2**-100)
            else:
                sc[:] = torch.tensor([3, 5, 6, 4], dtype=torch.uint8)

    return edit


@pytest.mark.parametrize("kind", ["spread", "zero_group", "tiny"])
@pytest.mark.parametrize("next_n", [1, 3])
def test_fp4_keys_that_do_not_fold_take_the_bf16_tile(kind, next_n):
    """d = 128 MXFP4 keys decode to e4m3 with their 4 scales folded, unless a key's scales span
    more than 11 binades or its largest is under 2**-120: then its tile runs in bf16. Both in one
    launch, each within the bound; on the CPU (fp32 dots of exact values) within 2**-16 and no
    absolute slack, which a wrong fold (a shift clamped, a factor off) exceeds."""
    case = dict(h=16, d=128, page=64, pages=4, batch=2, next_n=next_n, seq=[256, 200],
                fmt="fp4", kind="normal", seed=11)  # fmt: skip
    cpu = test_device().type == "cpu"
    check_logits(case, edit=_unfoldable(kind), rtol=2.0**-16 if cpu else None, slack=0.0)


@settings(max_examples=6)
@given(page=st.sampled_from([32, 64, 128]), nn=st.integers(1, 4),
       kind=st.sampled_from(KEY_KINDS), seed=seeds(), seq=st.integers(1, 384))  # fmt: skip
def test_fp4_folded_e4m3_tiles(page, nn, kind, seed, seq):
    """The folded e4m3 path (d = 128) over page sizes, next_n, key kinds and lengths."""
    seq = max(seq, nn - 1)
    check_logits(dict(h=16, d=128, page=page, pages=384 // page, batch=2, next_n=nn,
                      seq=[seq, 384 - seq // 2], fmt="fp4", kind=kind, seed=seed))  # fmt: skip


@pytest.mark.gpu
@given(case=cases("real"))
def test_logits_faithful_and_emissions_exact_gpu(case):
    check_logits(case)


def test_unfilled_padding_is_left_alone():
    case = dict(EXAMPLES[2], seq=[5, 70, 100])
    dev = test_device()
    cache, bt, lens, qc, wf = build(case, dev)
    out = poison(torch.empty(9, 192, device=dev))
    paged_indexer_logits(qc, wf, cache.codes, cache.scales, bt, lens, out=out, fill_padding=False,
                         backend="triton")  # fmt: skip
    valid = torch.arange(192, device=dev)[None, :] < lens.long()[:, None]
    assert torch.isnan(out[~valid]).all() and not torch.isnan(out[valid]).any()


def test_reference_backend_and_custom_op_agree():
    case = EXAMPLES[1]
    cache, bt, lens, qc, wf = build(case, torch.device("cpu"))
    a = paged_indexer_logits(qc, wf, cache.codes, cache.scales, bt, lens, key_format="fp4",
                             backend="reference")  # fmt: skip
    b = torch.ops.flashrt.paged_indexer_logits(qc, wf, cache.codes, cache.scales, bt, lens, "fp4",
                                               "reference")  # fmt: skip
    assert_exact(a, b)
    shapes = [(t.shape, t.dtype) for t in (qc, wf, cache.codes, cache.scales, bt, lens)]
    with torch._subclasses.fake_tensor.FakeTensorMode():
        fakes = [torch.empty(s, dtype=dt) for s, dt in shapes]
        f = torch.ops.flashrt.paged_indexer_logits(*fakes, "fp4", "reference")
        assert f.shape == (8, 64) and f.dtype == torch.float32


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (dict(q=torch.zeros(4, 16, 32)), TypeError, "q_codes must have dtype"),
        (dict(q=torch.zeros(5, 16, 32, dtype=torch.uint8)), ValueError, "next_n in 1..4"),
        (dict(w=torch.zeros(8, 8)), ValueError, r"weights must have shape \[8, 16\]"),
        (dict(lens=torch.zeros(4, dtype=torch.int64)), TypeError, "lengths must have dtype"),
        (dict(bt=torch.zeros(2, 2, dtype=torch.int64)), TypeError, "block_table must have dtype"),
        (dict(fmt="fp8"), ValueError, "key_codes must have shape"),
        (dict(out=torch.empty(8, 63)), ValueError, r"out must have shape \[8, 64\]"),
        (dict(backend="cuda"), ValueError, "not implemented"),
    ],
)
def test_bad_inputs_raise_clear_errors(change, error, match):
    cache, bt, lens, qc, wf = build(EXAMPLES[1], torch.device("cpu"))
    args = dict(q=qc, w=wf, bt=bt, lens=lens, fmt="fp4", out=None, backend="reference")
    args.update(change)
    with pytest.raises(error, match=match):
        paged_indexer_logits(args["q"], args["w"], cache.codes, cache.scales, args["bt"],
                             args["lens"], key_format=args["fmt"], out=args["out"],
                             backend=args["backend"])  # fmt: skip
