"""Argument parsing and plugin discovery for the ``flashrt`` command."""

from __future__ import annotations

import argparse
import os
import sys
from importlib.metadata import entry_points


def use_interpreter_without_gpu() -> None:
    """Run Triton kernels through the CPU interpreter when there is no CUDA device. Must happen
    before any kernel module is imported (Triton reads it when a kernel is defined)."""
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


def _plugins(group: str) -> list:
    return sorted(entry_points(group=group), key=lambda ep: ep.name)


def build_parser() -> tuple[argparse.ArgumentParser, list[tuple[str, str]]]:
    from flashrt_kernels.cli import bench, check, demo, info

    parser = argparse.ArgumentParser(
        prog="flashrt", description="flashrt: realtime GPU inference kernels and engines"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for module in (info, check, bench, demo):
        module.register(sub)
    plugin_status = []
    for ep in _plugins("flashrt.commands"):
        try:
            ep.load()(sub)
            plugin_status.append((ep.name, "ok"))
        except Exception as err:  # a broken plugin must not take the whole command down
            plugin_status.append((ep.name, f"failed to load: {err}"))
    return parser, plugin_status


def main(argv: list[str] | None = None) -> int:
    use_interpreter_without_gpu()
    parser, plugin_status = build_parser()
    args = parser.parse_args(argv)
    args.plugin_status = plugin_status
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
