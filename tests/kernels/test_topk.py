import pytest
import torch

from flashrt_kernels.registry import properties
from flashrt_kernels.testing.chains import ScoreChain
from flashrt_kernels.topk import reference, topk
from flashrt_kernels.topk import state as st

PROPS = properties()
test_matches_reference = PROPS["topk.matches_reference"].test("small")
test_hinted_matches_reference = PROPS["topk.hinted_matches_reference"].test("small")
test_matches_reference_gpu = pytest.mark.gpu(PROPS["topk.matches_reference"].test("real"))
test_hinted_matches_reference_gpu = pytest.mark.gpu(
    PROPS["topk.hinted_matches_reference"].test("real")
)


def test_reference_order_on_special_values():
    s = torch.tensor([[1.0, float("nan"), -0.0, 0.0, float("inf"), float("-inf"), 1.0]])
    v, i = reference.topk(s, 9)
    assert i.tolist() == [[0, 1, 2, 3, 4, 5, 6, -1, -1]]  # the selection in index order
    v, i = reference.sort_by_rank(v, i)
    assert i.tolist() == [[1, 4, 0, 6, 2, 3, 5, -1, -1]]  # by rank: NaN, inf, ties by index
    assert torch.isnan(v[0, 0]) and v[0, 1] == float("inf") and v[0, 7] == float("-inf")
    assert torch.signbit(v[0, 4]) and not torch.signbit(v[0, 5])  # -0.0 kept, ties by index
    # ties at the K-th value: the lowest indices are kept
    assert reference.topk(torch.tensor([[2.0, 1.0, 1.0, 3.0, 1.0]]), 3)[1].tolist() == [[0, 1, 3]]


def test_sorted_option_lists_by_rank():
    x = torch.randn(3, 700)
    v, i = topk(x, 40, sorted=True, backend="triton")
    tv, ti = torch.topk(x, 40)
    assert torch.equal(v, tv) and torch.equal(i, ti.int())


def test_reference_agrees_with_torch_topk_values():
    x = torch.randn(5, 3000)
    x[:, ::17] = float("nan")
    v, _ = reference.sort_by_rank(*reference.topk(x, 300))
    tv = torch.topk(x, 300).values
    assert torch.equal(v.isnan(), tv.isnan()) and torch.equal(v.nan_to_num(), tv.nan_to_num())


def test_lengths_and_pads():
    x = torch.randn(3, 50)
    lens = torch.tensor([0, 3, 70], dtype=torch.int32)
    v, i = topk(x, 5, lengths=lens, backend="triton")
    assert (i[0] == -1).all() and (v[0] == float("-inf")).all()
    assert (i[1, 3:] == -1).all() and set(i[1, :3].tolist()) == {0, 1, 2}
    assert torch.equal(i[2], reference.topk(x[2:], 5)[1][0])


def test_cuda_graph_safe_out_buffers_reused():
    x = torch.randn(2, 300)
    ov, oi = torch.empty(2, 16), torch.empty(2, 16, dtype=torch.int32)
    for _ in range(2):  # the workspace is left zeroed: a second call is still exact
        rv, ri = topk(x, 16, out_values=ov, out_indices=oi, backend="triton")
        assert rv.data_ptr() == ov.data_ptr() and torch.equal(oi, reference.topk(x, 16)[1])


def test_reference_backend_publishes_state():
    x = torch.randn(2, 100)
    s = st.new_state(2, "cpu")
    v, _ = topk(x, 10, state=s, backend="reference")
    assert s[0, st.VALID] == 1 and s[0, st.ACCEPTED_COUNT] == 10
    assert st.key_to_value(int(s[1, st.KTH_KEY])) == v[1].min().item()


def test_custom_op_and_fake():
    x = torch.randn(3, 40)
    with torch._subclasses.fake_tensor.FakeTensorMode():
        fv, fi = torch.ops.flashrt.topk(torch.empty(3, 40), 5, None, None, "reference")
        assert fv.shape == (3, 5) and fi.dtype == torch.int32
    v, i = torch.ops.flashrt.topk(x, 5, None, None, "reference")
    assert torch.equal(i, reference.topk(x, 5)[1])


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"scores": torch.randn(4, 8, dtype=torch.float64)}, TypeError, "scores must have dtype"),
        ({"scores": torch.randn(8)}, ValueError, "scores must have 2 dimensions"),
        ({"scores": torch.randn(8, 4).t()}, ValueError, "unit stride"),
        ({"k": 0}, ValueError, "k must be >= 1"),
        ({"k": 2.0}, TypeError, "k must be an int"),
        ({"lengths": torch.ones(4, dtype=torch.int64)}, TypeError, "lengths must have dtype"),
        ({"lengths": torch.ones(3, dtype=torch.int32)}, ValueError, r"lengths must have shape"),
        ({"hint": torch.zeros(4, 2, dtype=torch.int32)}, ValueError, r"hint must have shape"),
        ({"out_values": torch.empty(4, 3, dtype=torch.bfloat16)}, TypeError, "out_values"),
        ({"out_indices": torch.empty(4, 2, dtype=torch.int32)}, ValueError, "out_indices"),
        ({"state": torch.zeros(4, 3, dtype=torch.int32)}, ValueError, "state must have shape"),
        ({"backend": "fast"}, ValueError, "backend must be one of"),
        ({"backend": "cute"}, ValueError, "not implemented"),
    ],
)
def test_bad_inputs_raise_clear_errors(kwargs, error, match):
    args = {"scores": torch.randn(4, 8), "k": 3}
    args.update(kwargs)
    with pytest.raises(error, match=match):
        topk(args.pop("scores"), args.pop("k"), **args)


