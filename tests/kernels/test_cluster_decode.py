"""The narrow rows' cluster kernel (``attention/cluster_decode``): its split rule on the CPU, its
source compiled for sm_90 without a GPU, and on the GPU against the reference and the Triton
narrow tiles at decode shapes (long rows, every mask mode, rows beside wide ones). The hypothesis
properties of ``gqa_attention`` (test_attention.py) run it too wherever it runs."""

import pytest
import torch

from flashrt_kernels.attention import cluster_decode, reference
from flashrt_kernels.attention.decode import ATOL_V, RTOL
from flashrt_kernels.attention.properties import random_tree_mask
from flashrt_kernels.testing import assert_exact, assert_faithful


@pytest.mark.parametrize("extent", [1, 63, 64, 127, 128, 129, 1000, 1024, 1025, 2048, 8191,
                                    32768, 100_001])  # fmt: skip
def test_split_covers_the_row_once_in_at_most_a_cluster(extent):
    blocks, chunk = cluster_decode.split_of(extent)
    assert 1 <= blocks <= cluster_decode.CLUSTER
    assert (blocks - 1) * chunk < extent <= blocks * chunk
    # every block the rule asks for gets keys: long rows use the whole cluster
    assert blocks == min(cluster_decode.CLUSTER, -(-extent // cluster_decode.MIN_SPLIT))


def test_cluster_decode_compiles_for_sm90_without_a_gpu():
    from flashrt_kernels import cuda_nvrtc

    if not cuda_nvrtc.available():
        pytest.skip("no cuda.bindings / NVRTC here")
    names = [cluster_decode.kernel_name(torch.bfloat16, 128, 1),
             cluster_decode.kernel_name(torch.float16, 80, 2)]  # fmt: skip
    cubin, lowered = cuda_nvrtc.compile_cubin(cluster_decode.source(), names, "sm_90",
                                              cluster_decode.OPTIONS)  # fmt: skip
    assert cubin[:4] == b"\x7fELF"
    assert all(v.encode() in cubin for v in lowered.values())


def test_cluster_decode_is_not_taken_off_the_gpu():
    q = torch.zeros(1, 1, 8, 128, dtype=torch.bfloat16)
    k = torch.zeros(1, 16, 1, 128, dtype=torch.bfloat16)
    assert not cluster_decode.supports(q, k, k, q)


def _case(bsz, q_max, hq, hkv, d, dtype, cache_lens, q_lens, cap, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(bsz, q_max, hq, d, dtype=dtype, device="cuda", generator=g)
    k = torch.randn(bsz, cap, hkv, d, dtype=dtype, device="cuda", generator=g)
    v = torch.randn(bsz, cap, hkv, d, dtype=dtype, device="cuda", generator=g)
    cl = torch.tensor(cache_lens, dtype=torch.int32, device="cuda")
    ql = torch.tensor(q_lens, dtype=torch.int32, device="cuda")
    for b in range(bsz):  # stale slots past the live extent are NaN: never read
        k[b, cache_lens[b] + q_lens[b] :] = float("nan")
        v[b, cache_lens[b] + q_lens[b] :] = float("nan")
    return q, k, v, cl, ql


def _run(q, k, v, cl, ql, mask, mode, cluster: bool):
    from flashrt_kernels.attention.gqa_kernels import launch_gqa_tiles
    from flashrt_kernels.attention.splits import workspace_numel

    bsz, q_max, hq, d = q.shape
    out = torch.full_like(q, float("nan"))
    ws = torch.empty(workspace_numel(bsz, q_max, hq, k.shape[2], d, k.shape[1]), device="cuda")
    launch_gqa_tiles(q, k, v, out, cl, ql, q_starts=None, cache_rows=None, mask=mask,
                     mask_mode=mode, q_max=q_max, split=True, workspace=ws, scale=d**-0.5,
                     config={"CLUSTER_NARROW": cluster})  # fmt: skip
    return out


def _check(out, q, k, v, cl, ql, tree_mask):
    ref = reference.gqa_attention(q, k, v, cl, ql, tree_mask=tree_mask, scale=q.shape[-1] ** -0.5)
    vmax = float(v.float().nan_to_num(0.0).abs().max())
    assert not out.isnan().any()
    assert_faithful(out, ref, rtol=RTOL[q.dtype], atol=ATOL_V[q.dtype] * vmax)


@pytest.mark.gpu
@pytest.mark.parametrize("hq,hkv,d,dtype", [(16, 2, 128, torch.bfloat16),
                                            (32, 8, 128, torch.float16),
                                            (16, 8, 64, torch.bfloat16),
                                            (4, 4, 80, torch.float16),
                                            (16, 1, 96, torch.bfloat16)])  # fmt: skip
def test_decode_rows_match_the_reference_and_the_tiles(hq, hkv, d, dtype):
    """q = 1 rows of 1 .. 33k keys (split boundaries, an empty row) through the cluster kernel
    (a single launch: nothing else writes the output) and through the Triton narrow tiles: both
    within the bound of the reference."""
    lens = [0, 63, 127, 1023, 1024, 8191, 33000, 5]
    ql = [1, 1, 1, 1, 1, 1, 1, 0]
    q, k, v, cl, qlt = _case(len(lens), 1, hq, hkv, d, dtype, lens, ql, 33001, seed=hq + d)
    assert cluster_decode.supports(q, k, v, q)
    for cluster in (True, False):
        out = _run(q, k, v, cl, qlt, None, 0, cluster)
        _check(out, q, k, v, cl, qlt, None)
        assert torch.equal(out[-1], torch.zeros_like(out[-1]))


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["causal", "tree", "tree_bits"])
def test_small_trees_beside_wide_rows(mode):
    """Narrow rows of 2..4 nodes (G = 8: 16..32 tile rows), single-query and empty rows beside
    wide rows of 24 nodes in one call: the cluster kernel takes the narrow rows (and their dead
    slots), the wide tiles and the combine the others; every row within the bound, and each
    narrow row bit-identical alone and in the batch."""
    q_lens = [4, 24, 1, 0, 3, 24, 2]
    lens = [3000, 2048, 9000, 10, 0, 17, 129]
    q_max, hq, hkv, d = 24, 16, 2, 128
    q, k, v, cl, ql = _case(len(lens), q_max, hq, hkv, d, torch.bfloat16, lens, q_lens, 9100, 7)
    bool_mask = torch.stack([random_tree_mask(q_max, 8, s) for s in range(len(lens))]).cuda()
    if mode == "causal":
        mask, m, tree = None, 0, None
    elif mode == "tree":
        mask, m, tree = bool_mask.view(torch.uint8), 1, bool_mask
    else:
        mask, m, tree = reference.pack_tree_mask(bool_mask), 2, bool_mask
    out = _run(q, k, v, cl, ql, mask, m, True)
    _check(out, q, k, v, cl, ql, tree)
    for b in (0, 2, 4, 6):  # narrow rows alone, at their own q_max
        n = q_lens[b]
        sel = slice(b, b + 1)
        sub_mask = None if mask is None else (mask[sel, :n, :n].contiguous() if m == 1 else
                                              mask[sel, :n].contiguous())  # fmt: skip
        alone = _run(q[sel, :n].contiguous(), k[sel], v[sel], cl[sel], ql[sel], sub_mask, m, True)
        assert_exact(alone[0], out[b, :n])
