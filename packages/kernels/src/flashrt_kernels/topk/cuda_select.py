"""Host side of the CUDA select (``select_block.cu`` + ``select.cu``, backend ``"cuda"``).

The source is compiled by NVRTC: CuPy's where CuPy is installed (``compiler() == "cupy"``), else
through ``cuda.bindings`` (``flashrt_kernels.cuda_nvrtc``: NVRTC and the driver API, which torch's
CUDA 13 wheels install), so the backend needs no CuPy.

One call is, by the rows' length ``N``:
- ``N <= SHORT_MAX``: the finishing kernel alone (one block per row, the row in shared memory);
- longer rows at small batch, of a hint-free call or of a hinted one from
  ``HINTED_CLUSTER_MIN_ROWS`` rows (``_use_clusters``: the clusters' blocks hold the row and
  take at most half the SMs; they take no hint): ``cluster_kernel`` alone (a thread-block cluster of
  ``C`` blocks per row, each with a part of the row in shared memory, the digit passes'
  histograms summed over the cluster through distributed shared memory);
- other long rows: ``S`` blocks per row for each pass over the row --
  ``bound_kernel`` (hint-free only: a lower bound on the K-th key from group maxima),
  ``count_kernel`` (eight thresholds from the bound, or from the hint, counted exactly; the keys
  >= the first compacted), the steps (digit passes or a compaction, only for rows the counting
  pass did not settle: by helper blocks of the finishing launch where ``step_helpers`` allows,
  else by three ``step_kernel`` launches) -- and the finishing kernel (one block per row).

Every launch has a fixed grid and no host sync, so a call is CUDA-graph safe once its workspace
exists (per device, B, S, chunk: the control words, histograms and counts are left zeroed for
the next call by the launches themselves). Calls sharing a workspace must be ordered on one
stream.

Launches go through ``cuLaunchKernelEx`` with programmatic stream serialization (programmatic
dependent launch, sm_90+) where ``cuda.bindings`` is importable, so that each pass's launch
overlaps the one before (every kernel waits for its predecessor's completion before it touches
global memory: the result is the same); else, or with ``pdl=False``, without the attribute
(through CuPy where CuPy compiled the source).
"""

from __future__ import annotations

import contextlib
import functools
import math
import warnings
from importlib import resources
from typing import NamedTuple

import numpy as np
import torch

from flashrt_kernels import cuda_nvrtc
from flashrt_kernels.backends import cuda_compiler, sm_count
from flashrt_kernels.topk import state as st

SHORT_MAX = 32768  # rows up to this many elements are searched in one block's shared memory
CAP = 16384  # candidates the finishing block ranks in shared memory
TILE = 512 * 8  # elements a pass block covers per iteration (chunks are multiples of it)
BLOCKS_PER_SM = 4  # pass blocks per SM the split aims at (4 x 512 threads fill an SM)
HIST_BINS = 4096
BOUND_SLOTS = 2 * 8192  # select.cu's BOUND_SLOTS: group maxima of the hint-free bound per row
CTRL_WORDS = 32
STEPS = 3  # step launches after the counting pass (digit passes 0..2 end in a known K-th key)
MIN_HELPERS = 8  # fewest step helpers per row of the finishing launch (``step_helpers``)
FINISH_THREADS = 1024
CLUSTERS = (8, 4, 2)  # blocks per row of the cluster path, largest first (8: the portable limit)
CLUSTER_CHUNK_MAX = 32768  # elements one block of a cluster holds in shared memory
CLUSTER_ALIGN = 1024  # a cluster block's part starts on a multiple of this (16-byte copies)
# a hinted call takes the clusters (ignoring its hint) from this many rows, where the hint-free
# call would: at B = 8 the clusters beat the hinted multi-launch path (H200, docs/kernels/topk.md)
HINTED_CLUSTER_MIN_ROWS = 8


AUX_WORDS = 8192 + 8192 // 4 + 64 + HIST_BINS + 256  # select_block.cu's AUX_WORDS: a narrowed
# bucket, its owners, the warp counts, a short row's pass 1 / 2 histograms
SCRATCH_WORDS = 96  # select_block.cu's SCRATCH_WORDS


