"""Properties of ``rope_append``: bit-identical to the torch composition it replaces, on poisoned
caches and query buffers (entries it must not write keep their poison), strided q|k|v rows, every
head layout and the three dtypes."""

from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

from flashrt_kernels.attention import reference
from flashrt_kernels.attention.rope_append import rope_append
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
