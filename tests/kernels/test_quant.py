import importlib

import pytest
import torch
import triton
import triton.language as tl

from flashrt_kernels.quant import int4, paroquant, quantize_rows, reference
from flashrt_kernels.quant.device import e2m1_code_of_quotient
from flashrt_kernels.quant.properties import PROPERTIES as PROPS

NAMES = (
    "quantize_rows.exact",
    "rms_norm_quantize.exact",
    "silu_mul_quantize.exact",
    "rotate_quantize_rows.exact",
    "quantize_rows_nvfp4.exact",
    "layer_norm_quantize.exact",
    "rms_norm_quantize_nvfp4.exact",
)
for _n in NAMES:
    _op = _n.split(".")[0]
    globals()[f"test_{_op}_small"] = PROPS[_n].test("small")
    globals()[f"test_{_op}_gpu"] = pytest.mark.gpu(PROPS[_n].test("real"))


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def test_row_quantizers_hit_their_range_limits():
    x = torch.tensor([[1.0, -1.0, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0], [3e38, -3e38, 1.0, 0.0]])
    for fmt, qmax in (("int8", 127), ("fp8", 448)):
        q, s = reference.quantize_rows(x, fmt)
        assert q[0, 0].float() == qmax and q[0, 1].float() == -qmax
        assert torch.equal(q[1].float(), torch.zeros(4)) and s[1] > 0
        assert q[2, 0].float() == qmax and torch.isfinite(s).all()
        err = (reference.dequantize_rows(q, s) - x).abs()
        assert (err[0] <= s[0] * (0.5 if fmt == "int8" else 16)).all()


def test_int4_pack_unpack_round_trip():
    codes = torch.randint(0, 16, (5, 256), generator=_gen(0), dtype=torch.uint8)
    packed = reference.pack_int4(codes)
    assert packed.shape == (5, 128) and torch.equal(packed[:, 0] & 15, codes[:, 0])
    assert torch.equal(reference.unpack_int4(packed), codes)


def test_int4_group_quantization_is_within_half_a_step():
    w = torch.randn(7, 256, generator=_gen(1))
    w[0, :128] = 0.25  # a constant group
    q = int4.quantize_int4(w)
    err = (q.dequantize() - w).abs().reshape(7, 2, 128)
    assert (err <= q.scales[:7, :, None] * 0.5 + 1e-6).all()
    assert torch.equal(q.codes()[0, :128], q.codes()[0, :1].expand(128))


@pytest.mark.parametrize("pad_to", [1, 64])
def test_awq_round_trip_and_order(pad_to):
    w = int4.quantize_int4(torch.randn(24, 256, generator=_gen(2)), pad_to=pad_to)
    assert w.qweight.shape[0] == (64 if pad_to == 64 else 24) and w.out_features == 24
    qweight, qzeros, scales = int4.to_awq(w)
    assert qweight.shape == (256, 3) and qzeros.shape == (2, 3) and scales.shape == (2, 24)
    # nibble 1 of packed column 0 is column AWQ_ORDER[1] = 2
    assert int((qweight[5, 0] >> 4) & 15) == int(w.codes()[2, 5])
    back = int4.from_awq(qweight, qzeros, scales, pad_to=pad_to)
    assert torch.equal(back.qweight, w.qweight) and torch.equal(back.zeros, w.zeros)
    assert torch.equal(back.scales, w.scales.half().float())
    assert torch.equal(tuple(int4.to_awq(back))[0], qweight)


def test_gptq_round_trip_and_v1_zeros():
    w = int4.quantize_int4(torch.randn(16, 256, generator=_gen(3)) - 1.0)  # zeros > 0
    qweight, qzeros, scales = int4.to_gptq(w)
    assert qweight.shape == (32, 16) and qzeros.shape == (2, 2)
    assert int((qweight[0, 3] >> 8) & 15) == int(w.codes()[3, 2])  # row 8 * 0 + 2
    assert int(qzeros[1, 0] & 15) == int(w.zeros[0, 1]) - 1  # v1 stores zero - 1
    back = int4.from_gptq(qweight, qzeros, scales)
    assert torch.equal(back.qweight, w.qweight) and torch.equal(back.zeros, w.zeros)


