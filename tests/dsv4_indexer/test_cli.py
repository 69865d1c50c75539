import argparse

from flashrt_dsv4_indexer import cli


def test_demo_runs_a_real_tiny_chain_and_reports_exactness():
    rows = cli.demo(progress=False)
    assert len(rows) == 2
    for r in rows:
        assert set(r) == {"package", "what", "result", "detail"}
        assert r["package"] == "flashrt-dsv4-indexer" and r["result"] == "exact"


def test_register_adds_demo_and_bench():
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="cmd"))
    args = parser.parse_args(["dsv4-indexer", "bench", "--quick"])
    assert args.quick and callable(args.func)
    assert callable(parser.parse_args(["dsv4-indexer", "demo"]).func)


def test_bench_forwards_its_options_to_the_module(monkeypatch):
    """`flashrt dsv4-indexer bench` takes the module's options (`--budget-s` among them)."""
    from flashrt_dsv4_indexer import bench

    seen = []
    monkeypatch.setattr(bench, "main", lambda argv: seen.append(argv) or 0)
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="cmd"))
    args = parser.parse_args(["dsv4-indexer", "bench", "--out", "o", "--budget-s", "60"])
    assert args.func(args) == 0
    assert seen == [["--out", "o", "--budget-s", "60.0"]]
    args = parser.parse_args(["dsv4-indexer", "bench", "--prefill"])
    assert args.func(args) == 0
    assert seen[-1] == ["--prefill"]