def test_chain_generator_properties():
    c = ScoreChain(3, 400, drift=0.05, growth=7, start_lengths=[0, 10, 400], cold_prob=0.0,
                   relu=True, seed=3)  # fmt: skip
    a, la = c.step()
    b, lb = c.step()
    assert la.tolist() == [0, 10, 400] and lb.tolist() == [7, 17, 400]
    assert (a >= 0).all() and (a == 0).any()  # ReLU plateaus
    assert torch.corrcoef(torch.stack([a[2], b[2]]))[0, 1] > 0.9  # drifting, not redrawn
    again = ScoreChain(3, 400, drift=0.05, growth=7, start_lengths=[0, 10, 400], relu=True, seed=3)
    assert torch.equal(again.step()[0], a)  # deterministic in the seed
    cold = ScoreChain(2, 400, drift=0.05, cold_prob=1.0, seed=1)
    x0, _ = cold.step()
    x1, _ = cold.step()
    assert cold.cold.all() and abs(torch.corrcoef(torch.stack([x0[0], x1[0]]))[0, 1]) < 0.3


@pytest.mark.gpu
def test_cuda_graph_replay_is_exact():
    x = torch.randn(8, 1 << 17, device="cuda")
    ov = torch.empty(8, 512, device="cuda")
    oi = torch.empty(8, 512, dtype=torch.int32, device="cuda")
    topk(x, 512, out_values=ov, out_indices=oi)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        topk(x, 512, out_values=ov, out_indices=oi)
    oi.zero_()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(oi.cpu(), reference.topk(x.cpu(), 512)[1])


test_consumers_match_reference = PROPS["topk.consumers_match_reference"].test("small")
test_consumers_match_reference_gpu = pytest.mark.gpu(
    PROPS["topk.consumers_match_reference"].test("real")
)


def test_empty_rows_and_strided_rows():
    v, i = topk(torch.empty(2, 0), 3, backend="triton")
    assert (i == -1).all() and (v == float("-inf")).all()
    x = torch.randn(3, 500)[:, 10:310]  # row stride 500, unit column stride
    want = reference.topk(x, 20)
    for hint in (None, want[1]):
        got = topk(x, 20, hint=hint, backend="triton")
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


_AOT = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from flashrt_kernels.topk import kernels as kn
P = {a: "*i32" for a in ["LEN", "HINT", "STATE", "TH", "TC", "PC", "NSEG", "PFX", "SEG", "CK", "CI", "OI",
                         "OV", "SCB"]}
P.update(SC="*fp32", BM="*fp32")
def comp(fn, const):
    sig, cx = {}, {}
    for i, a in enumerate(fn.arg_names):
        if a in const:
            sig[a], cx[(i,)] = "constexpr", const[a]
        else:
            sig[a] = P.get(a, "i32")
    src = ASTSource(fn=fn, signature=sig, constexprs=cx)
    triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})
common = dict(HAS_LEN=True, RMAX=2, FIRST_PC=0)
for rnd in (0, 1):
    comp(kn._count_kernel, dict(ROUND=rnd, HINTED=True, HAS_STATE=True, KP=2048,
                                STATE_WORDS=24, NS=512, BLOCK=1024, **common))
comp(kn._collect_kernel, dict(NR=2, SP=512, HAS_BMAX=True, BLOCK=1024, **common))
for nr in (0, 2):
    comp(kn._finish_kernel, dict(NR=nr, HINTED=True, HAS_STATE=True, SP=512, LOG_SP=9,
                                 KP=4096, KO=4096, STATE_WORDS=24, NS=512, BLOCK=1024,
                                 **common))