def test_w4a8_integer_scales():
    s = torch.tensor([[0.5, 0.25], [1.0, 0.001]])
    s16, g = reference.w4a8_integer_scales(s)
    assert s16.tolist() == [[2048, 1024], [4096, 4]] and g.item() == pytest.approx(1.0 / 4096)


def test_paroquant_rotation_round_trip_and_invariance():
    pairs, theta, cs = paroquant.random_rotation(256, layers=8, seed=4)
    rot = paroquant.rotation_from_checkpoint(pairs, theta, cs)
    x = torch.randn(3, 256, generator=_gen(5))
    v = paroquant.rotate_activations(x, rot)
    torch.testing.assert_close(paroquant.unrotate(v, rot), x, rtol=1e-5, atol=1e-5)
    w = torch.randn(16, 256, generator=_gen(6))
    y = paroquant.rotate_weight(w, rot) @ v.t()
    torch.testing.assert_close(y, w @ x.t(), rtol=1e-4, atol=1e-4)
    q = paroquant.quantize_rotated(w, rot)
    qw, qz, sc = int4.to_awq(q.weight)
    ck = paroquant.from_checkpoint(pairs, theta, cs, qw, qz, sc, packing="awq")
    assert torch.equal(ck.weight.qweight, q.weight.qweight)
    with pytest.raises(ValueError, match="not disjoint"):
        bad = pairs.clone()
        bad[0, 1] = bad[0, 0]
        paroquant.rotation_from_checkpoint(bad, theta, cs)


def test_nvfp4_codes_scales_and_round_trip():
    x = torch.randn(4, 64, generator=_gen(7))
    x[1] = 0.0
    for per_row in (False, True):
        packed, sf, alpha = reference.nvfp4_quantize(x, per_row=per_row)
        assert packed.shape == (4, 32) and sf.shape == (4, 4) and sf.dtype == torch.float8_e4m3fn
        y = reference.nvfp4_dequantize(packed, sf, alpha)
        assert torch.equal(y[1], torch.zeros(64))
        # each element within half the widest e2m1 step (2) of its block's scale
        step = (sf.float() * (alpha[:, None] if per_row else alpha)).repeat_interleave(16, 1)
        assert ((y - x).abs() <= step + 1e-6).all()
        # values already on the grid re-quantize to the same codes and scales
        p2, sf2, _ = reference.nvfp4_quantize(y, per_row=per_row)
        assert torch.equal(reference.nvfp4_dequantize(p2, sf2, alpha), y)
    a = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 100.0])
    assert reference.e2m1_encode(a).tolist() == [0, 2, 2, 4, 4, 6, 6, 7, 7]


