import pytest
import torch

from flashrt_kernels import rms_norm
from flashrt_kernels.norm import reference
from flashrt_kernels.registry import properties

PROPS = properties()
test_matches_reference = PROPS["rms_norm.matches_reference"].test("small")
test_rows_independent = PROPS["rms_norm.rows_independent"].test("small")
test_matches_reference_gpu = pytest.mark.gpu(PROPS["rms_norm.matches_reference"].test("real"))
test_rows_independent_gpu = pytest.mark.gpu(PROPS["rms_norm.rows_independent"].test("real"))


def _x(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, dtype=dtype)


def test_auto_on_cpu_is_the_reference():
    x, w = _x(4, 64), _x(64)
    y = rms_norm(x, w, 1e-6, backend="reference")
    assert torch.equal(y, reference.rms_norm(x, w, 1e-6)[0])


def test_custom_ops_registered_with_fakes():
    x, w, r = _x(3, 32), _x(32), _x(3, 32)
    with torch._subclasses.fake_tensor.FakeTensorMode():
        fx, fw, fr = (
            torch.empty(3, 32, dtype=torch.bfloat16),
            torch.empty(32, dtype=torch.bfloat16),
            torch.empty(3, 32, dtype=torch.bfloat16),
        )
        y, nr = torch.ops.flashrt.add_rms_norm(fx, fr, fw, 1e-6, "reference")
        assert y.shape == (3, 32) and nr.dtype == torch.bfloat16
    y, nr = torch.ops.flashrt.add_rms_norm(x, r, w, 1e-6, "reference")
    want_y, want_r = reference.rms_norm(x, w, 1e-6, r)
    assert torch.equal(y, want_y) and torch.equal(nr, want_r)
    out = torch.empty_like(x)
    torch.ops.flashrt.rms_norm_out(x, w, 1e-6, out, "reference")
    assert torch.equal(out, reference.rms_norm(x, w, 1e-6)[0])


def test_three_dimensional_input():
    x, w = _x(2, 5, 48), _x(48)
    y = rms_norm(x, w, 1e-5, backend="triton")
    torch.testing.assert_close(y, reference.rms_norm(x, w, 1e-5)[0], rtol=2**-6, atol=0)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"x": torch.randn(4, 8, dtype=torch.float64)}, TypeError, "x must have dtype in"),
        (
            {"weight": torch.randn(9, dtype=torch.bfloat16)},
            ValueError,
            r"weight must have shape \[8\]",
        ),
        ({"weight": torch.randn(8)}, TypeError, "weight must have dtype in"),
        ({"x": torch.randn(8, 4, dtype=torch.bfloat16).t()}, ValueError, "unit stride"),
        (
            {"x": torch.randn(2, 8, 4, dtype=torch.bfloat16).transpose(1, 2)},
            ValueError,
            "contiguous",
        ),
        ({"eps": 0.0}, ValueError, "eps must be > 0"),
        (
            {"out": torch.empty(4, 9, dtype=torch.bfloat16)},
            ValueError,
            r"out must have shape \[4, 8\]",
        ),
        ({"residual": torch.randn(4, 8)}, TypeError, "residual must have dtype"),
        ({"residual_out": torch.empty(4, 8, dtype=torch.bfloat16)}, ValueError, "without residual"),
        ({"backend": "fast"}, ValueError, "backend must be one of"),
        ({"backend": "cuda"}, ValueError, "not implemented"),
        ({"x": [1.0, 2.0]}, TypeError, "x must be a torch.Tensor"),
    ],
)
def test_bad_inputs_raise_clear_errors(kwargs, error, match):
    args = {
        "x": torch.randn(4, 8, dtype=torch.bfloat16),
        "weight": torch.randn(8, dtype=torch.bfloat16),
        "eps": 1e-6,
    }
    args.update(kwargs)
    with pytest.raises(error, match=match):
        rms_norm(args.pop("x"), args.pop("weight"), args.pop("eps"), **args)


@pytest.mark.gpu
def test_wrong_device_raises():
    x = torch.randn(4, 8, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="weight must be on cuda"):
        rms_norm(x, torch.randn(8, dtype=torch.bfloat16), 1e-6)


@pytest.mark.gpu
def test_cuda_graph_replay_is_exact():
    x = torch.randn(64, 2048, dtype=torch.bfloat16, device="cuda")
    w, r = torch.randn_like(x[0]), torch.randn_like(x)
    out, res_out = torch.empty_like(x), torch.empty_like(x)
    rms_norm(x, w, 1e-6, residual=r, out=out, residual_out=res_out)
    eager = out.clone(), res_out.clone()
    out.zero_()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        rms_norm(x, w, 1e-6, residual=r, out=out, residual_out=res_out)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager[0]) and torch.equal(res_out, eager[1])
