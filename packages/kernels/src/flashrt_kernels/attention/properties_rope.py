"""Properties of ``rope_append`` and ``rope_qk``: bit-identical to the torch compositions they
replace. ``rope_append``: on poisoned caches and query buffers (entries it must not write keep
their poison), strided q|k|v rows, every head layout and the three dtypes. ``rope_qk``: q and k as
column blocks of one q|k|v output or separate tensors, fp32 or model-dtype cos / sin, special
values, into poisoned output buffers."""

from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

from flashrt_kernels.attention import reference
from flashrt_kernels.attention.rope_append import rope_append
from flashrt_kernels.attention.rope_qk import rope_qk
from flashrt_kernels.registry import Property, register_property
from flashrt_kernels.testing import assert_exact, make_values, poison, seeds, sizes, test_device

HEADS = {"small": ((2, 1), (4, 2), (3, 3)), "real": ((16, 2), (32, 8), (28, 4), (16, 16))}
KINDS = ("normal", "outlier", "huge", "tiny", "denormal", "inf", "nan", "zeros")


@st.composite
def _cases(draw, scale: str):
    hq, hkv = draw(st.sampled_from(HEADS[scale]))
    return {
        "tokens": draw(sizes(0, 40 if scale == "small" else 2100)),
        "hq": hq,
        "hkv": hkv,
        "head_dim": draw(st.sampled_from((64, 72, 80, 128) if scale == "real" else (8, 10, 64))),
        "dtype": draw(st.sampled_from((torch.bfloat16, torch.float16, torch.float32))),
        "bias": draw(st.booleans()),
        "fused_rows": draw(st.booleans()),
        "kind": draw(st.sampled_from(KINDS)),
        "seed": draw(seeds()),
    }


def _examples(scale: str):
    base = {"dtype": torch.bfloat16, "bias": True, "fused_rows": True, "kind": "normal", "seed": 5}
    if scale == "small":
        return [{**base, "tokens": 17, "hq": 4, "hkv": 2, "head_dim": 64},
                {**base, "tokens": 1, "hq": 3, "hkv": 3, "head_dim": 10, "bias": False}]  # fmt: skip
    return [
        {**base, "tokens": 1400, "hq": 16, "hkv": 2, "head_dim": 128},
        {**base, "tokens": 33, "hq": 32, "hkv": 8, "head_dim": 128, "dtype": torch.float16},
    ]


def _cos_sin(t, d, dtype, seed, device):
    g = torch.Generator().manual_seed(seed)
    pos = torch.randint(0, 32768, (t, 1), generator=g).float()
    inv = 1.0 / (1e6 ** (torch.arange(0, d, 2).float() / d))
    ang = torch.cat([pos * inv, pos * inv], -1)
    return ang.cos().to(dtype).to(device), ang.sin().to(dtype).to(device)