@triton.jit
def _codes_of_quotients(A, S, C, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    a = tl.load(A + i, mask=i < n, other=0.0)
    s = tl.load(S + i, mask=i < n, other=1.0)
    tl.store(C + i, e2m1_code_of_quotient(a, s, tl.zeros_like(i).to(tl.uint32)), mask=i < n)


def _e4m3_positive_values():
    bits = torch.arange(1, 0x7F, dtype=torch.uint8)  # every positive finite e4m3, subnormals too
    return bits.view(torch.float8_e4m3fn).float()


def test_e2m1_code_of_quotient_is_the_code_of_the_rounded_division():
    """Every positive e4m3 scale s against a at each threshold times s, its fp32 neighbours (two
    each side), zero, NaN and random magnitudes: the compare-only code equals e2m1 of the
    correctly rounded fp32 quotient a / s."""
    s = _e4m3_positive_values()
    t = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    at = (t[None, :] * s[:, None]).reshape(-1)
    as_int = at.view(torch.int32)
    near = torch.stack([(as_int + d).view(torch.float32) for d in (-2, -1, 0, 1, 2)], 1)
    rand = torch.rand(s.numel(), 16, generator=_gen(21)) * 7 * s[:, None]
    a = torch.cat([near.reshape(s.numel(), -1), rand, torch.zeros(s.numel(), 1),
                   torch.full((s.numel(), 1), float("nan"))], 1)  # fmt: skip
    sv = s[:, None].expand_as(a).contiguous()
    a, sv = a.reshape(-1).contiguous(), sv.reshape(-1)
    want = reference.e2m1_encode(a / sv)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    got = torch.empty(a.numel(), dtype=torch.int32, device=dev)
    _codes_of_quotients[(triton.cdiv(a.numel(), 1024),)](a.to(dev), sv.to(dev), got, a.numel(),
                                                  BLOCK=1024)  # fmt: skip
    assert torch.equal(got.cpu(), want.int())
    # +inf as the scale (an all-zero block) gives code 0
    assert reference.e2m1_encode(torch.tensor([0.0])).item() == 0


def test_nvfp4_quantizer_keeps_the_quotients_signs_and_zero_codes():
    """Blocks where x * g / sf underflows to -0 (tiny negatives next to a large value), subnormal
    inputs, an all-zero block and values at the e2m1 thresholds: the Triton quantizer's bytes
    are the reference's."""
    from flashrt_kernels.quant import quantize_rows_nvfp4

    x = torch.randn(6, 64, generator=_gen(22))
    x[0, :16] = torch.tensor([448.0, -1e-44, -1e-38, -3e-39, 1e-45, -1e-45, 0.0, -0.0] * 2)
    x[1, 16:32] = -1e-42
    x[2, 32:48] = 0.0
    x[3, :8] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -6.0]) / 6
    x[4, :] = -(2.0**-120)
    x[5, 48:64] = torch.tensor([6.0, -0.5, -0.2, 0.7, 1.3, -1.7, 2.6, 3.4] * 2)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    got = [t.cpu() for t in quantize_rows_nvfp4(x.to(dev), backend="triton")]
    want = reference.nvfp4_quantize(x, per_row=True)
    assert torch.equal(got[0], want[0])
    assert torch.equal(got[1].view(torch.uint8), want[1].view(torch.uint8))
    assert torch.equal(got[2], want[2])


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"fmt": "int4"}, ValueError, "fmt must be one of"),
        ({"x": torch.randn(4, 8, dtype=torch.float64)}, TypeError, "x must have dtype"),
        ({"x": torch.randn(8, 4).t()}, ValueError, "unit stride"),
        ({"out": (torch.empty(4, 8, dtype=torch.int8), torch.empty(3))}, ValueError, "scales"),
    ],
)
def test_bad_inputs_raise_clear_errors(kwargs, error, match):
    args = {"x": torch.randn(4, 8), "fmt": "int8"}
    args.update(kwargs)
    with pytest.raises(error, match=match):
        quantize_rows(args.pop("x"), args.pop("fmt"), **args)


@pytest.mark.gpu
def test_producers_in_a_cuda_graph_are_exact():
    from flashrt_kernels.quant import rms_norm_quantize

    x = torch.randn(16, 4096, dtype=torch.bfloat16, device="cuda")
    w, r = torch.randn_like(x[0]), torch.randn_like(x)
    q, s = (
        torch.empty(16, 4096, dtype=torch.float8_e4m3fn, device="cuda"),
        torch.empty(16, device="cuda"),
    )
    res = torch.empty_like(x)
    rms_norm_quantize(x, w, 1e-6, "fp8", residual=r, out=(q, s), residual_out=res)
    eager = q.view(torch.uint8).clone(), s.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        rms_norm_quantize(x, w, 1e-6, "fp8", residual=r, out=(q, s), residual_out=res)
    q.view(torch.uint8).zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(q.view(torch.uint8), eager[0]) and torch.equal(s, eager[1])


