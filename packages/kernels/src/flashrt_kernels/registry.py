"""Registries of kernel properties (run by tests and ``flashrt check``) and benchmarks
(run by ``flashrt bench``).

A family (``norm/``, ``attention/``, ...) registers its properties in ``<family>/properties.py``
and its benchmarks in ``<family>/bench.py``; both are discovered by importing those modules, so a
new family needs no edit here.

A property is a check over a drawn *case* (a dict of shapes, flags, dtypes and a seed: never element
data). It has two scales: ``"small"`` (interpreter-sized, runs on a CPU through the Triton
interpreter and on a GPU) and ``"real"`` (the shapes the models use; GPU only).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

SCALES = ("small", "real")

Case = dict[str, Any]


@dataclass(frozen=True)
class Property:
    op: str
    name: str
    cases: Callable[[str], Any]  # scale -> hypothesis strategy of cases
    check: Callable[[Case], None]
    examples: Callable[[str], list[Case]] = field(default=lambda scale: [])

    @property
    def qualname(self) -> str:
        return f"{self.op}.{self.name}"

    def test(self, scale: str) -> Callable[[], None]:
        """A hypothesis test function for ``scale`` (collectable by pytest, callable directly)."""
        from hypothesis import example, given

        if scale not in SCALES:
            raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")

        def run(case: Case) -> None:
            self.check(case)

        fn = given(case=self.cases(scale))(run)
        for ex in reversed(self.examples(scale)):
            fn = example(case=ex)(fn)
        fn.__name__ = f"test_{self.op}_{self.name}_{scale}"
        fn.__qualname__ = fn.__name__
        return fn


@dataclass(frozen=True)
class Benchmark:
    name: str  # what `flashrt bench NAME` selects, e.g. "rms_norm"
    family: str  # "norm", "attention", ...
    run: Callable[..., list[dict[str, Any]]]  # (quick: bool) -> result rows
    description: str = ""
    # line plots `flashrt bench` draws from the rows: name -> plot.line_plot's x / ys / by and
    # a row filter `where` (column -> value as text)
    plots: dict[str, dict[str, Any]] = field(default_factory=dict)


_PROPERTIES: dict[str, Property] = {}
_BENCHMARKS: dict[str, Benchmark] = {}
_IMPORT_ERRORS: dict[str, str] = {}


def register_property(prop: Property) -> Property:
    if prop.qualname in _PROPERTIES:
        raise ValueError(f"property {prop.qualname} is registered twice")
    _PROPERTIES[prop.qualname] = prop
    return prop


def register_benchmark(name: str, family: str, description: str = "",
                       plots: dict[str, dict[str, Any]] | None = None):  # fmt: skip
    def deco(fn):
        if name in _BENCHMARKS:
            raise ValueError(f"benchmark {name} is registered twice")
        _BENCHMARKS[name] = Benchmark(name, family, fn, description, dict(plots or {}))
        return fn

    return deco


def _import_family_modules(module: str) -> None:
    import flashrt_kernels

    for info in pkgutil.iter_modules(flashrt_kernels.__path__):
        if not info.ispkg:
            continue
        name = f"flashrt_kernels.{info.name}.{module}"
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name != name:
                _IMPORT_ERRORS[name] = f"{type(err).__name__}: {err}"
        except Exception as err:  # one broken family must not hide the others
            _IMPORT_ERRORS[name] = f"{type(err).__name__}: {err}"


def import_errors() -> dict[str, str]:
    """Family modules that failed to import (module -> error), after properties()/benchmarks()."""
    return dict(_IMPORT_ERRORS)


def properties() -> dict[str, Property]:
    _import_family_modules("properties")
    return dict(sorted(_PROPERTIES.items()))


def benchmarks() -> dict[str, Benchmark]:
    _import_family_modules("bench")
    return dict(sorted(_BENCHMARKS.items()))
