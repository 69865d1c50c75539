"""Compile the GPU code of real launches without a GPU (Hopper target).

``install()`` swaps Triton's active driver for a stand-in that names an sm_90 target and makes
every ``kernel[grid](...)`` compile only (``warmup``), with the launch's own specialization (the
divisibility attributes of its pointers and strides, which a hand-written ``triton.compile``
signature lacks), and lets the ops take their Triton backend on CPU tensors. Outputs are then left
unwritten: this is for compile checks (frontend errors of the GPU path, which the interpreter never
compiles) and for reading registers, not for results. Call it in a process of its own, before
anything imports a kernel module, and without ``TRITON_INTERPRET``.
"""

from __future__ import annotations

COMPILED: list[tuple[str, object]] = []


class _CompileOnlyDriver:
    """Enough of Triton's active driver for the JIT to compile for sm_90 without a device."""

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", 90, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0


def install() -> None:
    """Compile-only launches from here on, for this process (see the module's note)."""
    import os

    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError(
            "compile_only.install: unset TRITON_INTERPRET (the interpreter compiles nothing)"
        )
    from triton.runtime import driver, jit

    from flashrt_kernels import backends

    run = jit.JITFunction.run

    def compile_only(self, *args, grid, warmup, **kwargs):
        kernel = run(self, *args, grid=grid, warmup=True, **kwargs)
        COMPILED.append((self.fn.__name__, kernel))
        return kernel

    jit.JITFunction.run = compile_only
    driver.set_active(_CompileOnlyDriver())
    backends.backend_runs_on = lambda backend, device: backend in ("triton", "reference")


def compile_properties(examples: int = 2) -> list[tuple[str, str]]:
    """Runs the first ``examples`` small examples of every registered property with launches
    compiled only (after ``install``): returns ``(property, error)`` for each example whose
    kernels did not compile. The checks' own verdicts are ignored (outputs are never written)."""
    from triton.compiler.errors import CompilationError

    from flashrt_kernels.registry import properties

    failures = []
    for name, prop in sorted(properties().items()):
        for case in prop.examples("small")[:examples]:
            try:
                prop.check(case)
            except CompilationError as err:
                cause = err
                while (cause.__cause__ or cause.__context__) is not None:
                    cause = cause.__cause__ or cause.__context__
                failures.append((name, f"{type(cause).__name__}: {cause}"))
            except Exception:  # noqa: BLE001,S110 - unwritten outputs fail the checks
                pass
    return failures
