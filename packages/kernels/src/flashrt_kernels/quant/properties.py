"""Properties of the quant family's kernels, run by the tests (both scales) and ``flashrt check``."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from flashrt_kernels.norm import rms_norm
from flashrt_kernels.quant import reference
from flashrt_kernels.quant.rows import (
    CODE_DTYPE,
    FORMATS,
    quantize_rows,
    rms_norm_quantize,
    silu_mul,
    silu_mul_quantize,
)
from flashrt_kernels.registry import Property, register_property
from flashrt_kernels.testing import (
    assert_exact,
    assert_faithful,
    make_values,
    poisoned_empty,
    seeds,
    sizes,
    test_device,
    value_kinds,
)
from flashrt_kernels.testing.values import VALUE_KINDS

REAL_WIDTHS = (2048, 4096, 1152, 11008, 12288)
KINDS = ("normal", "uniform", "ties", "zeros", "outlier", "huge", "tiny", "denormal",
         "relu_plateau")  # fmt: skip


def _cases(scale: str):
    if scale == "small":
        rows, cols = sizes(1, 40), sizes(1, 300)
    else:
        rows = sizes(1, 8192, (1, 2, 15, 16, 17, 64, 129, 1024, 8192))
        cols = st.sampled_from(REAL_WIDTHS)
    return st.fixed_dictionaries(
        {"rows": rows, "cols": cols, "fmt": st.sampled_from(FORMATS),
         "dtype": st.sampled_from((torch.bfloat16, torch.float16)), "kind": value_kinds(*KINDS),
         "residual": st.booleans(), "seed": seeds()}
    )  # fmt: skip


def _examples(scale: str):
    base = {"kind": "outlier", "residual": True, "seed": 0, "dtype": torch.bfloat16}
    shapes = [(1, 1), (17, 129), (16, 128), (3, 257)] if scale == "small" else [
        (1, 2048), (16, 12288), (129, 11008)]  # fmt: skip
    cases = [{**base, "rows": r, "cols": c, "fmt": f} for r, c in shapes for f in FORMATS]
    if scale == "real":  # the H200 case that tl.sum's layout-dependent order once failed
        cases.append({"rows": 1024, "cols": 2048, "fmt": "int8", "dtype": torch.float16,
                      "kind": "normal", "residual": False, "seed": 720782927})  # fmt: skip
    return cases


def _codes(q):
    return q.view(torch.uint8) if q.dtype == torch.float8_e4m3fn else q


def _buffers(case, rows, cols, device):
    return (
        poisoned_empty((rows, cols), CODE_DTYPE[case["fmt"]], device)
        if case["fmt"] == "int8"
        else torch.full((rows, cols), 0x7F, dtype=torch.uint8, device=device).view(
            torch.float8_e4m3fn
        ),
        poisoned_empty((rows,), torch.float32, device),
    )


def _check_quantize_rows(case) -> None:
    """Codes and scales bit-identical to the torch specification."""
    device = test_device()
    x = make_values(case["kind"], (case["rows"], case["cols"]), case["dtype"], case["seed"],
                    device)  # fmt: skip
    q, s = quantize_rows(x, case["fmt"], out=_buffers(case, *x.shape, device), backend="triton")
    rq, rs = reference.quantize_rows(x, case["fmt"])
    assert_exact(_codes(q), _codes(rq), what="codes")
    assert_exact(s, rs, what="scales")


def _check_rms_norm_quantize(case) -> None:
    """Fused RMSNorm -> quantized rows == norm.rms_norm then quantize_rows, bit for bit."""
    device = test_device()
    shape, dt, sd = (case["rows"], case["cols"]), case["dtype"], case["seed"]
    kind = case["kind"] if case["kind"] not in ("huge",) else "normal"
    x = make_values(kind, shape, dt, sd, device)
    w = make_values("normal", (case["cols"],), dt, sd + 1, device)
    res = make_values("normal", shape, dt, sd + 2, device) if case["residual"] else None
    got = rms_norm_quantize(x, w, 1e-6, case["fmt"], residual=res,
                            out=_buffers(case, *shape, device), backend="triton")  # fmt: skip
    sep = rms_norm(x, w, 1e-6, residual=res, backend="triton")
    y = sep[0] if res is not None else sep
    q, s = quantize_rows(y, case["fmt"], backend="triton")
    assert_exact(_codes(got[0]), _codes(q), what="fused codes vs rms_norm + quantize_rows")
    assert_exact(got[1], s, what="fused scales")
    if res is not None:
        assert_exact(got[2], sep[1], what="new residual")


def _check_silu_mul_quantize(case) -> None:
    """silu_mul faithful to torch (2 ulp); fused SiLU-mul -> quantized rows == silu_mul then
    quantize_rows, bit for bit."""
    device = test_device()
    shape, dt = (case["rows"], 2 * case["cols"]), case["dtype"]
    kind = case["kind"] if case["kind"] not in ("huge",) else "normal"
    gu = make_values(kind, shape, dt, case["seed"], device)
    h = silu_mul(gu, out=poisoned_empty((shape[0], case["cols"]), dt, device), backend="triton")
    ulp = 2.0**-7 if dt == torch.bfloat16 else 2.0**-10
    assert_faithful(h, reference.silu_mul(gu), rtol=2 * ulp, atol=2 * torch.finfo(dt).tiny,
                    what="silu_mul")  # fmt: skip
    q, s = silu_mul_quantize(gu, case["fmt"], out=_buffers(case, shape[0], case["cols"], device),
                             backend="triton")  # fmt: skip
    rq, rs = quantize_rows(h, case["fmt"], backend="triton")
    assert_exact(_codes(q), _codes(rq), what="fused codes vs silu_mul + quantize_rows")
    assert_exact(s, rs, what="fused scales")


PROPERTIES = {
    p.qualname: register_property(p)
    for p in (
        Property("quantize_rows", "exact", _cases, _check_quantize_rows, _examples),
        Property("rms_norm_quantize", "exact", _cases, _check_rms_norm_quantize, _examples),
        Property("silu_mul_quantize", "exact", _cases, _check_silu_mul_quantize, _examples),
    )
}


def _rot_cases(scale: str):
    if scale == "small":
        rows, k = sizes(1, 9), st.sampled_from((128, 256, 384))
    else:
        rows, k = sizes(1, 64, (1, 16, 17, 64)), st.sampled_from((2048, 4096, 11008, 12288))
    return st.fixed_dictionaries(
        {"rows": rows, "k": k, "layers": st.integers(1, 8), "kind": value_kinds(*KINDS),
         "dtype": st.sampled_from((torch.bfloat16, torch.float32)), "seed": seeds()}
    )  # fmt: skip


def _rot_examples(scale: str):
    k = 256 if scale == "small" else 4096
    return [{"rows": r, "k": k, "layers": 8, "kind": "outlier", "dtype": torch.bfloat16,
             "seed": 3} for r in (1, 5)]  # fmt: skip


def _check_rotate_quantize(case) -> None:
    """Channel scale + rotation layers + INT8 in one kernel == the torch specification."""
    from flashrt_kernels.quant import paroquant
    from flashrt_kernels.quant.rotate_quantize import rotate_quantize_rows

    device = test_device()
    k, sd = case["k"], case["seed"]
    rot = paroquant.rotation_from_checkpoint(*paroquant.random_rotation(k, case["layers"], sd))
    rot = paroquant.Rotation(*(t.to(device) for t in (rot.pair_i, rot.pair_j, rot.cos, rot.sin,
                                                       rot.channel_scales)))  # fmt: skip
    kind = case["kind"] if case["kind"] not in ("huge",) else "normal"
    x = make_values(kind, (case["rows"], k), case["dtype"], sd + 1, device)
    out = (poisoned_empty((case["rows"], k), torch.int8, device),
           poisoned_empty((case["rows"],), torch.float32, device))  # fmt: skip
    q, s = rotate_quantize_rows(x, rot, out=out, backend="triton")
    rq, rs = reference.quantize_rows(paroquant.rotate_activations(x, rot), "int8")
    assert_exact(q, rq, what="rotated INT8 codes")
    assert_exact(s, rs, what="rotated row scales")


PROPERTIES["rotate_quantize_rows.exact"] = register_property(
    Property("rotate_quantize_rows", "exact", _rot_cases, _check_rotate_quantize, _rot_examples)
)


def _nvfp4_cases(scale: str):
    if scale == "small":
        rows, k16 = sizes(1, 20), sizes(1, 24)
    else:
        rows, k16 = sizes(1, 4096, (1, 16, 17, 4096)), st.sampled_from((128, 256, 688, 768))
    return st.fixed_dictionaries(
        {"rows": rows, "k16": k16, "kind": value_kinds(*KINDS),
         "dtype": st.sampled_from((torch.bfloat16, torch.float16, torch.float32)),
         "seed": seeds()}
    )  # fmt: skip


def _nvfp4_examples(scale: str):
    k16s = (1, 3, 8) if scale == "small" else (128, 688)
    return [{"rows": 3, "k16": k, "kind": "outlier", "dtype": torch.bfloat16, "seed": 4}
            for k in k16s]  # fmt: skip


def _check_nvfp4_rows(case) -> None:
    """NVFP4 row codes, block scales and alphas bit-identical to the torch specification."""
    from flashrt_kernels.quant.nvfp4_rows import quantize_rows_nvfp4

    device = test_device()
    m, k = case["rows"], 16 * case["k16"]
    x = make_values(case["kind"], (m, k), case["dtype"], case["seed"], device)
    out = (torch.full((m, k // 2), 0xEE, dtype=torch.uint8, device=device),
           torch.full((m, k // 16), 0x7F, dtype=torch.uint8, device=device).view(
               torch.float8_e4m3fn),
           poisoned_empty((m,), torch.float32, device))  # fmt: skip
    q, sf, alpha = quantize_rows_nvfp4(x, out=out, backend="triton")
    rq, rsf, ra = reference.nvfp4_quantize(x, per_row=True)
    assert_exact(q, rq, what="e2m1 codes")
    assert_exact(sf.view(torch.uint8), rsf.view(torch.uint8), what="block scales")
    assert_exact(alpha, ra, what="row alphas")


PROPERTIES["quantize_rows_nvfp4.exact"] = register_property(
    Property("quantize_rows_nvfp4", "exact", _nvfp4_cases, _check_nvfp4_rows, _nvfp4_examples)
)


def _check_layer_norm_quantize(case) -> None:
    """layer_norm faithful to torch; LayerNorm -> quantized rows == layer_norm + quantize_rows."""
    from flashrt_kernels.quant.layer_norm import layer_norm, layer_norm_quantize

    device = test_device()
    shape, dt, sd = (case["rows"], case["cols"]), case["dtype"], case["seed"]
    kind = case["kind"] if case["kind"] not in ("huge", "tiny", "denormal") else "normal"
    x = make_values(kind, shape, dt, sd, device)
    w = make_values("normal", (case["cols"],), dt, sd + 1, device)
    b = make_values("normal", (case["cols"],), dt, sd + 2, device)
    y = layer_norm(x, w, b, 1e-5, out=poisoned_empty(shape, dt, device), backend="triton")
    ref = reference.layer_norm(x, w, b, 1e-5)
    ulp = 2.0**-7 if dt == torch.bfloat16 else 2.0**-10
    err = (y.double() - ref.double()).abs()
    bound = 2 * ulp * ref.double().abs() + 2.0**-12 * (w.double().abs() + b.double().abs())
    assert not (err > bound).any(), f"layer_norm: {int((err > bound).sum())} outside the bound"
    q, s = layer_norm_quantize(x, w, b, 1e-5, case["fmt"], out=_buffers(case, *shape, device),
                               backend="triton")  # fmt: skip
    rq, rs = quantize_rows(y, case["fmt"], backend="triton")
    assert_exact(_codes(q), _codes(rq), what="fused codes vs layer_norm + quantize_rows")
    assert_exact(s, rs, what="fused scales")


PROPERTIES["layer_norm_quantize.exact"] = register_property(
    Property("layer_norm_quantize", "exact", _cases, _check_layer_norm_quantize, _examples)
)


NVFP4_NORM_KINDS = (*KINDS, "zero_rows", "huge_outlier", "e2m1_grid", "scale_range")
_NVFP4_GRID = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0)


def _rms_nvfp4_cases(scale: str):
    if scale == "small":
        rows, k16 = sizes(1, 40), sizes(1, 40, (1, 2, 15, 16, 17, 31, 32, 33))
    else:
        rows = sizes(1, 8192, (1, 2, 15, 16, 17, 64, 129, 1024, 8192))
        k16 = st.sampled_from(tuple(c // 16 for c in REAL_WIDTHS))
    return st.fixed_dictionaries(
        {"rows": rows, "k16": k16, "kind": st.sampled_from(NVFP4_NORM_KINDS),
         "wkind": st.sampled_from(("normal", "tiny")),
         "dtype": st.sampled_from((torch.bfloat16, torch.float16)), "residual": st.booleans(),
         "seed": seeds()}
    )  # fmt: skip


def _rms_nvfp4_examples(scale: str):
    """Block-count boundaries (K = 16 * k16: one block, segment B of one block, powers of two),
    row boundaries of the 16-row programs, each adversarial kind with and without a residual."""
    if scale == "small":
        shapes = [(1, 1), (15, 15), (16, 16), (17, 17), (3, 127), (2, 128), (17, 129)]
    else:
        shapes = [(1, 128), (16, 688), (129, 768), (17, 72)]
    kinds = ("e2m1_grid", "zero_rows", "huge_outlier", "scale_range", "outlier", "huge", "zeros")
    return [
        {"rows": r, "k16": k16, "kind": kinds[(i + j) % len(kinds)], "wkind": "normal",
         "dtype": (torch.bfloat16, torch.float16)[(i + j) % 2], "residual": res, "seed": i}
        for i, (r, k16) in enumerate(shapes) for j, res in enumerate((False, True))
    ]  # fmt: skip


def _rms_nvfp4_inputs(case, device):
    """(x, weight, residual or None, eps) for an RMSNorm -> NVFP4 case, built from the seed.

    Own kinds: ``zero_rows`` (every other row of x + residual exactly zero: the amax floor),
    ``huge_outlier`` (one value per row at 2**60 in bf16, the sum of squares still finite, 2**15 in
    fp16: the other blocks' scales underflow UE4M3), ``e2m1_grid`` (eps 2**-8 dominates a tiny
    row, so the norm scales by 16 and, with unit weights, every 16-block holds a +-6 and values on
    the e2m1 rounding thresholds at a block shift 2**-s: exact ties, block scales 448 * 2**-s down
    to the UE4M3 subnormals and zero), ``scale_range`` (normal blocks of x and the residual
    scaled by 2**-U(0, 40)).
    """
    m, k, dt, sd, kind = case["rows"], 16 * case["k16"], case["dtype"], case["seed"], case["kind"]
    g = torch.Generator().manual_seed(sd)
    w = make_values(case["wkind"], (k,), dt, sd + 1)
    res = make_values("normal", (m, k), dt, sd + 2) if case["residual"] else None
    eps = 1e-6
    if kind in VALUE_KINDS:
        x = make_values(kind, (m, k), dt, sd)
    elif kind == "zero_rows":
        x = make_values("normal", (m, k), dt, sd)
        if res is None:
            x[0::2] = 0
        else:
            res[0::2] = -x[0::2]
    elif kind == "huge_outlier":
        x = make_values("normal", (m, k), dt, sd).float()
        big = 2.0**60 if dt == torch.bfloat16 else 2.0**15
        x[torch.arange(m), torch.randint(0, k, (m,), generator=g)] = big
        x = x.to(dt)
    elif kind == "scale_range":
        mult = 2.0 ** -torch.randint(0, 41, (m, k // 16, 1), generator=g).double()
        x = (torch.randn(m, k // 16, 16, generator=g, dtype=torch.float64) * mult).reshape(m, k)
        if res is not None:
            res = (res.double().reshape(m, k // 16, 16) * mult).reshape(m, k).to(dt)
        x = x.to(dt)
    else:  # e2m1_grid
        grid = torch.tensor(_NVFP4_GRID, dtype=torch.float64)
        v = grid[torch.randint(0, len(grid), (m, k // 16, 16), generator=g)]
        v[..., 0] = 6.0
        v = v[..., torch.randperm(16, generator=g)]
        v = v * torch.where(torch.rand(v.shape, generator=g) < 0.5, -1.0, 1.0).double()
        top = 21 if dt == torch.bfloat16 else (2 if res is None else 1)
        shift = torch.randint(0, top + 1, (m, k // 16, 1), generator=g).double()
        shift[:, 0] = 0
        v = (v * 2.0 ** -(19 + shift)).reshape(m, k)
        w, eps = torch.ones(k, dtype=dt), 2.0**-8
        if res is None:
            x = v.to(dt)
        else:
            x = (v / 2).to(dt)
            res = (v / 2).to(dt)
    x, w = x.to(device), w.to(device)
    return x, w, (res.to(device) if res is not None else None), eps


def _nvfp4_poisoned(m, k, device):
    return (torch.full((m, k // 2), 0xEE, dtype=torch.uint8, device=device),
            torch.full((m, k // 16), 0x7F, dtype=torch.uint8, device=device).view(
                torch.float8_e4m3fn),
            poisoned_empty((m,), torch.float32, device))  # fmt: skip


def _check_rms_norm_nvfp4(case) -> None:
    """Fused RMSNorm (+ residual) -> NVFP4 rows == norm.rms_norm then quantize_rows_nvfp4, bit
    for bit (codes, block scales and alphas as integers; the new residual)."""
    from flashrt_kernels.quant.nvfp4_rows import quantize_rows_nvfp4, rms_norm_quantize_nvfp4

    device = test_device()
    x, w, res, eps = _rms_nvfp4_inputs(case, device)
    m, k = x.shape
    res_out = poisoned_empty((m, k), x.dtype, device) if res is not None else None
    got = rms_norm_quantize_nvfp4(x, w, eps, residual=res, out=_nvfp4_poisoned(m, k, device),
                                  residual_out=res_out, backend="triton")  # fmt: skip
    sep = rms_norm(x, w, eps, residual=res, backend="triton")
    q, sf, alpha = quantize_rows_nvfp4(sep[0] if res is not None else sep, backend="triton")
    assert_exact(got[0], q, what="fused e2m1 codes vs rms_norm + quantize_rows_nvfp4")
    assert_exact(got[1].view(torch.uint8), sf.view(torch.uint8), what="fused block scales")
    assert_exact(got[2], alpha, what="fused row alphas")
    assert torch.equal(got[2], alpha), "fused row alphas (torch.equal)"
    if res is not None:
        assert got[3] is res_out
        assert_exact(got[3], sep[1], what="new residual")


PROPERTIES["rms_norm_quantize_nvfp4.exact"] = register_property(
    Property(
        "rms_norm_quantize_nvfp4",
        "exact",
        _rms_nvfp4_cases,
        _check_rms_norm_nvfp4,
        _rms_nvfp4_examples,
    )
)
