import pytest
import torch

from flashrt_kernels.gemm import linear, linear_gate_up_swiglu
from flashrt_kernels.gemm.fp8_linear import fp8_linear
from flashrt_kernels.gemm.properties import PROPERTIES as PROPS
from flashrt_kernels.gemm.w4a8 import w4a8_linear
from flashrt_kernels.quant.int4 import quantize_int4
from flashrt_kernels.quant.rows import quantize_rows

for _name, _prop in PROPS.items():
    _base = _name.replace(".", "_")
    globals()[f"test_{_base}_small"] = _prop.test("small")
    globals()[f"test_{_base}_gpu"] = pytest.mark.gpu(_prop.test("real"))


def _bf16(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


def test_reference_backend_and_custom_ops():
    x, w = _bf16(3, 64), _bf16(8, 64, seed=1)
    y = linear(x, w, backend="reference")
    assert torch.equal(y, (x.double() @ w.double().t()).to(torch.bfloat16))
    with torch._subclasses.fake_tensor.FakeTensorMode():
        fy = torch.ops.flashrt.few_rows_linear(torch.empty(3, 64, dtype=torch.bfloat16),
                                               torch.empty(8, 64, dtype=torch.bfloat16), None,
                                               "reference")  # fmt: skip
        assert fy.shape == (3, 8) and fy.dtype == torch.bfloat16
    assert torch.equal(torch.ops.flashrt.few_rows_linear(x, w, None, "reference"), y)


def test_gate_up_reference_is_silu_of_both_halves():
    from flashrt_kernels.quant.reference import silu_mul

    x, w = _bf16(2, 32), _bf16(16, 32, seed=2)
    want = silu_mul(linear(x, w, backend="reference"))
    assert torch.equal(linear_gate_up_swiglu(x, w, backend="reference"), want)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"x": torch.randn(2, 64)}, TypeError, "x must have dtype"),
        ({"weight": _bf16(8, 63)}, ValueError, "weight must be"),
        ({"weight": torch.zeros(8, 64, dtype=torch.int8)}, ValueError, "need w_scale"),
        ({"w_scale": torch.ones(8)}, ValueError, "only for int8"),
        ({"out": torch.empty(2, 9, dtype=torch.bfloat16)}, ValueError, "out must have shape"),
        ({"backend": "cute"}, ValueError, "not implemented"),
    ],
)
def test_linear_bad_inputs(kwargs, error, match):
    args = {"x": _bf16(2, 64), "weight": _bf16(8, 64)}
    args.update(kwargs)
    with pytest.raises(error, match=match):
        linear(args.pop("x"), args.pop("weight"), **args)


def test_w4a8_bad_inputs():
    w = quantize_int4(torch.randn(8, 128))
    with pytest.raises(ValueError, match="exactly one of"):
        w4a8_linear(weight=w)
    with pytest.raises(ValueError, match="K = 128"):
        w4a8_linear(_bf16(2, 64), w)
    with pytest.raises(TypeError, match="Int4Weight"):
        w4a8_linear(_bf16(2, 128), torch.zeros(8, 64))


def test_fp8_linear_bad_inputs():
    xq = torch.zeros(2, 32, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="activation must be one of"):
        fp8_linear(xq, torch.ones(2), xq, torch.ones(2), activation="relu")
    with pytest.raises(ValueError, match="wq must have shape"):
        fp8_linear(xq, torch.ones(2), xq[:, :16], torch.ones(2))


