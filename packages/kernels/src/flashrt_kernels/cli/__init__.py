"""The ``flashrt`` command: ``info``, ``check``, ``bench``, ``demo``, and the subcommands that
installed model packages add through the ``flashrt.commands`` entry-point group."""

from flashrt_kernels.cli.main import main

__all__ = ["main"]
