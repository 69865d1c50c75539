"""Properties of the norm family, run by the tests (both scales) and ``flashrt check``."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from flashrt_kernels.norm import reference
from flashrt_kernels.norm.rms_norm import RTOL, rms_norm
from flashrt_kernels.registry import Property, register_property
from flashrt_kernels.testing import (
    assert_exact,
    assert_faithful,
    dtypes,
    make_values,
    poisoned_empty,
    seeds,
    sizes,
    test_device,
    value_kinds,
)

REAL_WIDTHS = (2048, 4096, 1152, 1280)
KINDS = ("normal", "uniform", "ties", "zeros", "inf", "nan", "huge", "tiny", "denormal", "outlier")


def _cases(scale: str):
    if scale == "small":
        rows, cols, dts = (
            sizes(1, 40),
            sizes(1, 300),
            dtypes(torch.float32, torch.bfloat16, torch.float16),
        )
    else:
        rows = sizes(1, 16384, (1, 2, 15, 16, 17, 127, 128, 129, 1024, 4096, 16384))
        cols, dts = (
            st.sampled_from(REAL_WIDTHS),
            dtypes(torch.bfloat16, torch.float32, torch.float16),
        )
    return st.fixed_dictionaries(
        {
            "rows": rows,
            "cols": cols,
            "dtype": dts,
            "kind": value_kinds(*KINDS),
            "residual": st.booleans(),
            "in_place": st.booleans(),
            "eps": st.sampled_from((1e-6, 1e-5)),
            "seed": seeds(),
        }
    )


def _examples(scale: str):
    base = {"kind": "normal", "residual": True, "in_place": False, "eps": 1e-6, "seed": 0}
    if scale == "small":
        shapes = [(1, 1), (17, 129), (16, 128), (3, 257)]
        return [{**base, "rows": r, "cols": c, "dtype": torch.bfloat16} for r, c in shapes]
    shapes = [(1, 2048), (1024, 4096), (16384, 1152), (129, 1280)]
    return [{**base, "rows": r, "cols": c, "dtype": torch.bfloat16} for r, c in shapes]


def _inputs(case, device):
    shape, dt, s = (case["rows"], case["cols"]), case["dtype"], case["seed"]
    x = make_values(case["kind"], shape, dt, s, device)
    w = make_values("normal", (case["cols"],), dt, s + 1, device)
    res = make_values("normal", shape, dt, s + 2, device) if case["residual"] else None
    return x, w, res


def _check_matches_reference(case) -> None:
    device = test_device()
    x, w, res = _inputs(case, device)
    eps, dt = case["eps"], case["dtype"]
    y_ref, r_ref = reference.rms_norm(x, w, eps, res)
    if case["in_place"]:
        out, res_out = x.clone(), (res.clone() if res is not None else None)
        got = rms_norm(
            out, w, eps, residual=res_out, out=out, residual_out=res_out, backend="triton"
        )
    else:
        out = poisoned_empty(x.shape, dt, device)
        res_out = poisoned_empty(x.shape, dt, device) if res is not None else None
        got = rms_norm(x, w, eps, residual=res, out=out, residual_out=res_out, backend="triton")
    y = got[0] if res is not None else got
    assert y.data_ptr() == out.data_ptr()
    if res is not None:
        assert_exact(res_out, r_ref, what="new residual")
    assert_faithful(y, y_ref, rtol=RTOL[dt], atol=torch.finfo(dt).tiny, what="rms_norm output")


def _check_rows_independent(case) -> None:
    """A row's output does not depend on how many rows are launched with it (bit for bit)."""
    device = test_device()
    x, w, res = _inputs(case, device)
    full = rms_norm(x, w, case["eps"], residual=res, backend="triton")
    k = max(1, case["rows"] // 3)
    part = rms_norm(
        x[k:], w, case["eps"], residual=res[k:] if res is not None else None, backend="triton"
    )
    if res is None:
        assert_exact(part, full[k:], what="rows launched apart")
    else:
        assert_exact(part[0], full[0][k:], what="rows launched apart")
        assert_exact(part[1], full[1][k:], what="residual of rows launched apart")


register_property(
    Property("rms_norm", "matches_reference", _cases, _check_matches_reference, _examples)
)
register_property(
    Property("rms_norm", "rows_independent", _cases, _check_rows_independent, _examples)
)