def test_fp8_linear_tile_fills_the_sms():
    """Mid-size problems take the largest tile whose grid still fills one wave of SMs; the
    bench's large problems keep 128 x 256."""
    from flashrt_kernels.gemm.fp8_linear import SMS, TILES, tile_for

    assert tile_for(4096, 6144) == "m128_n256"
    assert tile_for(130, 22016) == "m64_n128"  # 128-row tiles would be half padding
    assert tile_for(2816, 3840) == "m128_n128"
    assert tile_for(352, 1280) == "m64_n64"  # 60 programs even at 64 x 128
    for m in (65, 130, 256, 520, 1040, 2047):
        for n in (1280, 2048, 2560, 5120, 22016):
            name = tile_for(m, n)
            bm, bn = TILES[name][:2]
            if name != "m64_n64":
                assert -(-m // bm) * -(-n // bn) >= SMS


def test_few_rows_split_depends_on_k_alone():
    """The tile may follow M and N (it does not move bits); the split must not."""
    from flashrt_kernels.gemm.few_rows import TILES, launch_config, split_for, tile_for

    for k in (16, 2048, 4096, 8192, 11008, 12288):
        for n in (1, 2560, 4096, 6144, 22016, 24576, 151936):
            for m in (1, 4, 16, 17, 32, 33, 64):
                assert tile_for(k, n, m) in TILES
                for dtype in (torch.bfloat16, torch.int8):
                    assert launch_config(k, n, m, dtype)["SPLIT_K"] == split_for(k)
    assert launch_config(4096)["SPLIT_K"] == split_for(4096)


def _integers(*shape, seed=0, lo=-4, hi=5):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi, shape, generator=g).to(torch.bfloat16)


@pytest.mark.parametrize("split", [2, 3, 5])
def test_split_k_last_arrival_adds_every_partial(split):
    """Split K in one launch (``flashrt_kernels.arrival``): the last split program of each tile adds all the
    partials, on every tile, call after call (the tickets go back to zero). Integer-valued inputs
    make every fp32 / int64 sum exact, so any lost or doubled partial changes the result; K = 768
    with split 5 leaves empty splits (granule 256), W4A8 at K = 640 too (5 groups)."""
    from flashrt_kernels import arrival
    from flashrt_kernels.gemm import reference

    x, w = _integers(19, 768, seed=split), _integers(70, 768, seed=split + 1)
    cfg = {"BLOCK_N": 32, "BLOCK_K": 64, "SPLIT_K": split, "num_warps": 4, "num_stages": 1}
    want = reference.linear(x, w)
    wg = _integers(2 * 35, 768, seed=split + 2)
    want_gu = linear_gate_up_swiglu(x, wg, config={**cfg, "SPLIT_K": 1})
    w4 = quantize_int4(torch.randn(70, 640, generator=torch.Generator().manual_seed(split)))
    want4 = w4a8_linear(x[:, :640].contiguous(), w4, backend="reference")
    cfg4 = {"BLOCK_N": 32, "SPLIT_K": split, "num_warps": 4, "num_stages": 1}
    for _ in range(2):
        assert torch.equal(linear(x, w, config=cfg), want)
        assert torch.equal(linear_gate_up_swiglu(x, wg, config=cfg), want_gu)
        assert torch.equal(w4a8_linear(x[:, :640].contiguous(), w4, config=cfg4), want4)
    assert all(int(t.abs().sum()) == 0 for t in arrival._TICKETS.values())


@pytest.mark.gpu
@pytest.mark.parametrize("k, n", [(4096, 6144), (11008, 2048)])
def test_few_rows_cuda_graph_replay_is_exact(k, n):
    """A graph replays the bf16 and W4A8 linears (split K in one launch at K = 11008: the tickets
    must be back at zero after every replay) with new inputs, bit for bit as eager calls."""
    w = torch.randn(n, k, device="cuda").to(torch.bfloat16)
    w4 = quantize_int4(w.float())
    x = torch.randn(24, k, device="cuda").to(torch.bfloat16)
    out = torch.empty(24, n, dtype=torch.bfloat16, device="cuda")
    out4 = torch.empty_like(out)
    linear(x, w, out=out)
    w4a8_linear(x, w4, out=out4)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        linear(x, w, out=out)
        w4a8_linear(x, w4, out=out4)
    for seed in range(3):
        g = torch.Generator("cuda").manual_seed(seed)
        x.copy_(torch.randn(24, k, device="cuda", generator=g))
        out.zero_()
        out4.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, linear(x, w))
        assert torch.equal(out4, w4a8_linear(x, w4))


