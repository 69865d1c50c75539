"""tools/gpu_run.py's side-by-side comparison of a benchmark run with its baseline run."""

import importlib.util
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[2] / "tools" / "gpu_run.py"


def _tool():
    spec = importlib.util.spec_from_file_location("gpu_run", PATH)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def test_compare_rows_matches_shapes_and_divides_times():
    tool = _tool()
    ours = [
        {"M": 16, "K": 2048, "op": "a", "t_us": 10.0, "ref_us": 40.0, "tflops": 1.5, "ok": True},
        {"M": 32, "K": 2048, "op": "a", "t_us": 20.0, "ref_us": 40.0, "tflops": 1.5, "ok": True},
        {"M": 64, "K": 2048, "op": "a", "t_us": 5.0, "ref_us": 40.0, "tflops": 1.5, "ok": False},
    ]
    base = [
        {"M": 32, "K": 2048, "op": "a", "t_us": 30.0, "ref_us": 41.0, "tflops": 1.0, "ok": True},
        {"M": 16, "K": 2048, "op": "a", "t_us": 25.0, "ref_us": 39.0, "tflops": 1.0, "ok": False},
    ]
    rows = tool.compare_rows(ours, base)
    assert [r["M"] for r in rows] == [16, 32]  # M = 64 has no baseline row; bools are no key
    assert rows[0]["t_us"] == 10.0 and rows[0]["t_us base"] == 25.0 and rows[0]["t_us x"] == 2.5
    assert rows[1]["ref_us x"] == pytest.approx(41.0 / 40.0)
    assert "tflops" not in rows[0] and "ok" not in rows[0]


def test_baseline_must_hold_packages(tmp_path, monkeypatch, capsys):
    tool = _tool()
    monkeypatch.setattr("sys.argv", ["gpu_run.py", "--out", str(tmp_path / "o"), "--baseline",
                                     str(tmp_path)])  # fmt: skip
    with pytest.raises(SystemExit):
        tool.main()
    assert "expected a folder holding packages/*/src" in capsys.readouterr().err


def test_pytest_args_keep_their_quoting(tmp_path, monkeypatch):
    """``--pytest-args "-k 'a or b'"`` reaches pytest as two arguments, not four."""
    tool = _tool()
    seen = {}

    def fake_run_tests(paths, out, extra):
        seen["extra"] = extra
        return {"returncode": 0, "seconds": 0.0}

    monkeypatch.setattr(tool, "run_tests", fake_run_tests)
    monkeypatch.setattr("sys.argv", ["gpu_run.py", "--out", str(tmp_path), "--tests", "t.py",
                                     "--pytest-args", "-k 'nvfp4 or fp8'", "--max-examples", "3"])  # fmt: skip
    assert tool.main() == 0
    assert seen["extra"] == ["-k", "nvfp4 or fp8", "--max-examples=3"]
