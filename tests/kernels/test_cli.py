"""The ``flashrt`` command's plugin discovery (CPU)."""

import importlib
import os
import subprocess
import sys
from pathlib import Path

# the module (the package's ``main`` attribute is the command's function)
cli_main = importlib.import_module("flashrt_kernels.cli.main")

ROOT = Path(__file__).resolve().parents[2]


def test_plugins_come_from_entry_points_when_installed():
    names = [name for name, _ in cli_main.plugins("flashrt.commands")]
    assert {"activevln", "dsv4-indexer", "alpamayo"} <= set(names)
    assert names == sorted(names)


def test_plugins_found_by_name_without_entry_points(monkeypatch):
    """A workspace used from source (no dist-info, so no entry points) still gets every model
    package's subcommand and demo, named like the entry points."""
    monkeypatch.setattr(cli_main, "entry_points", lambda group: [])
    commands = dict(cli_main.plugins("flashrt.commands"))
    demos = dict(cli_main.plugins("flashrt.demos"))
    assert {"activevln", "dsv4-indexer", "alpamayo"} <= set(commands) & set(demos)
    from flashrt_activevln import cli as activevln_cli

    assert commands["activevln"]() is activevln_cli.register
    assert demos["activevln"]() is activevln_cli.demo
    parser, status = cli_main.build_parser()
    assert ("activevln", "ok") in status
    args = parser.parse_args(["activevln", "bench", "--random-config", "tiny"])
    assert args.activevln_command == "bench"


def test_python_m_flashrt_kernels_runs_the_command_from_source():
    """``python3 -m flashrt_kernels`` with the sources on PYTHONPATH and no entry points (hidden
    here: this environment has the packages installed), as on the GPU machine."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in sorted((ROOT / "packages").glob("*/src")))
    code = (
        "import importlib.metadata as md, runpy, sys\n"
        "md.entry_points = lambda **kw: []\n"
        "sys.argv = ['flashrt_kernels', 'activevln', '--help']\n"
        "runpy.run_module('flashrt_kernels', run_name='__main__')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "bench" in proc.stdout and "replay" in proc.stdout