def _keys_words(short_max: int, multi: bool) -> int:
    """Shared words for the keys of a short row or the candidates' keys and indices (a multiple
    of 4, so that the buffer after them starts on 16 bytes)."""
    return -(-max(short_max, 2 * CAP if multi else 0) // 4) * 4


def _finish_smem(short_max: int, multi: bool) -> int:
    """Bytes of shared memory the finishing block needs: the histogram, scratch, the keys, and
    the buffer for a narrowed bucket with its owners and the per-warp counts."""
    return 4 * (HIST_BINS + SCRATCH_WORDS + _keys_words(short_max, multi) + AUX_WORDS)


MAX_SMEM = _finish_smem(SHORT_MAX, True)  # the finishing block's largest need


def _cluster_smem(chunk: int) -> int:
    """Bytes of shared memory a cluster block needs: three histograms, scratch, the candidate
    regions (keys and indices, 128 slots a warp) and its part of the row."""
    return 4 * (2 * HIST_BINS + 256 + SCRATCH_WORDS + 2 * (FINISH_THREADS // 32) * 128 + chunk)


CLUSTER_SMEM = _cluster_smem(CLUSTER_CHUNK_MAX)
KERNELS = ("bound_kernel", "count_kernel", "step_kernel", "finish_kernel")
_DT = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
_WORKSPACES: dict[tuple, dict[str, torch.Tensor]] = {}


SOURCES = ("select_block.cu", "select.cu")  # keys and the block-wide search; passes and kernels


def source() -> str:
    """The CUDA source of the backend: ``SOURCES`` joined in order."""
    pkg = resources.files("flashrt_kernels.topk")
    return "\n".join(pkg.joinpath(name).read_text() for name in SOURCES)


NAMES = [f"{f}<{d}>" for f in KERNELS for d in (0, 1, 2)] + [  # every kernel, every score dtype
    f"cluster_kernel<{d}, {c}>" for d in (0, 1, 2) for c in CLUSTERS
]


def compiler() -> str:
    """``"cupy"`` where CuPy is installed (its NVRTC, its launches without PDL), else
    ``"nvrtc"`` (``cuda_nvrtc``: cuda.bindings' NVRTC and driver API): ``backends.cuda_compiler``."""
    return cuda_compiler() or "nvrtc"


@functools.cache
def _module():
    """The source as a CuPy module (compiled on first use, loaded per device by CuPy)."""
    import cupy

    return cupy.RawModule(code=source(), options=("-std=c++17",), name_expressions=NAMES)


@functools.cache
def _nvrtc_module(device_index: int) -> cuda_nvrtc.Module:
    """The source compiled for device ``device_index``'s architecture and loaded there, the
    finishing kernels opted in to ``MAX_SMEM`` of shared memory."""
    major, minor = torch.cuda.get_device_capability(device_index)
    cubin, lowered = cuda_nvrtc.cached_cubin(source(), NAMES, f"sm_{major}{minor}",
                                             ("-std=c++17",))  # fmt: skip
    mod = cuda_nvrtc.Module(cubin, lowered, device_index)
    for dt in (0, 1, 2):
        mod.set_max_dynamic_smem(f"finish_kernel<{dt}>", MAX_SMEM)
        for c in CLUSTERS:
            mod.set_max_dynamic_smem(f"cluster_kernel<{dt}, {c}>", CLUSTER_SMEM)
    return mod


class _Kernel(NamedTuple):
    function: object  # a CUfunction (nvrtc) or its address (CuPy)
    cupy: object | None  # CuPy's callable kernel (launches without PDL), or None


@functools.cache
def _kernel(name: str, targs: str, how: str, device_index: int) -> _Kernel:
    """Kernel ``name<targs>`` (``targs``: its template arguments, e.g. ``"0"`` or ``"0, 8"``)."""
    if how == "nvrtc":
        return _Kernel(_nvrtc_module(device_index).function(f"{name}<{targs}>"), None)
    import cupy

    kern = _module().get_function(f"{name}<{targs}>")
    fn = kern.function if hasattr(type(kern), "function") else kern.kernel
    smem = {"finish_kernel": MAX_SMEM, "cluster_kernel": CLUSTER_SMEM}.get(name)
    if smem:  # opt in to the largest shared-memory size a call asks for
        drv = cupy.cuda.driver
        drv.funcSetAttribute(fn.ptr, drv.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem)
    return _Kernel(fn.ptr, kern)


def _launch_context(how: str, index: int, handle: int):
    """Device ``index`` current (its primary context, torch's), and for CuPy's launches the
    torch stream as CuPy's current stream."""
    if how == "nvrtc":
        return torch.cuda.device(index)
    import cupy

    stack = contextlib.ExitStack()
    stack.enter_context(cupy.cuda.Device(index))
    stack.enter_context(_stream(index, handle))
    return stack


@functools.cache
def _stream(device_index: int, handle: int):
    import warnings

    import cupy

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return cupy.cuda.ExternalStream(handle, device_index)


def plan(b: int, n: int, device: torch.device, split: int | None = None) -> tuple[int, int, int]:
    """(S, chunk, short_max): blocks per row of the multi-block path, elements per block, and
    the longest row the finishing block searches alone in shared memory. S = 0: every row fits
    (one launch). An explicit ``split`` sends every row through the multi-block path."""
    if split is None and n <= SHORT_MAX:
        return 0, 0, n
    short_max = SHORT_MAX if split is None else 0
    if split is None:
        split = math.ceil(BLOCKS_PER_SM * sm_count(device.index or 0) / max(b, 1))
    split = max(1, min(split, math.ceil(max(n, 1) / TILE), 1024))
    chunk = math.ceil(math.ceil(max(n, 1) / split) / TILE) * TILE
    return math.ceil(max(n, 1) / chunk), chunk, short_max


def cluster_plan(b: int, n: int, device: torch.device) -> tuple[int, int] | None:
    """(C, chunk): blocks per row of the cluster path and elements per block, or None where it
    does not apply: the largest C of ``CLUSTERS`` whose ``b x C`` blocks (one an SM: each holds
    its part of the row in shared memory) fit one wave, with the row's parts at most
    ``CLUSTER_CHUNK_MAX`` long."""
    sms = sm_count(device.index or 0)
    for c in CLUSTERS:
        if b * c <= sms:
            chunk = math.ceil(math.ceil(max(n, 1) / c) / CLUSTER_ALIGN) * CLUSTER_ALIGN
            return (c, chunk) if chunk <= CLUSTER_CHUNK_MAX else None
    return None


def step_helpers(b: int, s: int, device: torch.device) -> int:
    """Blocks per row that run the steps inside the finishing launch (after the finishing block
    of each row), or 0 for the ``STEPS`` separate step launches. Every block of the finishing
    launch needs more than half an SM's shared memory, so a launch of at most one block an SM has
    them all resident at once, which lets the finishing block wait for its helpers and the helpers
    for each other between digit passes (no launch between the steps: settled rows then cost no
    step launch at all). Helpers: as many as the SMs allow (at most the row's S chunks), where that
    is at least ``MIN_HELPERS``; fewer would read a row in the passes slower than the launches.
    (Where fewer SMs are usable than the device has -- MPS with a thread limit, green contexts --
    the launch could wait forever: ``launch(..., helpers=False)`` there; docs/kernels/topk.md.)"""
    h = min(sm_count(device.index or 0) // max(b, 1) - 1, s)
    return h if s and h >= MIN_HELPERS else 0


def _use_clusters(b: int, n: int, device, split, clusters: bool | None, hinted: bool):
    """The cluster plan of this call, or None. ``clusters`` True takes the cluster path wherever
    ``cluster_plan`` allows, False never; None chooses it for rows longer than ``SHORT_MAX``
    without an explicit ``split`` whose clusters take at most half the SMs (measured on an H100,
    docs/kernels/topk.md: B <= 8 at 8 blocks a row; 16 rows of 8 blocks were slower than the
    multi-launch path), hint-free calls always and hinted ones from ``HINTED_CLUSTER_MIN_ROWS``
    rows (the hinted multi-launch path is faster at B = 1, the clusters at B = 8)."""
    if clusters is not None:
        return cluster_plan(b, n, device) if clusters else None
    if split is not None or n <= SHORT_MAX or (hinted and b < HINTED_CLUSTER_MIN_ROWS):
        return None
    c = cluster_plan(b, n, device)
    return c if c is not None and b * c[0] <= sm_count(device.index or 0) // 2 else None


def _workspace(device, b: int, s: int, chunk: int) -> dict[str, torch.Tensor]:
    key = (str(device), b, s, chunk)
    ws = _WORKSPACES.get(key)
    if ws is None:
        i32 = {"dtype": torch.int32, "device": device}
        segcap = max(1, min(chunk, CAP))
        ws = {
            "ctrl": torch.zeros((b, CTRL_WORDS), **i32),
            "hist": torch.zeros((b, HIST_BINS), **i32),
            "gmax": torch.zeros((b, BOUND_SLOTS), **i32),
            "tc": torch.zeros((b, 8), **i32),
            "seg": torch.zeros((b * max(s, 1) * segcap * 2,), **i32),
            "segcnt": torch.zeros((b * max(s, 1),), **i32),
        }
        _WORKSPACES[key] = ws
    return ws


@functools.cache
def _driver():
    """``cuda.bindings.driver``, or None where it is not installed."""
    try:
        from cuda.bindings import driver
    except ImportError:
        return None
    return driver


_PDL_BROKEN: list[str] = []  # the driver's answer when a PDL launch was refused (then no PDL)


def pdl_available() -> bool:
    """Whether launches use programmatic dependent launch (``cuda.bindings`` importable and no
    launch refused so far in this process)."""
    return _driver() is not None and not _PDL_BROKEN


def _launch_pdl(kern: _Kernel, grid, block, args, shared_mem, stream_handle) -> bool:
    """One launch through cuLaunchKernelEx with programmatic stream serialization; False (and no
    launch) when the driver refuses it."""
    try:
        err = cuda_nvrtc.launch(kern.function, grid, block, args, shared_mem, stream_handle,
                                pdl=True)  # fmt: skip
    except Exception as exc:  # an API mismatch of this cuda.bindings: nothing was launched
        err = repr(exc)
    if err != 0:
        _PDL_BROKEN.append(str(err))
        warnings.warn(f"topk cuda: PDL launch refused ({err}); launching without PDL",
                      RuntimeWarning, stacklevel=3)  # fmt: skip
    return err == 0


def _ptr(t: torch.Tensor | None) -> np.uint64:
    return np.uint64(0 if t is None else t.data_ptr())


def launch(scores, k, lengths, out_values, out_indices, state, hint, split=None,
           pdl: bool = True, clusters: bool | None = None,
           helpers: bool = True) -> None:  # fmt: skip
    """All launches of one call (inputs validated by ``api``). ``pdl``: programmatic dependent
    launches where available (see the module docstring); False launches without (through CuPy
    where it compiled the source). ``clusters``: see ``_use_clusters`` (the cluster path takes
    no hint: it reads every row once anyway). ``helpers``: the steps inside the finishing launch
    where ``step_helpers`` allows; False always as separate launches."""
    b, n = scores.shape
    dev = scores.device
    dt = _DT[scores.dtype]
    cluster = _use_clusters(b, n, dev, split, clusters, hint is not None)
    i32, i64 = np.int32, np.int64
    sc, stride, ln = _ptr(scores), i64(scores.stride(0)), _ptr(lengths)
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    handle = torch.cuda.current_stream(dev).cuda_stream
    how = compiler()
    use_pdl = pdl and pdl_available()

    def run(name, grid, block, args, shared_mem=0, targs=str(dt)):
        kern = _kernel(name, targs, how, index)
        if use_pdl and _launch_pdl(kern, grid, block, args, shared_mem, handle):
            return
        if kern.cupy is not None:
            kern.cupy(grid, block, args, shared_mem=shared_mem)
            return
        err = cuda_nvrtc.launch(kern.function, grid, block, args, shared_mem, handle, pdl=False)
        if err != 0:
            raise RuntimeError(f"topk cuda: launching {name} failed (CUresult {err})")

    with _launch_context(how, index, handle):
        if cluster is not None:
            c, part = cluster
            run("cluster_kernel", (c, b), (FINISH_THREADS,),
                (sc, stride, ln, i32(n), i32(k), i32(part), _ptr(out_indices), _ptr(out_values),
                 _ptr(state), i32(st.STATE_WORDS)), _cluster_smem(part), f"{dt}, {c}")  # fmt: skip
            return
        s, chunk, short_max = plan(b, n, dev, split)
        ws = _workspace(dev, b, s, chunk)
        segcap = max(1, min(chunk, CAP))
        ctrl, seg, segcnt = _ptr(ws["ctrl"]), _ptr(ws["seg"]), _ptr(ws["segcnt"])
        nh = step_helpers(b, s, dev) if helpers else 0
        if s:
            grid, block = (s, b), (512,)
            if hint is None:
                run("bound_kernel", grid, block,
                    (sc, stride, ln, i32(n), i32(k), i32(chunk), i32(s), i32(short_max), ctrl,
                     _ptr(ws["gmax"])))  # fmt: skip
            run("count_kernel", grid, block,
                (sc, stride, ln, i32(n), i32(k), i32(chunk), i32(s), i32(CAP), i32(segcap),
                 i32(short_max), _ptr(hint), _ptr(state), i32(st.STATE_WORDS), ctrl,
                 _ptr(ws["tc"]), seg, segcnt))  # fmt: skip
            for _ in range(0 if nh else STEPS):
                run("step_kernel", grid, block,
                    (sc, stride, ln, i32(n), i32(k), i32(chunk), i32(s), i32(CAP), i32(segcap),
                     i32(short_max), ctrl, _ptr(ws["hist"]), seg, segcnt))  # fmt: skip
        run("finish_kernel", (1 + nh, b), (FINISH_THREADS,),
            (sc, stride, ln, i32(n), i32(k), i32(max(s, 1)), i32(segcap), i32(short_max),
             i32(1 if s else 0), i32(_keys_words(short_max, bool(s))), ctrl, seg, segcnt,
             _ptr(out_indices), _ptr(out_values), _ptr(state), i32(st.STATE_WORDS), i32(chunk),
             i32(CAP), i32(nh), _ptr(ws["hist"])),
            _finish_smem(short_max, bool(s)))  # fmt: skip