@pytest.mark.gpu
@pytest.mark.parametrize("k", [4096, 11008])
def test_few_rows_tile_choices_agree(k):
    """Different column tiles, K tiles, warps and stages give the same bits (the split stays a
    function of K; at K = 11008 it is 4, with boundaries that no K tile moves)."""
    from flashrt_kernels.gemm.few_rows import launch_config

    x = torch.randn(16, k, device="cuda").to(torch.bfloat16)
    w = torch.randn(2048, k, device="cuda").to(torch.bfloat16)
    base = linear(x, w)
    for bn, bk, warps in ((16, 64, 2), (64, 256, 4), (32, 128, 8), (16, 256, 4)):
        cfg = {**launch_config(k), "BLOCK_N": bn, "BLOCK_K": bk, "num_warps": warps}
        assert torch.equal(linear(x, w, config=cfg), base), (bn, bk, warps)


@pytest.mark.gpu
@pytest.mark.parametrize("k", [2048, 4096, 11008])
def test_every_launch_candidate_is_faithful_and_batch_invariant(k):
    from flashrt_kernels.gemm import few_rows, reference, w4a8
    from flashrt_kernels.quant.int4 import quantize_int4

    g = torch.Generator(device="cuda").manual_seed(k)
    x = torch.randn(64, k, device="cuda", generator=g).to(torch.bfloat16)
    w = (torch.randn(2560, k, device="cuda", generator=g) * 0.05).to(torch.bfloat16)
    ref = reference.linear_f64(x, w)
    bound = 2.0**-8 * ref.abs() + k * 2.0**-22 * reference.abs_products(x, w)
    wq = quantize_int4(w.float())
    want4 = w4a8.w4a8_linear(x, wq, backend="reference")
    w8, s8 = quantize_rows(w, "int8")
    first = first8 = None
    for name, make in few_rows.CANDIDATES.items():
        cfg = make(k)
        y = linear(x, w, config=cfg)
        assert ((y.double() - ref).abs() <= bound).all(), name
        first = y if first is None else first
        assert torch.equal(y, first), f"{name}: tiles must not change the bits"
        y8 = linear(x[:16], w8, s8, config=cfg)  # W8A16: the same K order for int8 weights
        first8 = y8 if first8 is None else first8
        assert torch.equal(y8, first8), f"{name}: tiles must not change the W8A16 bits"
        for lo, hi in ((7, 9), (0, 24), (40, 64)):  # 1 and 2 row tiles per program; y took 4
            assert torch.equal(linear(x[lo:hi].contiguous(), w, config=cfg), y[lo:hi]), name
    for name, make in w4a8.CANDIDATES.items():
        assert torch.equal(w4a8.w4a8_linear(x, wq, config=make(k, 2560)), want4), name


def test_wide_tile_is_faithful_in_the_interpreter():
    """The wide (prefill) tile's code path, run by the interpreter: faithful to float64, and its
    gate|up launch equals two of its linears then ``silu_mul`` (its bits against the 16-row tiles
    are a GPU test: the interpreter's fp32 dot sums in its own order)."""
    from flashrt_kernels.gemm import few_rows, reference
    from flashrt_kernels.quant import silu_mul
    from flashrt_kernels.testing import test_device

    device = test_device()
    x, w = _bf16(70, 300, seed=3).to(device), (_bf16(40, 300, seed=4) * 0.05).to(device)
    ref = reference.linear_f64(x, w)
    bound = 2.0**-8 * ref.abs() + 300 * 2.0**-22 * reference.abs_products(x, w)
    for make in few_rows.WIDE_CANDIDATES.values():
        cfg = make(300)
        y = linear(x, w, backend="triton", config=cfg)
        assert ((y.double() - ref).abs() <= bound).all()
        fused = linear_gate_up_swiglu(x, w, backend="triton", config=cfg)
        assert torch.equal(fused, silu_mul(y, backend="triton"))