def _check(case) -> None:
    device = test_device()
    t, hq, hkv, d, dt, s = (case[k] for k in ("tokens", "hq", "hkv", "head_dim", "dtype", "seed"))
    widths = (hq * d, hkv * d, hkv * d)
    qkv = make_values(case["kind"], (t, sum(widths)), dt, s, device)
    if case["fused_rows"]:  # column slices of one q|k|v output (strided rows)
        q, k, v = qkv.split(widths, dim=1)
    else:
        q, k, v = (x.contiguous() for x in qkv.split(widths, dim=1))
    biases = None
    if case["bias"]:
        biases = tuple(make_values("normal", (w,), dt, s + 1 + i, device)
                       for i, w in enumerate(widths))  # fmt: skip
    cos, sin = _cos_sin(t, d, dt, s, device)
    rows_n, cap = 3, max(8, math.ceil(t / 3) + 5)
    g = torch.Generator().manual_seed(s + 7)
    flat = torch.randperm(rows_n * cap, generator=g)[:t]  # distinct (row, slot) pairs
    rows, slots = (flat // cap).to(device), (flat % cap).to(torch.int32).to(device)
    n_q = t + 5
    q_index = torch.randperm(n_q, generator=g)[:t].to(device)
    caches = [poison(torch.empty(rows_n, cap, hkv, d, dtype=dt, device=device)) for _ in "kv"]
    q_out = poison(torch.empty(n_q, hq, d, dtype=dt, device=device))
    want = [x.clone() for x in (*caches, q_out)]
    reference.rope_append(q, k, v, cos, sin, want[0], want[1], rows, slots, want[2], q_index,
                          biases=biases)  # fmt: skip
    rope_append(q, k, v, cos, sin, caches[0], caches[1], rows, slots, q_out, q_index,
                biases=biases, backend="triton")  # fmt: skip
    for got, exp, what in zip((*caches, q_out), want, ("k_cache", "v_cache", "q_out"),
                              strict=True):  # fmt: skip
        assert_exact(got, exp, what=f"rope_append {what}")


register_property(Property("rope_append", "matches_reference", _cases, _check, _examples))


VISION_HEADS = {"small": ((2, 2), (4, 2), (3, 1)), "real": ((16, 16), (16, 16), (32, 8), (12, 4))}


@st.composite
def _qk_cases(draw, scale: str):
    hq, hk = draw(st.sampled_from(VISION_HEADS[scale]))
    dtype = draw(st.sampled_from((torch.bfloat16, torch.float16, torch.float32)))
    return {
        "tokens": draw(sizes(0, 40 if scale == "small" else 9000)),
        "hq": hq,
        "hk": hk,
        "head_dim": draw(st.sampled_from((72, 80, 64, 128) if scale == "real" else (8, 10, 80))),
        "dtype": dtype,
        "cos_dtype": draw(st.sampled_from((torch.float32, dtype))),
        "fused": draw(st.booleans()),
        "kind": draw(st.sampled_from(KINDS)),
        "seed": draw(seeds()),
    }


def _qk_examples(scale: str):
    base = {"dtype": torch.bfloat16, "cos_dtype": torch.float32, "fused": True, "kind": "normal",
            "seed": 3}  # fmt: skip
    if scale == "small":
        return [{**base, "tokens": 13, "hq": 2, "hk": 2, "head_dim": 80},
                {**base, "tokens": 1, "hq": 3, "hk": 1, "head_dim": 10, "fused": False}]  # fmt: skip
    return [  # Qwen2.5-VL's tower (16 heads, d=80) and Qwen3-VL's (16 heads, d=72)
        {**base, "tokens": 8192, "hq": 16, "hk": 16, "head_dim": 80},
        {**base, "tokens": 4100, "hq": 16, "hk": 16, "head_dim": 72, "kind": "outlier"},
    ]


def _vision_cos_sin(t, d, dtype, seed, device):
    """Axial (row, col) angles as the vision towers build them, in fp32, then cast."""
    g = torch.Generator().manual_seed(seed)
    hw = torch.randint(0, 128, (t, 2), generator=g).float()
    inv = 1.0 / (1e4 ** (torch.arange(0, d // 2, 2).float() / (d // 2)))
    freqs = (hw[..., None] * inv).reshape(t, 2 * inv.numel())[:, : d // 2]
    ang = torch.cat([freqs, freqs], -1)
    return ang.cos().to(dtype).to(device), ang.sin().to(dtype).to(device)


def _check_qk(case) -> None:
    device = test_device()
    t, hq, hk, d, dt, s = (case[k] for k in ("tokens", "hq", "hk", "head_dim", "dtype", "seed"))
    x = make_values(case["kind"], (t, hq + 2 * hk, d), dt, s, device)
    q, k = x[:, :hq], x[:, hq : hq + hk]  # column blocks of one q|k|v output
    if not case["fused"]:
        q, k = q.contiguous(), k.contiguous()
    cos, sin = _vision_cos_sin(t, d, case["cos_dtype"], s + 1, device)
    want = reference.rope_qk(q, k, cos, sin)
    out = tuple(poison(torch.empty(y.shape, dtype=dt, device=device)) for y in (q, k))
    got = rope_qk(q, k, cos, sin, out=out, backend="triton")
    for g, w, what in zip(got, want, ("q", "k"), strict=True):
        assert_exact(g, w, what=f"rope_qk {what}")
    fresh = rope_qk(q, k, cos, sin, backend="triton")
    for g, w in zip(fresh, want, strict=True):
        assert_exact(g, w, what="rope_qk without out")


register_property(Property("rope_qk", "matches_reference", _qk_cases, _check_qk, _qk_examples))