def test_paroquant_path_end_to_end_is_the_integer_reference():
    """Rotated INT4 weights, activations rotated + quantized in one kernel, then W4A8: equal to
    the integer reference on the rotated tensors, and close to the rotated activations times the
    dequantized rotated weights (the INT8 activation error only)."""
    from flashrt_kernels.gemm.w4a8 import w4a8_linear
    from flashrt_kernels.quant.rotate_quantize import rotate_quantize_rows

    pairs, theta, cs = paroquant.random_rotation(256, layers=8, seed=8)
    rot = paroquant.rotation_from_checkpoint(pairs, theta, cs)
    w = torch.randn(40, 256, generator=_gen(9)) * 0.1
    rw = paroquant.quantize_rotated(w, rot, pad_to=32)
    x = torch.randn(3, 256, generator=_gen(10)).to(torch.bfloat16)
    xq, xs = rotate_quantize_rows(x, rot, backend="triton")
    y = w4a8_linear(xq=xq, xs=xs, weight=rw.weight, backend="triton")
    assert torch.equal(y, w4a8_linear(xq=xq, xs=xs, weight=rw.weight, backend="reference"))
    want = paroquant.rotate_activations(x, rot) @ rw.weight.dequantize().t()
    assert (y.float() - want).abs().max() < 0.03 * want.abs().max()


def test_quant_custom_ops_have_fakes():
    with torch._subclasses.fake_tensor.FakeTensorMode():
        q, s = torch.ops.flashrt.quantize_rows(torch.empty(3, 32, dtype=torch.bfloat16), "fp8",
                                               "reference")  # fmt: skip
        assert q.dtype == torch.float8_e4m3fn and s.shape == (3,)
        c, sf, a = torch.ops.flashrt.quantize_rows_nvfp4(torch.empty(2, 64), "reference")
        assert c.shape == (2, 32) and sf.shape == (2, 4) and a.shape == (2,)
    x = torch.randn(3, 32, dtype=torch.bfloat16)
    q, s = torch.ops.flashrt.quantize_rows(x, "int8", "reference")
    rq, rs = reference.quantize_rows(x, "int8")
    assert torch.equal(q, rq) and torch.equal(s, rs)


def _nvfp4_norm_args(**kwargs):
    x = torch.randn(4, 32, generator=_gen(11)).to(torch.bfloat16)
    args = {"x": x, "weight": torch.ones(32, dtype=torch.bfloat16), "eps": 1e-6}
    args.update(kwargs)
    return args


_E4M3 = torch.float8_e4m3fn


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"x": torch.randn(4, 40).to(torch.bfloat16), "weight": torch.ones(40).bfloat16()},
         ValueError, "multiple of 16"),
        ({"x": torch.randn(4, 32)}, TypeError, "x must have dtype"),
        ({"x": torch.randn(32, 4).to(torch.bfloat16).t()}, ValueError, "unit stride"),
        ({"weight": torch.ones(16, dtype=torch.bfloat16)}, ValueError, "weight must have shape"),
        ({"weight": torch.ones(32, dtype=torch.float16)}, TypeError, "weight must have dtype"),
        ({"eps": 0.0}, ValueError, "eps must be > 0"),
        ({"residual": torch.randn(4, 32)}, TypeError, "residual must have dtype"),
        ({"residual_out": torch.empty(4, 32, dtype=torch.bfloat16)}, ValueError, "without residual"),
        ({"residual": torch.randn(4, 32).bfloat16(), "residual_out": torch.empty(4, 16).bfloat16()},
         ValueError, "residual_out must have shape"),
        ({"out": (torch.empty(4, 16, dtype=torch.uint8), torch.empty(4, 2, dtype=torch.uint8),
                  torch.empty(4))}, TypeError, "block scales"),
        ({"out": (torch.empty(4, 16, dtype=torch.uint8), torch.empty(4, 2, dtype=_E4M3),
                  torch.empty(1))}, ValueError, "alpha"),
        ({"out": (torch.empty(4, 32, dtype=torch.uint8), torch.empty(4, 2, dtype=_E4M3),
                  torch.empty(4))}, ValueError, "codes"),
        ({"backend": "cuda"}, ValueError, "backend"),
    ],
)  # fmt: skip
def test_rms_norm_quantize_nvfp4_bad_inputs_raise_clear_errors(kwargs, error, match):
    from flashrt_kernels.quant import rms_norm_quantize_nvfp4

    args = _nvfp4_norm_args(**kwargs)
    with pytest.raises(error, match=match):
        rms_norm_quantize_nvfp4(args.pop("x"), args.pop("weight"), args.pop("eps"), **args)