@pytest.mark.gpu
@pytest.mark.parametrize("k", [1280, 2048, 3420, 11008])
def test_wide_tiles_give_the_few_row_bits(k):
    """Wide tiles (from ``WIDE_FROM`` rows of bf16 weights: one 2D dot a K step, the tensor
    cores' wide form) give the 16-row tiles' bits: plain, gate|up with its SwiGLU, and a row
    launched alone; K = 11008 takes the 4-way split."""
    from flashrt_kernels.gemm import few_rows

    g = torch.Generator(device="cuda").manual_seed(k)
    narrow = few_rows.CANDIDATES[few_rows.DEFAULT](k)
    for m, n in ((65, 2560), (130, 1000), (520, 3840), (2816, 1280)):
        x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
        w = (torch.randn(n, k, device="cuda", generator=g) * 0.05).to(torch.bfloat16)
        want = linear(x, w, config=narrow)
        for name, make in few_rows.WIDE_CANDIDATES.items():
            assert torch.equal(linear(x, w, config=make(k)), want), (name, m, n)
        assert torch.equal(linear(x, w), want), (m, n)  # the default tile for m rows
        assert torch.equal(linear(x[3:4].contiguous(), w), want[3:4])
        wg = w[: 2 * (n // 2)]
        assert torch.equal(
            linear_gate_up_swiglu(x, wg), linear_gate_up_swiglu(x, wg, config=narrow)
        )


@pytest.mark.parametrize("m", [3, 70])
def test_nvfp4_activations_dequantized_in_the_loop_or_before_give_the_same_bits(m):
    """``nvfp4_linear`` dequantizes the activation tile in its loop (up to 64 rows) or all of it to
    bf16 before the loop (above): the same exact values in the same dot, so the same bits; both
    faithful to float64 (the property tests bound the default path)."""
    from flashrt_kernels.gemm.nvfp4_linear import (
        nvfp4_launch_config,
        nvfp4_linear,
        reference_nvfp4_linear,
    )
    from flashrt_kernels.quant.reference import nvfp4_quantize
    from flashrt_kernels.testing import test_device

    device = test_device()
    x, w = _bf16(m, 192, seed=m).float().to(device), _bf16(40, 192, seed=9).float().to(device)
    a, b = nvfp4_quantize(x, per_row=True), nvfp4_quantize(w, per_row=True)
    cfg = nvfp4_launch_config(m, 40, 192)
    y_loop, y_before = (
        nvfp4_linear(*a, *b, backend="triton", config={**cfg, "A_CODES": in_loop})
        for in_loop in (True, False)
    )
    assert torch.equal(y_loop, y_before)
    ref = reference_nvfp4_linear(*a, *b).double()
    assert ((y_loop.double() - ref).abs() <= 2.0**-7 * ref.abs() + 1e-3).all()


def test_nvfp4_split_k_is_faithful_and_deterministic():
    """Few-row NVFP4 products split K (fp32 partials summed in split order) when the tiles alone
    would leave SMs idle: every split count stays in the faithful bound and repeats its bits."""
    from flashrt_kernels.gemm.nvfp4_linear import (
        nvfp4_launch_config,
        nvfp4_linear,
        reference_nvfp4_linear,
    )
    from flashrt_kernels.quant.reference import nvfp4_quantize
    from flashrt_kernels.testing import test_device

    assert nvfp4_launch_config(16, 4096, 12288, sms=132)["SPLIT_K"] == 8
    assert nvfp4_launch_config(16, 22016, 2048, sms=132)["SPLIT_K"] == 1
    assert nvfp4_launch_config(2048, 4096, 12288, sms=132)["SPLIT_K"] == 1
    device = test_device()
    x, w = _bf16(5, 512, seed=1).float().to(device), _bf16(140, 512, seed=2).float().to(device)
    a, b = nvfp4_quantize(x, per_row=True), nvfp4_quantize(w, per_row=False)
    ref = reference_nvfp4_linear(*a, *b).double()
    cfg = nvfp4_launch_config(5, 140, 512)
    for split in (1, 2, 3, 8):  # (several column tiles, each with its own ticket)
        y = nvfp4_linear(*a, *b, backend="triton", config={**cfg, "SPLIT_K": split})
        assert ((y.double() - ref).abs() <= 2.0**-7 * ref.abs() + 1e-3).all(), split
        again = nvfp4_linear(*a, *b, backend="triton", config={**cfg, "SPLIT_K": split})
        assert torch.equal(y, again), split
