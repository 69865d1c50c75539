import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from flashrt_dsv4_indexer import key_cache as kc
from flashrt_kernels.testing.strategies import seeds, value_kinds
from flashrt_kernels.testing.values import make_values

KINDS = ("normal", "ties", "zeros", "relu_plateau", "outlier", "tiny", "uniform")


def _nearest_e2m1(mag: torch.Tensor) -> torch.Tensor:
    """Brute force: the grid code nearest to each magnitude, ties to the even code."""
    grid = torch.tensor(kc.E2M1_GRID, dtype=torch.float64)
    dist = (mag.double()[..., None] - grid).abs()
    best = dist.min(-1, keepdim=True).values
    cand = (dist == best) & (torch.arange(8) % 2 == 0) | (dist == best) & (
        (dist == best).sum(-1, keepdim=True) == 1
    )
    return cand.int().argmax(-1)


@given(rows=st.integers(1, 9), groups=st.integers(1, 4), kind=value_kinds(*KINDS), seed=seeds())
@example(rows=1, groups=1, kind="zeros", seed=0)
@example(rows=3, groups=4, kind="ties", seed=1)
def test_mxfp4_codes_are_the_nearest_grid_points(rows, groups, kind, seed):
    x = make_values(kind, (rows, 32 * groups), torch.float32, seed, scale=3.0)
    packed, scales = kc.quantize_mxfp4_rows(x)
    assert packed.shape == (rows, 16 * groups) and scales.shape == (rows, groups)
    deq = kc.dequantize_mxfp4(packed, scales)
    g = x.double().reshape(rows, groups, 32)
    amax = g.abs().amax(-1)
    exp = scales.double() - 127
    nz = amax > 0
    # the scale puts each group's largest magnitude in e2m1's top binade [4, 8), unless the
    # exponent is clamped at -100 (tiny groups saturate towards zero, never overflow)
    ratio = amax[nz] / torch.exp2(exp[nz])
    assert (((ratio >= 4) & (ratio < 8)) | (exp[nz] == -100)).all()
    scaled = (g / torch.exp2(exp)[..., None]).abs()
    want = kc.dequantize_mxfp4(packed, scales).reshape(rows, groups, 32).abs()
    grid = torch.tensor(kc.E2M1_GRID, dtype=torch.float64)
    near = grid[_nearest_e2m1(scaled.clamp(max=6))] * torch.exp2(exp)[..., None]
    assert torch.equal(want, near)
    assert torch.equal(torch.sign(deq) * (deq != 0), torch.sign(x.double()) * (deq != 0))
    # no negative zero codes
    lo, hi = packed & 15, packed >> 4
    assert not ((lo == 8) | (hi == 8)).any()


@given(rows=st.integers(1, 9), d=st.sampled_from([32, 64, 128]), kind=value_kinds(*KINDS),
       seed=seeds())  # fmt: skip
@example(rows=2, d=32, kind="zeros", seed=0)
def test_fp8_codes_match_torch_rounding(rows, d, kind, seed):
    x = make_values(kind, (rows, d), torch.float32, seed, scale=5.0)
    codes, scale = kc.quantize_fp8_rows(x)
    amax = x.abs().amax(-1)
    assert torch.equal(scale, torch.where(amax > 0, amax / 448, torch.ones_like(amax)))
    want = (x / scale[:, None]).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    assert torch.equal(codes, want)
    deq = kc.dequantize_fp8(codes, scale)
    err = (deq - x.double()).abs()
    bound = 2.0**-4 * x.double().abs() + 2.0**-10 * scale.double()[:, None]
    assert (err <= bound).all()


def test_hadamard_is_orthonormal_and_preserves_dots():
    x, y = torch.randn(5, 128, dtype=torch.float64), torch.randn(7, 128, dtype=torch.float64)
    rx, ry = kc.hadamard_rotate(x), kc.hadamard_rotate(y)
    torch.testing.assert_close(rx @ ry.T, x @ y.T, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(kc.hadamard_rotate(rx), x, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("fmt", ["fp8", "fp4"])
@pytest.mark.parametrize("block", [32, 64, 128])
def test_paged_write_lands_where_the_block_table_says(fmt, block):
    g = torch.Generator().manual_seed(block)
    cache = kc.PagedKeyCache(12, block, 64, fmt)
    bt = torch.randperm(12, generator=g)[:6].reshape(2, 3).int()
    n = [2 * block + 5, block - 1]
    keys = [torch.randn(m, 64, generator=g) for m in n]
    for r, k in enumerate(keys):  # appended in two chunks, like prefill then decode
        half = k.shape[0] // 2
        cache.write(bt, torch.full((half,), r), torch.arange(half), k[:half])
        rest = k.shape[0] - half
        cache.write(bt, torch.full((rest,), r), torch.arange(half, k.shape[0]), k[half:])
    for r, k in enumerate(keys):
        codes, scales = cache.quantize(k)
        want = (
            kc.dequantize_fp8(codes, scales) if fmt == "fp8" else kc.dequantize_mxfp4(codes, scales)
        )
        assert torch.equal(cache.dequantize_row(bt[r], k.shape[0]), want)


def test_cache_rejects_bad_configs():
    with pytest.raises(ValueError, match="block_size"):
        kc.PagedKeyCache(4, 48, 64)
    with pytest.raises(ValueError, match="key_format"):
        kc.PagedKeyCache(4, 64, 64, "int4")
    with pytest.raises(ValueError, match="multiple of 32"):
        kc.quantize_mxfp4_rows(torch.randn(2, 48))
