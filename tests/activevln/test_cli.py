"""The demo runs end to end (random checkpoint written and loaded by the real loader, synthetic
640x480 episodes, fast preset vs reference) and reports agreement; the CLI registers."""

import argparse

from flashrt_activevln import cli


def test_demo_fast_agrees_with_reference():
    rows = cli.demo_rows(False, n_episodes=2, mean_frames=2, height=120, width=160)
    assert rows and set(rows[0]) >= {"package", "what", "result", "detail"}
    assert rows[0]["result"] == "PASS", rows[0]["detail"]


def test_register_subcommands():
    p = argparse.ArgumentParser()
    cli.register(p.add_subparsers(dest="cmd"))
    args = p.parse_args(["activevln", "replay", "--checkpoint", "c", "--data", "d"])
    assert args.preset == "fast" and callable(args.func)
    args = p.parse_args(["activevln", "bench", "--episodes", "2", "--option", "batch_size=2"])
    assert cli._parse_overrides(args.option) == {"batch_size": 2}
    got = cli._parse_overrides(
        ["vision_stream=True", "do_sample=false", "dataset=rxr", "top_p=0.9"]
    )
    assert got == {"vision_stream": True, "do_sample": False, "dataset": "rxr", "top_p": 0.9}


def test_bench_path_random_weights_float32():
    from flashrt_activevln.data import synthetic_episodes

    eps = synthetic_episodes(2, seed=1, mean_frames=2, min_frames=2, height=56, width=84)
    ref, fast, (same, n), opt = cli._compare(
        None, eps, "cpu", "float32", False, fast_overrides={"batch_size": 2}
    )
    assert n == sum(len(e.frames) for e in eps) >= 4 and same == n
    assert fast["decode_forwards_per_reply"] * 2 <= ref["decode_forwards_per_reply"]
    assert set(ref["ms_per_frame"]) == {"preprocess", "vision", "prefill", "decode"}


def test_bench_runs_every_path_tiny_cpu():
    from flashrt_activevln import bench

    result = bench.run(
        random_config="tiny", episodes=3, mean_frames=2, baseline_episodes=2, dtype="float32",
        overrides={"batch_size": 2, "gpu_preprocess": False}, progress=False,
    )  # fmt: skip
    assert set(result["paths"]) == {"preset", "preset, B=1", "preset, no tree", "plain"}
    same, n = result["identical"]["preset vs preset, no tree"]
    assert n == result["paths"]["plain"]["frames"] and same == n
    table = bench.rows(result)
    assert [r["path"] for r in table] == ["preset", "preset, B=1", "preset, no tree", "plain"]
    assert table[3]["x plain"] == "1.00"
