"""Argument parsing and plugin discovery for the ``flashrt`` command.

Model packages add subcommands and demos through the ``flashrt.commands`` / ``flashrt.demos``
entry-point groups (``<package>.cli:register`` / ``<package>.cli:demo``). Where the workspace is
used from source on ``PYTHONPATH`` (a GPU machine without uv: ``python3 -m flashrt_kernels ...``),
no entry points are installed, so a ``flashrt_*`` package with a ``cli`` module is found by name.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import pkgutil
import sys
from collections.abc import Callable
from importlib.metadata import entry_points

# entry-point group -> the attribute of ``<package>.cli`` that plays its part
PLUGIN_ATTRS = {"flashrt.commands": "register", "flashrt.demos": "demo"}


def use_interpreter_without_gpu() -> None:
    """Run Triton kernels through the CPU interpreter when there is no CUDA device. Must happen
    before any kernel module is imported (Triton reads it when a kernel is defined)."""
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


def _from_source(module: str, attr: str) -> Callable:
    return getattr(importlib.import_module(f"{module}.cli"), attr)


def plugins(group: str) -> list[tuple[str, Callable[[], Callable]]]:
    """(name, loader) of every plugin in ``group``, sorted by name: the installed entry points,
    then the ``flashrt_*`` packages on the path that no entry point names (their ``cli`` module's
    ``PLUGIN_ATTRS[group]``, named like the entry point would be: ``flashrt_dsv4_indexer`` ->
    ``dsv4-indexer``)."""
    found = {ep.name: ep.load for ep in entry_points(group=group)}
    covered = {ep.value.split(":")[0].split(".")[0] for ep in entry_points(group=group)}
    for info in pkgutil.iter_modules():
        mod = info.name
        if not mod.startswith("flashrt_") or mod == "flashrt_kernels" or mod in covered:
            continue
        name = mod.removeprefix("flashrt_").replace("_", "-")
        if name not in found and importlib.util.find_spec(f"{mod}.cli") is not None:
            found[name] = lambda mod=mod: _from_source(mod, PLUGIN_ATTRS[group])
    return sorted(found.items())


def build_parser() -> tuple[argparse.ArgumentParser, list[tuple[str, str]]]:
    from flashrt_kernels.cli import bench, check, demo, info, plot

    parser = argparse.ArgumentParser(
        prog="flashrt", description="flashrt: realtime GPU inference kernels and engines"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for module in (info, check, bench, demo, plot):
        module.register(sub)
    plugin_status = []
    for name, load in plugins("flashrt.commands"):
        try:
            load()(sub)
            plugin_status.append((name, "ok"))
        except Exception as err:  # a broken plugin must not take the whole command down
            plugin_status.append((name, f"failed to load: {err}"))
    return parser, plugin_status


def main(argv: list[str] | None = None) -> int:
    use_interpreter_without_gpu()
    parser, plugin_status = build_parser()
    args = parser.parse_args(argv)
    args.plugin_status = plugin_status
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