def test_rms_norm_quantize_points_nvfp4_to_its_sibling():
    from flashrt_kernels.quant import rms_norm_quantize

    args = _nvfp4_norm_args()
    with pytest.raises(ValueError, match="rms_norm_quantize_nvfp4"):
        rms_norm_quantize(args["x"], args["weight"], 1e-6, "nvfp4")


def test_rms_norm_quantize_nvfp4_ops_reference_and_gemm_layout():
    """Fakes of both custom ops; the custom ops give the function's bits; the reference backend is
    the torch composition; the fused outputs feed nvfp4_linear as they are and dequantize to the
    normalized rows within NVFP4's step."""
    from flashrt_kernels.gemm.nvfp4_linear import nvfp4_linear
    from flashrt_kernels.norm import rms_norm
    from flashrt_kernels.quant import rms_norm_quantize_nvfp4

    ops = torch.ops.flashrt
    with torch._subclasses.fake_tensor.FakeTensorMode():
        x = torch.empty(3, 64, dtype=torch.bfloat16)
        c, sf, a = ops.rms_norm_quantize_nvfp4(x, torch.empty(64, dtype=torch.bfloat16), 1e-6,
                                               "reference")  # fmt: skip
        assert c.shape == (3, 32) and sf.dtype == _E4M3 and sf.shape == (3, 4) and a.shape == (3,)
        *_, r = ops.add_rms_norm_quantize_nvfp4(x, x, torch.empty(64, dtype=torch.bfloat16),
                                                1e-6, "reference")  # fmt: skip
        assert r.shape == (3, 64) and r.dtype == torch.bfloat16
    x = torch.randn(3, 64, generator=_gen(12)).to(torch.bfloat16)
    res = torch.randn(3, 64, generator=_gen(13)).to(torch.bfloat16)
    w = (torch.rand(64, generator=_gen(14)) + 0.5).to(torch.bfloat16)
    got = rms_norm_quantize_nvfp4(x, w, 1e-6, residual=res, backend="triton")
    via_op = ops.add_rms_norm_quantize_nvfp4(x, res, w, 1e-6, "triton")
    for a, b in zip(got, via_op, strict=True):
        assert torch.equal(a.view(torch.uint8) if a.dtype == _E4M3 else a,
                           b.view(torch.uint8) if b.dtype == _E4M3 else b)  # fmt: skip
    ref = rms_norm_quantize_nvfp4(x, w, 1e-6, residual=res, backend="reference")
    want = reference.rms_norm_quantize_nvfp4(x, w, 1e-6, res)
    assert torch.equal(ref[0], want[0]) and torch.equal(ref[2], want[2])
    assert torch.equal(ref[3], want[3]) and torch.equal(got[3], want[3])
    y = rms_norm(x, w, 1e-6, residual=res, backend="triton")[0]
    deq = reference.nvfp4_dequantize(*got[:3])
    step = (got[1].float() * got[2][:, None]).repeat_interleave(16, 1)
    assert ((deq - y.float()).abs() <= step + 1e-6).all()
    wc, wsf, wa = reference.nvfp4_quantize(torch.randn(8, 64, generator=_gen(15)), per_row=True)
    out = nvfp4_linear(*got[:3], wc, wsf, wa, backend="triton").double()
    wdeq = reference.nvfp4_dequantize(wc, wsf, wa, torch.float64)
    exact = deq.double() @ wdeq.t()
    bound = 2.0**-8 * exact.abs() + 64 * 2.0**-22 * (deq.double().abs() @ wdeq.abs().t())
    assert ((out - exact).abs() <= bound).all()


