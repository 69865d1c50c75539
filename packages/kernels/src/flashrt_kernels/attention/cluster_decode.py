"""Host side of ``cluster_decode.cu``: the narrow rows of ``gqa_attention`` (at most
``NARROW_ROWS`` (query, head) tile rows: decode steps and small trees) as one thread-block
cluster per (row, KV head), in one launch with no workspace.

Where it runs (``supports``: a Hopper-or-newer GPU, ``cuda.bindings`` with NVRTC, bf16 / fp16,
head dims ``HEAD_DIMS``, 16-byte aligned rows), it takes every narrow row of a call, whatever the
batch: the Triton tiles then take only the wide rows, and their combine pass leaves the narrow
rows alone. Which kernel computes a row depends on the device and the call's shapes, never on
the other rows, so the batch-invariance contract holds (the bits differ from the Triton narrow
tiles', which run where this does not).

A row's split (``split_of``): ``C = CLUSTER`` blocks, of which the first ``ceil(L / chunk)`` take
``chunk = ceil(L / min(C, ceil(L / MIN_SPLIT)))`` consecutive live keys each: a function of the
row's live extent ``L`` alone. Partials merge in warp order, then in block order over the
cluster (distributed shared memory).

Launch geometry that does not change the bits: ``M_TILES`` (1 where ``q_max * G <= 16``, else
2) and the pipeline depth ``STAGES``.
"""

from __future__ import annotations

import functools
from importlib import resources

import numpy as np
import torch

from flashrt_kernels import cuda_nvrtc
from flashrt_kernels.backends import device_capability

CLUSTER = 8  # blocks per (row, KV head): the portable cluster size
WARPS = 4  # 16 keys a warp in each pipeline stage
KEYS_PER_WARP = 16
MIN_SPLIT = 128
MAX_ROWS = 32  # tile rows of a narrow row (``splits.NARROW_ROWS``)
HEAD_DIMS = (64, 80, 96, 128)
STAGES = 4
OPTIONS = ("-std=c++17", "--fmad=false")
_DT = {torch.bfloat16: 0, torch.float16: 1}


def source() -> str:
    return resources.files("flashrt_kernels.attention").joinpath("cluster_decode.cu").read_text()


def kernel_name(dtype: torch.dtype, head_dim: int, m_tiles: int, stages: int | None = None,
                cluster: int | None = None, warps: int | None = None) -> str:  # fmt: skip
    stages, cluster, warps = stages or STAGES, cluster or CLUSTER, warps or WARPS
    return (f"cluster_decode_kernel<{_DT[dtype]}, {head_dim}, {m_tiles}, {stages}, {cluster}, "
            f"{warps}>")  # fmt: skip


def smem_bytes(head_dim: int, m_tiles: int, stages: int, warps: int) -> int:
    """Dynamic shared memory of one block (the kernel's layout comment)."""
    ld = head_dim + 8
    bn = KEYS_PER_WARP * warps
    base = max(stages * 2 * bn * ld * 2, warps * 16 * m_tiles * head_dim * 4)
    return base + 16 * m_tiles * ld * 2 + (2 * warps * 32 + 64) * 4 + 8 * stages


def split_of(extent: int, cluster: int | None = None) -> tuple[int, int]:
    """(blocks that take keys, keys per block) of a row of ``extent`` live keys (the kernel's
    rule, mirrored for the tests)."""
    want = min(cluster or CLUSTER, -(-extent // MIN_SPLIT))
    chunk = -(-extent // want)
    return -(-extent // chunk), chunk


@functools.cache
def _runtime_ok(device_index: int) -> bool:
    cap = device_capability(device_index)
    return cap is not None and cap[0] >= 9 and cuda_nvrtc.available()


def supports(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             out: torch.Tensor) -> bool:  # fmt: skip
    """Whether this kernel takes the narrow rows of a call with these tensors: a function of
    the device, dtypes, shapes and strides only."""
    if q.device.type != "cuda" or q.dtype not in _DT or q.shape[-1] not in HEAD_DIMS:
        return False
    if not _runtime_ok(q.device.index if q.device.index is not None else 0):
        return False
    tensors = (q, out, k_cache, v_cache)
    strides = [s for t in tensors for s in t.stride()[:-1]]
    return all(t.stride(-1) == 1 and t.data_ptr() % 16 == 0 for t in tensors) and all(
        s % 8 == 0 for s in strides
    )


@functools.cache
def _function(name: str, smem: int, cluster: int, device_index: int):
    major, minor = torch.cuda.get_device_capability(device_index)
    cubin, lowered = cuda_nvrtc.cached_cubin(source(), [name], f"sm_{major}{minor}", OPTIONS)
    module = cuda_nvrtc.Module(cubin, lowered, device_index)
    module.set_max_dynamic_smem(name, smem)
    if cluster > 8:
        module.allow_non_portable_clusters(name)
    return module, module.function(name)


def _ptr(t: torch.Tensor | None) -> np.uint64:
    return np.uint64(0 if t is None else t.data_ptr())


def launch(q, k_cache, v_cache, out, cache_lens, q_lens, *, cache_rows, mask, mask_mode, scale,
           stages: int | None = None) -> None:  # fmt: skip
    """Every narrow row of a decode / tree-verify call (inputs validated, ``supports`` true):
    its outputs, and the zeros of its dead query slots. ``mask``: None (causal), a uint8 view of
    the bool mask (mode 1) or the int64 bit rows (mode 2)."""
    stages = STAGES if stages is None else stages
    cluster, warps = CLUSTER, WARPS
    bsz, q_max, hq, d = q.shape
    hkv = k_cache.shape[2]
    group = hq // hkv
    m_tiles = 1 if q_max * group <= 16 else 2
    dev = q.device
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    name = kernel_name(q.dtype, d, m_tiles, stages, cluster, warps)
    smem = smem_bytes(d, m_tiles, stages, warps)
    _, fn = _function(name, smem, cluster, index)
    i32, i64 = np.int32, np.int64
    smb = mask.stride(0) if mask is not None else 0
    smi = mask.stride(1) if mask is not None else 0
    args = (
        _ptr(q), _ptr(k_cache), _ptr(v_cache), _ptr(out), _ptr(cache_lens), _ptr(q_lens),
        _ptr(cache_rows), _ptr(mask),
        *(i64(s) for s in q.stride()[:3]), *(i64(s) for s in k_cache.stride()[:3]),
        *(i64(s) for s in v_cache.stride()[:3]), *(i64(s) for s in out.stride()[:3]),
        i64(smb), i64(smi), i32(k_cache.shape[1]), i32(q_max), i32(group), i32(mask_mode),
        np.float32(scale * 1.4426950408889634),
    )  # fmt: skip
    handle = torch.cuda.current_stream(dev).cuda_stream
    with torch.cuda.device(index):
        err = cuda_nvrtc.launch(fn, (cluster, hkv, bsz), (warps * 32,), args, smem, handle,
                                pdl=True)  # fmt: skip
    if err != 0:
        raise RuntimeError(f"gqa_attention: launching {name} failed (CUresult {err})")
