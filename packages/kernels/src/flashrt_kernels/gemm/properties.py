"""Properties of the gemm family, run by the tests (both scales) and ``flashrt check``."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from flashrt_kernels.backends import triton_interpreter_active
from flashrt_kernels.gemm import reference
from flashrt_kernels.gemm.few_rows import linear, linear_gate_up_swiglu, linear_qkv
from flashrt_kernels.gemm.fp8_linear import ACTIVATIONS, fp8_linear
from flashrt_kernels.gemm.fp8_linear import TILES as FP8_TILES
from flashrt_kernels.gemm.fp8_linear import launch_config as fp8_launch_config
from flashrt_kernels.gemm.w4a8 import w4a8_linear
from flashrt_kernels.quant import quantize_rows, silu_mul
from flashrt_kernels.quant.int4 import quantize_int4
from flashrt_kernels.registry import Property, register_property
from flashrt_kernels.testing import (
    assert_exact,
    make_values,
    poisoned_empty,
    seeds,
    sizes,
    test_device,
    value_kinds,
)

# (K, N) of the real few-row shapes (3B / 8B projections; LM heads are in the W4A8 cases)
REAL_SHAPES = ((2048, 2560), (2048, 22016), (11008, 2048), (4096, 6144), (4096, 24576),
               (12288, 4096))  # fmt: skip
KINDS = ("normal", "uniform", "ties", "zeros", "outlier", "relu_plateau")
WEIGHTS = ("bf16", "int8", "fp8")


def _few_rows_cases(scale: str):
    if scale == "small":
        m, k, n = sizes(1, 40), sizes(1, 300), sizes(1, 80)
        shape = st.tuples(k, n)
    else:
        m, shape = sizes(1, 64, (1, 2, 15, 16, 17, 24, 32, 63, 64)), st.sampled_from(REAL_SHAPES)
    return st.fixed_dictionaries(
        {"m": m, "shape": shape, "weight": st.sampled_from(WEIGHTS),
         "kind": value_kinds(*KINDS), "seed": seeds()}
    )  # fmt: skip


def _few_rows_examples(scale: str):
    base = {"kind": "normal", "seed": 0}
    if scale == "small":
        pts = [(1, (1, 1)), (17, (129, 33)), (16, (128, 32)), (33, (257, 17)), (40, (300, 80))]
    else:
        pts = [(1, (11008, 2048)), (64, (2048, 2560)), (17, (12288, 4096))]
    return [{**base, "m": m, "shape": s, "weight": w} for m, s in pts for w in WEIGHTS]


def _few_rows_inputs(case, device):
    (k, n), s = case["shape"], case["seed"]
    x = make_values(case["kind"], (case["m"], k), torch.bfloat16, s, device)
    w = make_values("normal", (n, k), torch.bfloat16, s + 1, device, scale=0.05)
    if case["weight"] == "bf16":
        return x, w, None
    wq, ws = quantize_rows(w, case["weight"], backend="reference")
    return x, wq, ws


def _linear_bound(x, w, ws, k):
    return 2.0**-8, k * 2.0**-22 * reference.abs_products(x, w.float(), ws)


def _assert_launches_agree(got, want, what: str) -> None:
    """Two launches of the same rows and columns agree bit for bit. Under Triton's interpreter a
    tile's dot is a numpy matmul, whose fp32 sums depend on an element's row and column position
    in the tile (a slice of a product differs in its last bits from the product of the slice),
    so there two launches may round one bf16 ulp apart; the GPU run of each property asserts
    the bits."""
    if not triton_interpreter_active():
        assert_exact(got, want, what=what)
        return
    apart = (got.view(torch.int16).int() - want.view(torch.int16).int()).abs()
    assert not (apart > 1).any(), (
        f"{what}: {int((apart > 1).sum())} elements more than one bf16 ulp apart (interpreter)"
    )


def _check_linear(case) -> None:
    """Faithful to float64, and batch-invariant: rows launched in any group are bit-identical (on
    a GPU; ``_assert_launches_agree``)."""
    device = test_device()
    x, w, ws = _few_rows_inputs(case, device)
    out = poisoned_empty((x.shape[0], w.shape[0]), torch.bfloat16, device)
    y = linear(x, w, ws, out=out, backend="triton")
    assert y.data_ptr() == out.data_ptr()
    ref = reference.linear_f64(x, w.float(), ws)
    rtol, atol = _linear_bound(x, w, ws, x.shape[1])
    err = (y.double() - ref).abs()
    bad = err > rtol * ref.abs() + atol
    assert not bad.any(), f"few-row linear: {int(bad.sum())} elements outside the bound"
    assert not torch.isnan(y).any()
    m = x.shape[0]
    for lo, hi in ((m // 2, m), (m - 1, m), (0, max(1, m // 3))):
        if hi > lo:
            part = linear(x[lo:hi].contiguous(), w, ws, backend="triton")
            _assert_launches_agree(part, y[lo:hi], what=f"rows {lo}:{hi} launched alone")


def _check_fused_qkv_and_gate_up(case) -> None:
    """q|k|v in one launch == three launches; gate|up + SwiGLU epilogue == two launches +
    silu_mul (bit for bit)."""
    device = test_device()
    x, w, ws = _few_rows_inputs(case, device)
    n = w.shape[0]
    a, b = n // 3, (2 * n) // 3
    sizes_ = (a, b - a, n - b)
    q, k_, v = linear_qkv(x, w, sizes_, ws, backend="triton")
    for got, lo, hi in ((q, 0, a), (k_, a, b), (v, b, n)):
        if hi > lo:
            sep = linear(x, w[lo:hi], ws[lo:hi] if ws is not None else None, backend="triton")
            _assert_launches_agree(got, sep, what=f"fused q|k|v columns {lo}:{hi}")
    if n >= 2:
        i = n // 2
        wg = w[: 2 * i]
        gsc = ws[: 2 * i] if ws is not None else None
        out = poisoned_empty((x.shape[0], i), torch.bfloat16, device)
        fused = linear_gate_up_swiglu(x, wg, gsc, out=out, backend="triton")
        g = linear(x, wg[:i], gsc[:i] if gsc is not None else None, backend="triton")
        u = linear(x, wg[i:], gsc[i:] if gsc is not None else None, backend="triton")
        sep = silu_mul(torch.cat([g, u], dim=1), backend="triton")
        _assert_launches_agree(fused, sep, what="gate|up SwiGLU epilogue vs separate")


PROPERTIES = {}


def _register(prop: Property) -> None:
    PROPERTIES[prop.qualname] = register_property(prop)


_register(Property("few_rows_linear", "faithful_and_batch_invariant", _few_rows_cases,
                   _check_linear, _few_rows_examples))  # fmt: skip
_register(Property("few_rows_linear", "fused_equals_separate", _few_rows_cases,
                   _check_fused_qkv_and_gate_up, _few_rows_examples))  # fmt: skip


# ---- W4A8 -----------------------------------------------------------------------------------------
W4A8_REAL = (*REAL_SHAPES, (2048, 4099))  # plus an odd, padded "vocabulary"


def _w4a8_cases(scale: str):
    if scale == "small":
        m, shape = sizes(1, 40), st.tuples(st.sampled_from((128, 256, 384)), sizes(1, 100))
    else:
        m, shape = sizes(1, 64, (1, 2, 15, 16, 17, 63, 64)), st.sampled_from(W4A8_REAL)
    return st.fixed_dictionaries(
        {"m": m, "shape": shape, "prologue": st.booleans(), "pad_to": st.sampled_from((1, 32, 64)),
         "kind": value_kinds(*KINDS), "seed": seeds()}
    )  # fmt: skip


def _w4a8_examples(scale: str):
    base = {"kind": "outlier", "seed": 1, "pad_to": 32}
    pts = [(1, (128, 1)), (17, (256, 33)), (16, (384, 64))] if scale == "small" else [
        (1, (2048, 4099)), (16, (2048, 22016)), (64, (11008, 2048))]  # fmt: skip
    return [{**base, "m": m, "shape": s, "prologue": p} for m, s in pts for p in (True, False)]


def _check_w4a8(case) -> None:
    """Exact against the integer reference, whichever way the activations arrive."""
    device = test_device()
    (k, n), s = case["shape"], case["seed"]
    x = make_values(case["kind"], (case["m"], k), torch.bfloat16, s, device)
    w = quantize_int4(make_values("normal", (n, k), torch.float32, s + 1, device),
                      pad_to=case["pad_to"])  # fmt: skip
    want = w4a8_linear(x, w, backend="reference")
    out = poisoned_empty((case["m"], n), torch.bfloat16, device)
    if case["prologue"]:
        got = w4a8_linear(x, w, out=out, backend="triton")
    else:
        xq, xs = quantize_rows(x, "int8", backend="triton")
        got = w4a8_linear(xq=xq, xs=xs, weight=w, out=out, backend="triton")
    assert_exact(got, want, what="W4A8 vs the integer reference")


_register(Property("w4a8_linear", "exact", _w4a8_cases, _check_w4a8, _w4a8_examples))


# ---- FP8 prefill ----------------------------------------------------------------------------------
def _fp8_cases(scale: str):
    if scale == "small":
        m, k, n = sizes(1, 80), sizes(1, 160), sizes(1, 80)
    else:
        m = st.sampled_from((1, 64, 129, 520, 2048))
        k, n = st.sampled_from((1152, 2048, 4096)), st.sampled_from((1152, 4304, 6144))
    return st.fixed_dictionaries(
        {"m": m, "k": k, "n": n, "act": st.sampled_from(ACTIVATIONS), "bias": st.booleans(),
         "residual": st.booleans(), "wide_out": st.booleans(), "seed": seeds(),
         "tile": st.sampled_from((None, *FP8_TILES))}
    )  # fmt: skip


def _fp8_examples(scale: str):
    base = {"act": "gelu_tanh", "bias": True, "residual": True, "wide_out": True, "seed": 2,
            "tile": None}  # fmt: skip
    pts = [(1, 1, 1), (65, 129, 33), (64, 128, 64)] if scale == "small" else [(2048, 4096, 6144)]
    return [{**base, "m": m, "k": k, "n": n} for m, k, n in pts]


def _check_fp8(case) -> None:
    device = test_device()
    m, k, n, s = case["m"], case["k"], case["n"], case["seed"]
    xq, xs = quantize_rows(make_values("normal", (m, k), torch.float32, s), "fp8",
                           backend="reference")  # fmt: skip
    wq, ws = quantize_rows(make_values("normal", (n, k), torch.float32, s + 1), "fp8",
                           backend="reference")  # fmt: skip
    xq, xs, wq, ws = xq.to(device), xs.to(device), wq.to(device), ws.to(device)
    bias = make_values("normal", (n,), torch.bfloat16, s + 2, device) if case["bias"] else None
    res = make_values("normal", (m, n), torch.bfloat16, s + 3, device) if case["residual"] else None
    buf = poisoned_empty((m, n + 8 if case["wide_out"] else n), torch.bfloat16, device)
    out = buf[:, 4 : 4 + n] if case["wide_out"] else buf
    cfg = None if case["tile"] is None else fp8_launch_config(m, n, case["tile"])
    y = fp8_linear(xq, xs, wq, ws, bias=bias, residual=res, activation=case["act"], out=out,
                   backend="triton", config=cfg)  # fmt: skip
    want = reference.fp8_linear(xq, xs, wq, ws, bias, case["act"], res)
    sabs = reference.abs_products(xq.float(), wq.float()) * xs.double()[:, None] * ws.double()
    err = (y.double() - want.double()).abs()
    bound = 2.0**-7 * want.double().abs() + 1.2 * k * 2.0**-20 * sabs + 2.0**-7
    bad = err > bound
    assert not bad.any(), f"fp8_linear: {int(bad.sum())} of {bad.numel()} outside the bound"
    if case["wide_out"]:
        assert torch.isnan(buf[:, :4]).all() and torch.isnan(buf[:, 4 + n :]).all()


_register(Property("fp8_linear", "faithful", _fp8_cases, _check_fp8, _fp8_examples))


# ---- NVFP4 W4A4 -----------------------------------------------------------------------------------
def _nvfp4_cases(scale: str):
    if scale == "small":
        m, k, n = sizes(1, 40), st.sampled_from((64, 128, 192)), sizes(1, 70)
    else:
        m = st.sampled_from((1, 16, 64, 2048))
        k, n = st.sampled_from((2048, 4096)), st.sampled_from((2560, 6144))
    return st.fixed_dictionaries(
        {"m": m, "k": k, "n": n, "a_per_row": st.booleans(), "kind": value_kinds(*KINDS),
         "seed": seeds()}
    )  # fmt: skip


def _nvfp4_examples(scale: str):
    pts = [(1, 64, 1), (17, 128, 33), (16, 192, 64)] if scale == "small" else [(64, 4096, 6144)]
    return [{"m": m, "k": k, "n": n, "a_per_row": True, "kind": "outlier", "seed": 5}
            for m, k, n in pts]  # fmt: skip


def _check_nvfp4(case) -> None:
    from flashrt_kernels.gemm.nvfp4_linear import nvfp4_linear
    from flashrt_kernels.quant.reference import nvfp4_dequantize, nvfp4_quantize

    device = test_device()
    m, k, n, s = case["m"], case["k"], case["n"], case["seed"]
    x = make_values(case["kind"], (m, k), torch.float32, s, device)
    w = make_values("normal", (n, k), torch.float32, s + 1, device)
    a, b = nvfp4_quantize(x, per_row=case["a_per_row"]), nvfp4_quantize(w, per_row=True)
    out = poisoned_empty((m, n), torch.bfloat16, device)
    y = nvfp4_linear(*a, *b, out=out, backend="triton")
    one = torch.ones(1, device=device)
    av = nvfp4_dequantize(a[0], a[1], one, torch.float64)
    wv = nvfp4_dequantize(b[0], b[1], one, torch.float64)
    alpha = a[2].double().reshape(-1, 1) * b[2].double().reshape(1, -1)
    ref = (av @ wv.t()) * alpha
    sabs = (av.abs() @ wv.abs().t()) * alpha
    err = (y.double() - ref).abs()
    bad = err > 2.0**-8 * ref.abs() + k * 2.0**-22 * sabs
    assert not bad.any(), f"nvfp4_linear: {int(bad.sum())} of {bad.numel()} outside the bound"


_register(Property("nvfp4_linear", "faithful", _nvfp4_cases, _check_nvfp4, _nvfp4_examples))