@pytest.mark.gpu
def test_rms_norm_quantize_nvfp4_in_a_cuda_graph_is_exact():
    from flashrt_kernels.quant import rms_norm_quantize_nvfp4

    x = torch.randn(16, 4096, dtype=torch.bfloat16, device="cuda")
    w, r = torch.randn_like(x[0]), torch.randn_like(x)
    out = (torch.empty(16, 2048, dtype=torch.uint8, device="cuda"),
           torch.empty(16, 256, dtype=_E4M3, device="cuda"), torch.empty(16, device="cuda"))  # fmt: skip
    res = torch.empty_like(x)
    rms_norm_quantize_nvfp4(x, w, 1e-6, residual=r, out=out, residual_out=res)
    eager = [t.view(torch.uint8).clone() if t.dtype == _E4M3 else t.clone() for t in (*out, res)]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        rms_norm_quantize_nvfp4(x, w, 1e-6, residual=r, out=out, residual_out=res)
    for t in (*out, res):
        t.view(torch.uint8).zero_()
    graph.replay()
    torch.cuda.synchronize()
    for t, e in zip((*out, res), eager, strict=True):
        assert torch.equal(t.view(torch.uint8) if t.dtype == _E4M3 else t, e)


def _layer_norm_by(config, x, w, b, fmt):
    """layer_norm and layer_norm_quantize outputs of ``quant.layer_norm._launch`` with the given
    launch (BLOCK_A, BLOCK_B, ROWS, num_warps)."""
    ln = importlib.import_module("flashrt_kernels.quant.layer_norm")
    n, k = x.shape
    y = torch.full_like(x, float("nan"))
    q = torch.full((n, k), 0x55, dtype=torch.uint8, device=x.device)
    s = torch.full((n,), float("nan"), device=x.device)
    ln._launch(x, w, b, 1e-5, y, None, None, fmt, False, config)
    ln._launch(x, w, b, 1e-5, None, q if fmt == "fp8" else q.view(torch.int8), s, fmt, True,
               config)  # fmt: skip
    return y.view(torch.int16), q, s


def _assert_layer_norm_segments_match(widths, launches, rows, device):
    """Two column segments (A full, B masked: ``column_split``) give the bits of the row padded
    to one power of two (B as wide as A): each sum is the padded tree, whose padding adds +0 (a
    -0.0 segment sum, all of its values -0.0, is the one corner where they would differ; no case
    here has one). The launch shape (rows a program, warps) moves no bit."""
    from flashrt_kernels.norm.rms_norm import column_split
    from flashrt_kernels.testing import make_values

    for i, k in enumerate(widths):
        for dt in (torch.bfloat16, torch.float16)[i % 2 :]:
            kind = ("normal", "outlier", "relu_plateau")[i % 3]
            x = make_values(kind, (rows, k), dt, 11 + i, device)
            w = make_values("normal", (k,), dt, 12 + i, device)
            b = make_values("normal", (k,), dt, 13 + i, device)
            block_a, block_b = column_split(k)
            for fmt in ("int8", "fp8"):
                padded = _layer_norm_by(
                    (block_a, triton.next_power_of_2(k) - block_a, 1, 4), x, w, b, fmt
                )
                for r, nw in launches:
                    got = _layer_norm_by((block_a, block_b, r, nw), x, w, b, fmt)
                    for name, a, e in zip(("y", "codes", "scales"), got, padded, strict=True):
                        assert torch.equal(a, e), f"k={k} {dt} {fmt} {r}x{nw}: {name} differ"


def test_layer_norm_segments_are_the_padded_row_bits():
    from flashrt_kernels.testing import test_device

    _assert_layer_norm_segments_match((5, 33, 300), ((1, 1), (2, 4)), 3, test_device())


@pytest.mark.gpu
def test_layer_norm_segments_are_the_padded_row_bits_gpu():
    _assert_layer_norm_segments_match((1152, 1280, 11008, 12288), ((1, 8), (1, 16), (2, 16)),
                                      65, "cuda")  # fmt: skip
