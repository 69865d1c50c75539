"""CUDA C++ kernels without CuPy: NVRTC compiles a source for the device's architecture, the driver
API loads it into the device's primary context (torch's) and launches it, all through
``cuda.bindings`` (which torch's CUDA 13 wheels install, with the NVRTC library).

``available()`` says whether this process can do so; ``compile_cubin`` needs no GPU (tests use
it); ``cached_cubin`` keeps its results on disk (like Triton's and CuPy's caches), so only a
machine's first process pays the compile; ``Module`` hands out ``CUfunction`` handles by the name
expressions given to the compiler; ``launch`` is one ``cuLaunchKernelEx``, optionally a
programmatic dependent launch (sm_90+).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import tempfile
from pathlib import Path

import numpy as np

_CTYPES = {np.uint64: ctypes.c_void_p, np.int32: ctypes.c_int, np.int64: ctypes.c_longlong}


@functools.cache
def available() -> bool:
    """Whether cuda.bindings' driver and NVRTC modules import and the NVRTC library loads."""
    try:
        from cuda.bindings import driver, nvrtc

        del driver  # imported only to know it is there

        return nvrtc.nvrtcVersion()[0] == nvrtc.nvrtcResult.NVRTC_SUCCESS
    except Exception:  # not installed, or no NVRTC library on this machine
        return False


def _check(result, what: str):
    """The values of a cuda.bindings call (a tuple led by its status), or a RuntimeError."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise RuntimeError(f"{what} failed: {err!r}")
    return values[0] if len(values) == 1 else values


def compile_cubin(source: str, names: list[str], arch: str,
                  options: tuple[str, ...] = ()) -> tuple[bytes, dict[str, str]]:  # fmt: skip
    """Compile ``source`` for ``arch`` (e.g. ``"sm_90"``): the cubin, and each name expression's
    lowered (mangled) name. A compile error raises with NVRTC's log."""
    from cuda.bindings import nvrtc

    prog = _check(nvrtc.nvrtcCreateProgram(source.encode(), b"source.cu", 0, [], []),
                  "nvrtcCreateProgram")  # fmt: skip
    try:
        for name in names:
            _check(nvrtc.nvrtcAddNameExpression(prog, name.encode()), "nvrtcAddNameExpression")
        opts = [o.encode() for o in options] + [f"--gpu-architecture={arch}".encode()]
        err = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)[0]
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            size = _check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
            log = b" " * size
            nvrtc.nvrtcGetProgramLog(prog, log)
            raise RuntimeError(
                f"NVRTC could not compile for {arch}:\n{log.decode(errors='replace')}"
            )
        size = _check(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
        cubin = b" " * size
        _check(nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
        lowered = {
            name: _check(nvrtc.nvrtcGetLoweredName(prog, name.encode()), "nvrtcGetLoweredName")
            for name in names
        }
        return cubin, {k: v.decode() if isinstance(v, bytes) else v for k, v in lowered.items()}
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def cache_dir() -> Path:
    """Where compiled cubins are kept: ``$XDG_CACHE_HOME/flashrt`` (default ``~/.cache/flashrt``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "flashrt"


def cached_cubin(source: str, names: list[str], arch: str, options: tuple[str, ...] = (),
                 directory: Path | None = None) -> tuple[bytes, dict[str, str]]:  # fmt: skip
    """``compile_cubin``'s result, from the cache when this source, names, architecture, options
    and NVRTC version were compiled before (a cubin and a JSON file of lowered names, written
    atomically); an unwritable cache only costs the compile."""
    from cuda.bindings import nvrtc

    version = _check(nvrtc.nvrtcVersion(), "nvrtcVersion")
    key = hashlib.sha256(json.dumps([source, names, arch, list(options), list(version)])
                         .encode()).hexdigest()[:32]  # fmt: skip
    directory = directory or cache_dir()
    cubin_path, names_path = directory / f"{key}.cubin", directory / f"{key}.json"
    try:
        lowered = json.loads(names_path.read_text())
        cubin = cubin_path.read_bytes()
        if sorted(lowered) == sorted(names) and cubin[:4] == b"\x7fELF":
            return cubin, lowered
    except (OSError, ValueError):
        pass
    cubin, lowered = compile_cubin(source, names, arch, options)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for path, data in ((cubin_path, cubin), (names_path, json.dumps(lowered).encode())):
            fd, tmp = tempfile.mkstemp(dir=directory)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
    except OSError:
        pass
    return cubin, lowered


class Module:
    """A cubin loaded into CUDA device ``device_index``'s primary context."""

    def __init__(self, cubin: bytes, lowered: dict[str, str], device_index: int):
        import torch
        from cuda.bindings import driver

        self._lowered = lowered
        torch.cuda.init()  # torch's kernels run in each device's primary context: load there
        dev = _check(driver.cuDeviceGet(device_index), "cuDeviceGet")
        ctx = _check(driver.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
        _check(driver.cuCtxPushCurrent(ctx), "cuCtxPushCurrent")
        try:
            self._module = _check(driver.cuModuleLoadData(cubin), "cuModuleLoadData")
        finally:
            _check(driver.cuCtxPopCurrent(), "cuCtxPopCurrent")
        self._functions: dict[str, object] = {}

    def function(self, name: str):
        """The ``CUfunction`` of a name expression given to ``compile_cubin``."""
        from cuda.bindings import driver

        if name not in self._functions:
            self._functions[name] = _check(
                driver.cuModuleGetFunction(self._module, self._lowered[name].encode()),
                f"cuModuleGetFunction({name})",
            )
        return self._functions[name]

    def set_max_dynamic_smem(self, name: str, nbytes: int) -> None:
        from cuda.bindings import driver

        attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        _check(driver.cuFuncSetAttribute(self.function(name), attr, nbytes), "cuFuncSetAttribute")


@functools.lru_cache(maxsize=256)
def _config(grid: tuple, block: tuple, shared_mem: int, stream_handle: int, pdl: bool):
    """A launch configuration, built once per shape and stream (a call's host time counts when
    the launches are not captured in a graph)."""
    from cuda.bindings import driver as drv

    cfg = drv.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = tuple(grid) + (1,) * (3 - len(grid))
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = tuple(block) + (1,) * (3 - len(block))
    cfg.sharedMemBytes = shared_mem
    cfg.hStream = drv.CUstream(stream_handle)
    if pdl:
        attr = drv.CUlaunchAttribute()
        attr.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        cfg.attrs = [attr]
        cfg.numAttrs = 1
    else:
        cfg.numAttrs = 0
    return cfg


@functools.lru_cache(maxsize=256)
def _arg_types(types: tuple) -> tuple:
    return tuple(_CTYPES[t] for t in types)


def launch(function, grid, block, args, shared_mem: int, stream_handle: int, pdl: bool) -> int:
    """One ``cuLaunchKernelEx`` of ``function`` (a ``CUfunction`` or its address) on the stream
    with handle ``stream_handle``; ``args`` are numpy scalars (np.uint64 for pointers, np.int32,
    np.int64). ``pdl``: programmatic stream serialization. Returns the driver's status (0: ok)."""
    from cuda.bindings import driver as drv

    cfg = _config(tuple(grid), tuple(block), shared_mem, stream_handle, pdl)
    fn = function if isinstance(function, drv.CUfunction) else drv.CUfunction(int(function))
    params = (tuple(int(a) for a in args), _arg_types(tuple(type(a) for a in args)))
    res = drv.cuLaunchKernelEx(cfg, fn, params, 0)
    return int(res[0] if isinstance(res, tuple) else res)
