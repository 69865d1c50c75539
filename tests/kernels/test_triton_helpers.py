"""The shared Triton helpers over the special bit patterns that the hardware and the
interpreter treat differently (the GPU's canonical NaN 0x7FFFFFFF, negative and signalling NaNs,
zeros, ties, the largest finite values, subnormals): ``negate_f32`` flips the sign bit of every
value, zeros and NaNs too; ``cast_rne`` (fp32 -> bf16 / fp16, round to nearest even, NaN stays
NaN) and ``to_f32`` (exact upcast) give torch's conversions. ``pairwise_row_sum`` gives the bits
of a torch pairwise tree whatever layout the compiler gives the tile."""

import pytest
import torch
import triton
import triton.language as tl

from flashrt_kernels.testing import assert_exact, test_device
from flashrt_kernels.triton_helpers import cast_rne, negate_f32, pairwise_row_sum, to_f32

SPECIAL_BITS = [
    0x7FFFFFFF, 0xFFFFFFFF, 0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FBFFFFF,  # NaNs
    0x7F800000, 0xFF800000, 0x00000000, 0x80000000,  # infinities and zeros
    0x7F7FFFFF, 0x7F7F8000, 0x7F7F7FFF, 0xFF7FFFFF,  # largest finite: round up to inf or not
    0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF,  # ties to even, just above / below
    0x00000001, 0x00008000, 0x00018000, 0x007FFFFF, 0x80400000,  # subnormals
]  # fmt: skip


@triton.jit
def _roundtrip_kernel(X, LOW, BACK, NEG, N, BLOCK: tl.constexpr, DTYPE: tl.constexpr):
    i = tl.arange(0, BLOCK)
    x = tl.load(X + i, mask=i < N)
    tl.store(NEG + i, negate_f32(x), mask=i < N)
    low = cast_rne(x, DTYPE)
    tl.store(LOW + i, low, mask=i < N)
    tl.store(BACK + i, to_f32(low), mask=i < N)


def _inputs(device):
    g = torch.Generator().manual_seed(0)
    rand_bits = torch.randint(-(2**31), 2**31, (4096,), generator=g, dtype=torch.int64)
    special = torch.tensor(SPECIAL_BITS, dtype=torch.int64)
    bits = torch.cat([special, rand_bits]).to(torch.int64)
    bits = torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32)
    return bits.view(torch.float32).to(device)


def _check(dtype):
    x = _inputs(test_device())
    low = torch.empty(x.shape, dtype=dtype, device=x.device)
    back, neg = torch.empty_like(x), torch.empty_like(x)
    n = x.numel()
    _roundtrip_kernel[(1,)](x, low, back, neg, n, BLOCK=triton.next_power_of_2(n),
                            DTYPE=tl.bfloat16 if dtype == torch.bfloat16 else tl.float16)  # fmt: skip
    want = x.cpu().to(dtype)
    assert_exact(low.cpu(), want, what=f"cast_rne -> {dtype}")
    assert bool((torch.isnan(low.cpu()) == torch.isnan(x.cpu())).all()), "a NaN changed class"
    assert_exact(back.cpu(), want.float(), what=f"to_f32 <- {dtype}")
    flipped = x.cpu().view(torch.int32) ^ torch.tensor(-(2**31), dtype=torch.int32)
    assert torch.equal(neg.cpu().view(torch.int32), flipped), "negate_f32 must flip the sign bit"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_conversions_match_torch(dtype):
    _check(dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_conversions_match_torch_gpu(dtype):
    _check(dtype)


@triton.jit
def _row_sum_kernel(X, S, Q, n_cols, ROWS: tl.constexpr, BLOCK: tl.constexpr, CODES: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask = cols[None, :] < n_cols
    x = tl.load(X + rows[:, None] * n_cols + cols[None, :], mask=mask, other=0.0)
    tl.store(S + rows, pairwise_row_sum(x * x))
    if CODES:  # an int8 store of the same tile: on a GPU the loads get another vector width
        tl.store(Q + rows[:, None] * n_cols + cols[None, :], x.to(tl.int8), mask=mask)


def _torch_tree(x):
    while x.shape[1] > 1:
        x = x.view(x.shape[0], -1, 2).sum(2)
    return x[:, 0]


def _check_row_sum(rows, cols):
    dev = test_device()
    g = torch.Generator().manual_seed(cols)
    # values over many binades, so that the order of the additions shows in the last bits
    x = torch.randn(rows, cols, generator=g) * torch.exp2(
        torch.randint(-12, 12, (rows, cols), generator=g).float()
    )
    block = triton.next_power_of_2(cols)
    want = _torch_tree(torch.nn.functional.pad(x * x, (0, block - cols)))
    x = x.to(dev)
    for codes in (False, True):
        s = torch.full((rows,), float("nan"), device=dev)
        q = torch.empty(rows, cols, dtype=torch.int8, device=dev)
        _row_sum_kernel[(rows // 2,)](x, s, q, cols, ROWS=2, BLOCK=block, CODES=codes,
                                      num_warps=8, enable_fp_fusion=False)  # fmt: skip
        assert_exact(s.cpu(), want, what=f"pairwise_row_sum (int8 store: {codes})")


@pytest.mark.parametrize("cols", [1, 2, 3, 64, 100])
def test_pairwise_row_sum_is_a_fixed_tree(cols):
    _check_row_sum(4, cols)


@pytest.mark.gpu
@pytest.mark.parametrize("cols", [1, 1152, 2048, 4096, 12288])
def test_pairwise_row_sum_is_a_fixed_tree_gpu(cols):
    _check_row_sum(64, cols)