print("compiled")
"""


def test_kernels_compile_for_sm90_without_a_gpu():
    """Ahead-of-time compile (Triton's ptxas, no device) of the largest kernel variants."""
    import importlib.util
    import os
    import subprocess
    import sys

    spec = importlib.util.find_spec("triton")
    ptxas = os.path.join(os.path.dirname(spec.origin), "backends", "nvidia", "bin", "ptxas")
    if not os.path.exists(ptxas):
        pytest.skip("this Triton has no bundled ptxas")
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    proc = subprocess.run([sys.executable, "-c", _AOT], env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0 and "compiled" in proc.stdout, proc.stderr[-3000:]


def test_cuda_select_compiles_for_sm90_without_a_gpu(tmp_path):
    """nvcc (where installed) builds every instantiation of the CUDA backend's source for sm_90
    without register spills; the CUDA backend itself runs in the GPU tests."""
    import shutil
    import subprocess

    from flashrt_kernels.topk import cuda_select

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc on this machine")
    src = cuda_select.source()
    sig = {
        "bound_kernel": "const void*, long long, const int*, int, int, int, int, int, int*, int*",
        "count_kernel": "const void*, long long, const int*, int, int, int, int, int, int, int, "
        "const int*, const int*, int, int*, int*, int2*, int*",
        "step_kernel": "const void*, long long, const int*, int, int, int, int, int, int, int, "
        "int*, int*, int2*, int*",
        "finish_kernel": "const void*, long long, const int*, int, int, int, int, int, int, int, "
        "int*, int2*, int*, int*, void*, int*, int, int, int, int, int*",
    }
    inst = "".join(
        f"template __global__ void {name}<{dt}>({args});\n"
        for name, args in sig.items()
        for dt in (0, 1, 2)
    ) + "".join(
        f"template __global__ void cluster_kernel<{dt}, {c}>(const void*, long long, const int*, "
        "int, int, int, int*, void*, int*, int);\n"
        for dt in (0, 1, 2)
        for c in cuda_select.CLUSTERS
    )
    (tmp_path / "select.cu").write_text(src + "\n" + inst)
    proc = subprocess.run(
        [nvcc, "-arch=sm_90", "-std=c++17", "-Xptxas", "-v", "-c", "select.cu", "-o", "select.o"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    entries = 3 * len(sig) + 3 * len(cuda_select.CLUSTERS)
    assert proc.stderr.count("Compiling entry function") == entries, proc.stderr[-3000:]
    assert " 0 bytes spill stores" in proc.stderr and "bytes spill stores" in proc.stderr
    spills = [ln for ln in proc.stderr.splitlines() if "spill stores" in ln]
    assert all(ln.strip().startswith("0 bytes stack frame, 0 bytes spill") for ln in spills), spills


def test_cuda_backend_needs_a_cuda_device():
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(ValueError, match="cannot run on device"):
        topk(torch.randn(2, 8), 3, backend="cuda")


def test_cuda_path_choice_by_batch_and_hint(monkeypatch):
    """Which calls ``cuda_select`` sends to the thread-block clusters on a 132-SM part (no GPU
    needed): long rows at small batch, hint-free always, hinted only from
    ``HINTED_CLUSTER_MIN_ROWS`` rows; never short rows, an explicit split, or clusters that would
    take more than half the SMs; ``clusters=True`` / ``False`` force the plan or none."""
    from flashrt_kernels.topk import cuda_select as cs

    monkeypatch.setattr(cs, "sm_count", lambda index=0: 132)
    dev = torch.device("cuda")
    many = cs.HINTED_CLUSTER_MIN_ROWS
    for n in (131072, 262144):
        for b in (1, 2, many - 1, many):
            assert cs._use_clusters(b, n, dev, None, None, False) == cs.cluster_plan(b, n, dev)
            assert cs._use_clusters(b, n, dev, None, None, False)[0] == 8
            hinted = cs._use_clusters(b, n, dev, None, None, True)
            assert (hinted is not None) == (b >= many), (b, n)
        for hint in (False, True):
            assert cs._use_clusters(16, n, dev, None, None, hint) is None  # 128 of 132 SMs
            assert cs._use_clusters(many, n, dev, 64, None, hint) is None  # explicit split
            assert cs._use_clusters(1, n, dev, None, True, hint) is not None
            assert cs._use_clusters(many, n, dev, None, False, hint) is None
    assert cs._use_clusters(many, cs.SHORT_MAX, dev, None, None, False) is None
    assert cs._use_clusters(many, 1 << 20, dev, None, None, False) is None  # parts too long


def test_cuda_step_helpers_fit_one_block_an_sm(monkeypatch):
    """The steps run inside the finishing launch only where its blocks (a finishing block and
    the helpers of each row) fit one an SM on a 132-SM part, with at least ``MIN_HELPERS``
    helpers a row and never more than the row's chunks; else the separate step launches."""
    from flashrt_kernels.topk import cuda_select as cs

    monkeypatch.setattr(cs, "sm_count", lambda index=0: 132)
    dev = torch.device("cuda")
    assert cs.step_helpers(1, 256, dev) == 131
    assert cs.step_helpers(1, 64, dev) == 64  # at most the row's chunks
    assert cs.step_helpers(4, 132, dev) == 32
    assert cs.step_helpers(14, 38, dev) == 8
    assert cs.step_helpers(15, 36, dev) == 0  # 7 helpers a row: below MIN_HELPERS
    assert cs.step_helpers(1, cs.MIN_HELPERS - 1, dev) == 0
    assert cs.step_helpers(1, 0, dev) == 0  # short rows: no passes
    for b in range(1, 133):
        h = cs.step_helpers(b, 1024, dev)
        assert h == 0 or (h >= cs.MIN_HELPERS and b * (1 + h) <= 132)


def _cuda_or_skip():
    from flashrt_kernels.backends import backend_runs_on

    if not backend_runs_on("cuda", torch.device("cuda")):
        pytest.skip("the CUDA backend does not run here")


def _assert_bits_equal(got, want):
    assert torch.equal(got[1].cpu(), want[1])
    bits = torch.int32 if want[0].dtype == torch.float32 else torch.int16
    assert torch.equal(got[0].cpu().view(bits), want[0].view(bits))


def _cuda_launch(x, k, *, hint=None, state=None, lengths=None, split=None, clusters=None,
                 helpers=True):  # fmt: skip
    """The CUDA select's launches on x (on the GPU) with its path chosen: ``clusters`` False
    keeps long rows on the multi-launch path, True sends them to thread-block clusters;
    ``helpers`` False keeps the steps in launches of their own."""
    from flashrt_kernels.topk import cuda_select

    b = x.shape[0]
    ov = torch.full((b, k), float("nan"), dtype=x.dtype, device="cuda")
    oi = torch.full((b, k), -7, dtype=torch.int32, device="cuda")
    cuda_select.launch(x, k, lengths, ov, oi, state, hint, split, True, clusters, helpers)
    return ov, oi


@pytest.mark.gpu
@pytest.mark.parametrize("b, n", [(1, 1 << 20), (4, 300007), (12, 1 << 17)])
def test_cuda_steps_inside_the_finishing_launch(b, n):
    """Rows through every step status with the steps run by the finishing launch's helpers and
    by separate launches: a good hint (settled by the counting pass), a random hint and a
    hint-free call (digit passes, then a compaction), rows whose keys share their top 12 bits
    (two digit passes), a plateau of more than 16384 keys at the K-th value (all three passes,
    then the emission from the row), and rows of other lengths (some short): exact every time,
    both forms the same bits and the same state; the fused form in a CUDA graph too."""
    _cuda_or_skip()
    from flashrt_kernels.topk import cuda_select
    from flashrt_kernels.topk.properties import check_state

    s, _, _ = cuda_select.plan(b, n, torch.device("cuda"))
    assert cuda_select.step_helpers(b, s, torch.device("cuda")) > 0
    g = torch.Generator().manual_seed(b * n)
    k = 1024
    x = torch.randn(b, n, generator=g)
    narrow = 1.0 + torch.rand(b, n, generator=g) * 1e-3  # one top-12-bit bucket
    plateau = torch.randn(b, n, generator=g)
    plateau[:, 3::5] = 7.0  # n / 5 keys tied at the K-th value
    lens = torch.randint(n // 3, n + 1, (b,), generator=g, dtype=torch.int32)
    lens[0] = n
    lens[-1] = min(n, 20000)  # a short row beside the long ones
    good = torch.topk(x + 0.001 * torch.randn(b, n, generator=g), k).indices.int()
    bad = torch.randint(0, n, (b, k), generator=g, dtype=torch.int32)
    cases = [(x, good, None), (x, bad, None), (x, None, None), (narrow, bad, None),
             (narrow, None, None), (plateau, None, None), (x, bad, lens), (narrow, None, lens)]  # fmt: skip
    for rows, hint, ln in cases:
        want = reference.topk(rows, k, ln)
        got = []
        for helpers in (True, False):
            state = st.new_state(b, "cuda")
            out = _cuda_launch(rows.cuda(), k, hint=None if hint is None else hint.cuda(),
                               state=state, lengths=None if ln is None else ln.cuda(),
                               clusters=False, helpers=helpers)  # fmt: skip
            _assert_bits_equal(out, want)
            check_state(state, rows, k, ln, want[0])
            got.append(state.cpu())
        assert torch.equal(got[0], got[1])
    xd, hd = narrow.cuda(), bad.cuda()
    ov = torch.full((b, k), float("nan"), device="cuda")
    oi = torch.full((b, k), -7, dtype=torch.int32, device="cuda")
    cuda_select.launch(xd, k, None, ov, oi, None, hd, None, True, False)  # workspace exists
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cuda_select.launch(xd, k, None, ov, oi, None, hd, None, True, False)
    want = reference.topk(narrow, k)
    for _ in range(3):
        ov.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _assert_bits_equal((ov, oi), want)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [5000, 8192, 32768])
def test_cuda_short_rows_every_candidate_branch(n):
    """One-block rows: candidates in per-warp regions (normal rows; a plateau at the K-th value
    with few elements above), a warp range with more candidates than its region (ascending rows:
    the top k share the last warps; descending: the first), and more candidates than all regions
    hold (a plateau below a few spikes)."""
    _cuda_or_skip()
    g = torch.Generator().manual_seed(n)
    normal = torch.randn(3, n, generator=g)
    ramp = torch.arange(n, dtype=torch.float32).repeat(3, 1) / n
    ramp[1] = ramp[1].flip(0)
    spikes = torch.zeros(3, n)
    spikes[:, ::97] = 1.0
    for x in (normal, ramp, spikes):
        for k in (1, 129, 512, 2048, 4096):
            ov = torch.full((3, k), float("nan"), device="cuda")
            oi = torch.full((3, k), -7, dtype=torch.int32, device="cuda")
            got = topk(x.cuda(), k, out_values=ov, out_indices=oi, backend="cuda")
            _assert_bits_equal(got, reference.topk(x, k))


@pytest.mark.gpu
@pytest.mark.parametrize("n", [5000, 40000, 131072, 262144])
def test_cuda_cluster_rows_every_branch(n):
    """Rows as thread-block clusters (``cuda_select.cluster_plan``): normal rows; ramps (the top
    k in the last warps of the last block, or the first of the first: a warp range with more
    candidates than its region, so every block's passes read all of its keys); a plateau below
    spikes; all-equal rows (ties across every block); per-row lengths (within one block's part,
    empty, shorter than k); fp32, bf16, fp16; k from 1 to 4096: the reference's bits and the
    state as documented. Also 40 rows (two blocks a row, at most 64k long), and a CUDA graph's
    replay."""
    _cuda_or_skip()
    from flashrt_kernels.topk import cuda_select
    from flashrt_kernels.topk.properties import check_state

    b = 4
    assert cuda_select.cluster_plan(b, n, torch.device("cuda")) is not None
    g = torch.Generator().manual_seed(n)
    ramp = torch.arange(n, dtype=torch.float32).repeat(b, 1) / n
    ramp[1] = ramp[1].flip(0)
    spikes = torch.zeros(b, n)
    spikes[:, ::97] = 1.0
    rows = {"normal": torch.randn(b, n, generator=g), "ramp": ramp, "spikes": spikes,
            "flat": torch.full((b, n), 0.5)}  # fmt: skip
    lens = torch.tensor([n, max(n - 4097, 1), min(3000, n), 0], dtype=torch.int32)
    for x in rows.values():
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            xd = x.to(dtype)
            for k in (1, 129, 2048, 4096):
                for ln in (None, lens):
                    want = reference.topk(xd, k, ln)
                    state = st.new_state(b, "cuda")
                    cl = None if ln is None else ln.cuda()
                    got = _cuda_launch(xd.cuda(), k, state=state, lengths=cl, clusters=True)
                    _assert_bits_equal(got, want)
                    check_state(state, xd, k, ln, want[0])
    if n <= 65536:  # two blocks a row
        x = torch.randn(40, n, generator=g).cuda()
        assert cuda_select.cluster_plan(40, n, x.device)[0] == 2
        _assert_bits_equal(_cuda_launch(x, 512, clusters=True), reference.topk(x.cpu(), 512))
    ov = torch.full((b, 512), float("nan"), device="cuda")
    oi = torch.full((b, 512), -7, dtype=torch.int32, device="cuda")
    x = rows["normal"].cuda()
    cuda_select.launch(x, 512, None, ov, oi, None, None, None, True, True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cuda_select.launch(x, 512, None, ov, oi, None, None, None, True, True)
    ov.fill_(float("nan"))
    oi.fill_(-7)
    graph.replay()
    _assert_bits_equal((ov, oi), reference.topk(x.cpu(), 512))


@pytest.mark.gpu
@pytest.mark.parametrize("k", [1, 512, 2048, 4096])
def test_cuda_bound_on_rows_with_structure(k):
    """Split rows whose group maxima say little (the top values all in one group, every 8192nd
    position; ascending rows; a plateau with a few spikes): the bound stays a bound, the result
    exact, the state as documented; unstructured rows are admitted by the bound at once."""
    _cuda_or_skip()
    from flashrt_kernels.topk.properties import check_cuda_bound, check_state

    n = 1 << 18
    g = torch.Generator().manual_seed(k)
    one_group = torch.randn(2, n, generator=g)
    one_group[:, ::8192] += 100.0
    ramp = torch.arange(n, dtype=torch.float32).repeat(2, 1)
    spikes = torch.zeros(2, n)
    spikes[:, ::1001] = 1.0
    for x in (one_group, ramp, spikes, torch.randn(2, n, generator=g)):
        want = reference.topk(x, k)
        for clusters in (True, False):  # the multi-launch path last: its bound is checked
            state = st.new_state(2, "cuda")
            _assert_bits_equal(_cuda_launch(x.cuda(), k, state=state, clusters=clusters), want)
            check_state(state, x, k, None, want[0])
    check_cuda_bound(state, k, n, None)  # the unstructured rows


@pytest.mark.gpu
@pytest.mark.parametrize("drift", [0.02, 0.2, 0.3, 0.45])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_hint_from_a_drifted_step(drift, dtype):
    """The previous step's selection as the hint on rows that moved since (the smallest hinted
    score then admits up to ~40 k keys, past the candidate capacity): every path the counting
    pass can take -- ready at the guess, a recompaction at a sampled threshold, the digit passes
    -- gives the reference's bits, and the published thresholds' counts are exact; so does the
    automatic choice at 8 rows (the clusters, which ignore the hint)."""
    _cuda_or_skip()
    from flashrt_kernels.topk.properties import check_state

    cases = ((1, 1 << 17, 1024, False), (4, 1 << 18, 512, False), (2, 1 << 20, 2048, False),
             (8, 1 << 17, 1024, None))  # fmt: skip
    for b, n, k, clusters in cases:
        chain = ScoreChain(b, n, drift=drift, seed=n + k, dtype=dtype)
        prev, x = chain.step()[0], chain.step()[0]
        hint = reference.topk(prev, k)[1]
        want = reference.topk(x, k)
        state = st.new_state(b, "cuda")
        got = _cuda_launch(x.cuda(), k, hint=hint.cuda(), state=state, clusters=clusters)
        _assert_bits_equal(got, want)
        check_state(state, x, k, None, want[0])


@pytest.mark.parametrize("drift", [0.02, 0.2, 0.3])
def test_triton_hint_from_a_drifted_step_needs_one_round(drift):
    """The Triton select's first round counts the hint's sampled ranks beside the smallest
    hinted score: on steps that drifted (ScoreChain 0.2-0.3, where that score alone admitted
    many times k keys and rows took 2-9 counting rounds) every row is resolved by the first
    round, with the reference's bits."""
    from flashrt_kernels.topk.properties import check_state

    for b, n, k in ((4, 4096, 64), (2, 8192, 128)):
        chain = ScoreChain(b, n, drift=drift, seed=n + k)
        prev, x = chain.step()[0], chain.step()[0]
        hint = reference.topk(prev, k)[1]
        want = reference.topk(x, k)
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        state = st.new_state(b, dev)
        got = topk(x.to(dev), k, hint=hint.to(dev), state=state, backend="triton")
        _assert_bits_equal(got, want)
        check_state(state, x, k, None, want[0])
        rounds = state[:, st.ROUNDS].cpu()
        assert bool((rounds == 1).all()), f"drift {drift}, n {n}: rounds {rounds.tolist()}"


@pytest.mark.gpu
@pytest.mark.parametrize("drift", [0.02, 0.3])
def test_triton_hint_from_a_drifted_step(drift):
    """The same at real sizes on the GPU: the reference's bits and an exact state."""
    from flashrt_kernels.topk.properties import check_state

    for b, n, k in ((1, 1 << 17, 1024), (4, 1 << 18, 512), (2, 1 << 20, 2048)):
        chain = ScoreChain(b, n, drift=drift, seed=n + k)
        prev, x = chain.step()[0], chain.step()[0]
        hint = reference.topk(prev, k)[1]
        want = reference.topk(x, k)
        state = st.new_state(b, "cuda")
        got = topk(x.cuda(), k, hint=hint.cuda(), state=state, backend="triton")
        _assert_bits_equal(got, want)
        check_state(state, x, k, None, want[0])


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("n", "ks", "split", "lengths"),
    [
        (1 << 20, (512, 1), None, None),  # 256 blocks: 8 groups per block (a warp shuffle), 1
        (262144, (512, 2048), 8, None),  # 256 groups per block; 1024 (shared atomics)
        (262144, (2048,), 2, None),  # 4096 per block (one per thread and item)
        (100003, (2048,), 1, None),  # one block of 8192 groups (two tile parities)
        (100003, (4096, 2048, 512), 7, None),  # 14336 maxima: the last block ranks them in parts
        (100003, (2048,), 3, None),  # 3 blocks x 4096 = 12288 maxima
        (262144, (1024,), None, (262144, 150001)),  # a shorter row: fewer blocks hold groups
    ],
)
def test_cuda_bound_every_group_layout(n, ks, split, lengths):
    """The block-local groups of the hint-free bound in every layout (groups per block from 1 to
    8192, more maxima than one part of the last block's table, rows with fewer nonempty blocks),
    calls of several k on one workspace: exact, the state as documented, and on normal rows the
    candidates admitted at once (at most 2 kk + 16 of them); bf16 rows (ties) exact."""
    _cuda_or_skip()
    from flashrt_kernels.topk import cuda_select
    from flashrt_kernels.topk.properties import check_state

    g = torch.Generator().manual_seed(n + len(ks))
    lens = None if lengths is None else torch.tensor(lengths, dtype=torch.int32)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(2, n, generator=g).to(dtype)
        for k in ks:
            want = reference.topk(x, k, lens)
            state = st.new_state(2, "cuda")
            ov = torch.full((2, k), float("nan"), dtype=dtype, device="cuda")
            oi = torch.full((2, k), -7, dtype=torch.int32, device="cuda")
            cl = None if lens is None else lens.cuda()
            cuda_select.launch(x.cuda(), k, cl, ov, oi, state, None, split, True, False)
            assert torch.equal(oi.cpu(), want[1])
            bits = torch.int32 if dtype == torch.float32 else torch.int16
            assert torch.equal(ov.cpu().view(bits), want[0].view(bits))
            check_state(state, x, k, lens, want[0])
            if dtype == torch.float32:
                kk = torch.tensor(lengths or (n, n)).clamp(max=k)
                s = state.cpu()
                assert bool((s[:, st.ROUNDS] == 1).all()), s[:, st.ROUNDS]
                assert bool((s[:, st.ACCEPTED_COUNT] <= 2 * kk + 16).all()), s[:, st.ACCEPTED_COUNT]


@pytest.mark.gpu
@pytest.mark.parametrize("n", [8192, 1 << 18])
def test_cuda_values_keep_their_bits(n):
    """The emission writes a value from its key where the key names one bit pattern; zeros of
    either sign and NaNs with payloads (both signs) must still come out as the input's bits, in
    fp32 and bf16, on one-block and split rows."""
    _cuda_or_skip()
    g = torch.Generator().manual_seed(n)
    x = torch.randn(2, n, generator=g)
    x[:, 4::11] = 9.0  # a plateau above every normal value
    bits = x.view(torch.int32)
    bits[:, 1::7] = 0  # +0.0
    bits[:, 2::7] = -(2**31)  # -0.0
    bits[0, 3::97] = 0x7FD30123  # NaN with a payload (bf16: 0x7fd3)
    bits[1, 3::97] = -0x3EFFFF  # 0xffc10001: a negative NaN with a payload
    for dtype in (torch.float32, torch.bfloat16):
        xd = x if dtype == torch.float32 else (bits >> 16).to(torch.int16).view(dtype)
        view = torch.int32 if dtype == torch.float32 else torch.int16
        for k in (1, 512, 2048, 4096):
            want = reference.topk(xd, k)
            for clusters in (None, False, True):  # short rows; split rows; clusters
                got = _cuda_launch(xd.cuda(), k, clusters=clusters)
                assert torch.equal(got[1].cpu(), want[1])
                assert torch.equal(got[0].cpu().view(view), want[0].view(view))


@pytest.mark.gpu
def test_cuda_programmatic_dependent_launch():
    """Launches with programmatic dependent launch (the machine's cuda.bindings) give the bits of
    CuPy's plain launches, eagerly and in a CUDA graph, hint-free and hinted; and the driver did
    not refuse them."""
    _cuda_or_skip()
    from flashrt_kernels.topk import cuda_select

    x = torch.randn(8, 1 << 17, device="cuda")
    k = 1024
    hint = torch.topk(x + 0.01 * torch.randn_like(x), k).indices.int()
    for h in (None, hint):
        outs = []
        for pdl in (False, True):
            ov = torch.full((8, k), float("nan"), device="cuda")
            oi = torch.full((8, k), -7, dtype=torch.int32, device="cuda")
            cuda_select.launch(x, k, None, ov, oi, None, h, None, pdl, False)
            outs.append((ov.view(torch.int32).clone(), oi.clone()))
        assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
        ov = torch.full((8, k), float("nan"), device="cuda")
        oi = torch.full((8, k), -7, dtype=torch.int32, device="cuda")
        cuda_select.launch(x, k, None, ov, oi, None, h, None, True, False)  # workspace exists
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            cuda_select.launch(x, k, None, ov, oi, None, h, None, True, False)
        ov.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(ov.view(torch.int32), outs[0][0]) and torch.equal(oi, outs[0][1])
    want = reference.topk(x.cpu(), k)
    assert torch.equal(outs[0][1].cpu(), want[1])
    assert cuda_select.pdl_available(), cuda_select._PDL_BROKEN


def _tool(name: str):
    """A module of the repository's tools/ folder, loaded from its file."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "tools" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def test_short_row_phase_tool_finds_its_stamp_lines():
    """tools/topk_short_phases.py places its stamps by matching lines of the CUDA source: each
    must still match exactly once (else the tool would time something else)."""
    src = _tool("topk_short_phases").stamped_source()
    assert all(f"STAMP({i});" in src for i in range(8))
    assert src.count("WALL(") == 2 + 1  # the two stamps and the macro's definition


def test_timeline_tool_stamps_every_launch_and_compiles():
    """tools/topk_timeline.py stamps each kernel of a long row's call by matching lines inside
    that kernel: every event is placed exactly once, in the kernel that writes it, and the
    stamped source still compiles for sm_90 (NVRTC, no GPU needed)."""
    from flashrt_kernels import cuda_nvrtc
    from flashrt_kernels.topk import cuda_select

    tool = _tool("topk_timeline")
    src = tool.stamped_source()
    placed = []
    for kernel, edits in tool.STAMPS.items():
        start, end = tool._kernel_span(src, kernel)
        for _, stamped, events in edits:
            assert src.count(stamped) == 1 and start < src.index(stamped) < end, (kernel, events)
            placed += events
    assert sorted(placed) == sorted(tool.EVENTS) and tool.SLOTS == len(tool.EVENTS)
    if not cuda_nvrtc.available():
        pytest.skip("no cuda.bindings / NVRTC here")
    cubin, _ = cuda_nvrtc.compile_cubin(src, cuda_select.NAMES, "sm_90", ("-std=c++17",))
    assert b"g_ev" in cubin


def test_nvrtc_compiles_the_select_source_without_a_gpu():
    """The CUDA backend needs no CuPy: cuda.bindings' NVRTC (installed with torch's CUDA 13
    wheels) compiles its source for sm_90 on a machine without a GPU, every kernel named."""
    from flashrt_kernels import cuda_nvrtc
    from flashrt_kernels.topk import cuda_select

    if not cuda_nvrtc.available():
        pytest.skip("no cuda.bindings / NVRTC here")
    cubin, lowered = cuda_nvrtc.compile_cubin(cuda_select.source(), cuda_select.NAMES, "sm_90",
                                              ("-std=c++17",))  # fmt: skip
    assert cubin[:4] == b"\x7fELF"
    assert sorted(lowered) == sorted(cuda_select.NAMES)
    assert lowered["finish_kernel<0>"].startswith("_Z13finish_kernelILi0E")
    assert all(name.encode() in cubin for name in lowered.values())
    with pytest.raises(RuntimeError, match="could not compile"):
        cuda_nvrtc.compile_cubin("__global__ void f() { undeclared(); }", ["f"], "sm_90")


def test_nvrtc_cubins_are_cached_on_disk(tmp_path, monkeypatch):
    """Only a machine's first process compiles: the second call reads the cubin and the lowered
    names back (and compiles again if the cache was damaged)."""
    from flashrt_kernels import cuda_nvrtc

    if not cuda_nvrtc.available():
        pytest.skip("no cuda.bindings / NVRTC here")
    src, names = "template <int N> __global__ void f(int* p) { p[0] = N; }", ["f<1>", "f<2>"]
    first = cuda_nvrtc.cached_cubin(src, names, "sm_90", directory=tmp_path)
    assert len(list(tmp_path.glob("*.cubin"))) == 1 and len(list(tmp_path.glob("*.json"))) == 1
    calls = []
    monkeypatch.setattr(cuda_nvrtc, "compile_cubin", lambda *a: calls.append(a) or first)
    assert cuda_nvrtc.cached_cubin(src, names, "sm_90", directory=tmp_path) == first
    assert calls == []  # read from the cache
    next(tmp_path.glob("*.cubin")).write_bytes(b"junk")
    assert cuda_nvrtc.cached_cubin(src, names, "sm_90", directory=tmp_path) == first
    assert len(calls) == 1  # a damaged entry is compiled again
    assert cuda_nvrtc.cached_cubin(src, names, "sm_89", directory=tmp_path) == first
    assert len(calls) == 2  # another architecture is another entry


@pytest.mark.gpu
def test_cuda_backend_through_nvrtc_gives_the_cupy_bits(monkeypatch):
    """The backend compiled and launched through cuda.bindings (NVRTC + driver API: what runs
    where CuPy is not installed) gives the reference's bits: short and long rows, fp32 and bf16,
    per-row lengths, hint-free and hinted, with and without programmatic dependent launch, and
    replayed in a CUDA graph."""
    from flashrt_kernels import cuda_nvrtc
    from flashrt_kernels.topk import cuda_select

    if not torch.cuda.is_available() or not cuda_nvrtc.available():
        pytest.skip("needs a CUDA device and cuda.bindings with NVRTC")
    monkeypatch.setattr(cuda_select, "compiler", lambda: "nvrtc")
    gen = torch.Generator(device="cuda").manual_seed(5)
    for b, n, k, dtype in ((3, 5000, 300, torch.float32), (2, 32768, 2048, torch.bfloat16),
                           (4, 1 << 18, 1024, torch.float32)):  # fmt: skip
        x = torch.randn(b, n, device="cuda", generator=gen).to(dtype)
        lens = torch.tensor([n, n // 3, 0, n - 7][:b], dtype=torch.int32, device="cuda")
        want = reference.topk(x.cpu(), k, lens.cpu())
        hint = torch.topk(x.float(), k).indices.int()
        for h in (None, hint):
            for pdl in (False, True):
                ov = torch.full((b, k), float("nan"), device="cuda", dtype=dtype)
                oi = torch.full((b, k), -7, dtype=torch.int32, device="cuda")
                cuda_select.launch(x, k, lens, ov, oi, None, h, None, pdl)
                torch.cuda.synchronize()
                assert torch.equal(oi.cpu(), want[1]), (b, n, k, dtype, h is None, pdl)
                view = torch.int32 if dtype == torch.float32 else torch.int16
                assert torch.equal(ov.cpu().view(view), want[0].view(view))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            cuda_select.launch(x, k, lens, ov, oi, None, None, None, True)
        oi.fill_(-7)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(oi.cpu(), want[1])
    assert cuda_select._kernel.cache_info().currsize > 0
