"""``flashrt_kernels.plot`` and ``flashrt plot``: SVG line plots of benchmark rows (CPU only)."""

import json
import xml.etree.ElementTree as ET

import pytest

from flashrt_kernels.plot import PANEL_H, PANEL_W, line_plot, select, write_plots

SVG = "{http://www.w3.org/2000/svg}"


def _rows():
    rows = []
    for heads in ("16/2", "32/8"):
        for b in (1, 4):
            for length in (2048, 8192, 32768):
                rows.append({"case": "decode q=1", "heads": heads, "B": b, "L": length,
                             "ours_us": length / 1000 * b, "sdpa_us": length / 900 * b})  # fmt: skip
    return rows


def _parse(svg):
    root = ET.fromstring(svg)
    return root, root.findall(f"{SVG}polyline"), root.findall(f"{SVG}circle")


def test_one_panel_per_group_one_line_per_column_every_point_inside_its_frame():
    svg = line_plot(_rows(), "L", ["ours_us", "sdpa_us"], ["heads", "B"], title="t")
    root, lines, dots = _parse(svg)
    assert len(lines) == 4 * 2 and len(dots) == 4 * 2 * 3
    frames = [r for r in root.findall(f"{SVG}rect") if r.get("fill") == "none"]
    assert len(frames) == 4
    for dot in dots:
        cx, cy = float(dot.get("cx")), float(dot.get("cy"))
        assert any(float(f.get("x")) <= cx <= float(f.get("x")) + float(f.get("width"))
                   and float(f.get("y")) <= cy <= float(f.get("y")) + float(f.get("height"))
                   for f in frames)  # fmt: skip
    assert float(root.get("width")) == 4 * PANEL_W and float(root.get("height")) > PANEL_H
    for line in lines:  # x increases along every line
        xs = [float(p.split(",")[0]) for p in line.get("points").split()]
        assert xs == sorted(xs) and len(set(xs)) == len(xs)


def test_missing_nan_and_nonpositive_values_are_left_out():
    rows = _rows()[:3]
    rows[0]["ours_us"] = float("nan")
    rows[1]["ours_us"] = None
    rows[2]["sdpa_us"] = 0.0
    rows.append({"L": 4096})  # no y at all
    _, lines, dots = _parse(line_plot(rows, "L", ["ours_us", "sdpa_us"]))
    assert len(dots) == 1 + 2 and len(lines) == 1  # one ours point (no line), two sdpa points
    _, lines, dots = _parse(line_plot(rows, "L", ["sdpa_us"], log_y=False))
    assert len(dots) == 3  # a linear axis keeps the zero


def test_nothing_to_plot_says_what_the_rows_hold():
    with pytest.raises(ValueError, match="no row has a plottable 'N'.*columns: \\['B', 'L'"):
        line_plot([{"L": 1, "B": 2}], "N", ["ours_us"])
    with pytest.raises(ValueError, match="at least one y column"):
        line_plot(_rows(), "L", [])


def test_select_matches_text_and_prefixes():
    rows = _rows() + [{"case": "tree 24 nodes", "B": 8, "L": 2048, "ours_us": 1.0}]
    assert len(select(rows, {"B": "4"})) == 6
    assert len(select(rows, {"case": "tree*"})) == 1
    assert len(select(rows, {"case": "decode q=1", "heads": "32/8", "B": "1"})) == 3
    assert select(rows, {"case": "tree"}) == []


def test_the_command_writes_an_svg_and_rejects_bad_input(tmp_path, capsys):
    from flashrt_kernels.cli.main import main

    path = tmp_path / "attention.json"
    path.write_text(json.dumps({"benchmark": "attention", "rows": _rows()}))
    assert main(["plot", str(path), "--x", "L", "--y", "ours_us", "--by", "heads",
                 "--where", "B=4"]) == 0  # fmt: skip
    _, lines, dots = _parse(path.with_suffix(".svg").read_text())
    assert len(lines) == 2 and len(dots) == 6
    assert main(["plot", str(path), "--x", "L", "--y", "ours_us", "--where", "B"]) == 2
    assert "COLUMN=VALUE" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"rows": 3}))
    assert main(["plot", str(bad), "--x", "L", "--y", "ours_us"]) == 2
    assert "list of row objects" in capsys.readouterr().out


def test_bench_writes_the_registered_plots_and_skips_empty_ones(tmp_path, capsys):
    from flashrt_kernels.registry import Benchmark

    plots = {"decode": {"x": "L", "ys": ["ours_us"], "by": ["B"], "where": {"heads": "16/2"}},
             "trees": {"x": "L", "ys": ["ours_us"], "where": {"case": "tree*"}}}  # fmt: skip
    bench = Benchmark("attention", "attention", lambda quick=False: [], "", plots)
    written = write_plots(bench, _rows(), tmp_path)
    assert [p.name for p in written] == ["attention-decode.svg"]
    _, lines, _ = _parse(written[0].read_text())
    assert len(lines) == 2
    assert "no plot trees" in capsys.readouterr().out


def test_registered_plots_name_their_columns():
    from flashrt_kernels.registry import benchmarks

    for bench in benchmarks().values():
        for name, spec in bench.plots.items():
            assert set(spec) <= {"x", "ys", "by", "where", "log_x", "log_y"}, (bench.name, name)
            assert isinstance(spec["x"], str) and spec["ys"], (bench.name, name)
            assert all(isinstance(c, str) for c in [*spec["ys"], *spec.get("by", [])])
