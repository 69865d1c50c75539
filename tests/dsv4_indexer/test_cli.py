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
