"""`flashrt activevln ...`: registered through the `flashrt.commands` entry point; `demo()` is what
`flashrt demo` runs for this package (entry point group `flashrt.demos`).

- ``demo``: tiny config, random checkpoint written to a temp folder and read back by the real
  loader, a few synthetic episodes, the ``fast`` preset against ``reference``;
- ``replay --checkpoint DIR --data DIR --preset fast [--log FILE]``;
- ``bench``: the chosen preset, the preset without the tree, the plain path (reference preset,
  B=1, no tree) and optionally HF ``generate`` side by side on a synthetic R2R-geometry replay
  (``bench.py``): frames/s, ms per frame by stage, forwards per reply, agreement.
"""

from __future__ import annotations

import json

PACKAGE = "flashrt-activevln"


def _compare(
    checkpoint,
    episodes,
    device,
    dtype,
    progress,
    fast_overrides=None,
    ref_overrides=None,
    random_config="tiny",
    fast_preset="fast",
    hf=False,
):
    """Replays with the reference preset and ``fast_preset``; ``checkpoint`` None: in-memory
    random weights of ``random_config``."""
    from flashrt_activevln.engine_setup import agreement, engine_for, run_replay
    from flashrt_activevln.presets import preset

    def engine(opt):
        return engine_for(checkpoint, random_config, opt, device)

    common = {"dtype": dtype, "constrain_to_grammar": True, "max_new_tokens": 24}
    ref_opt = preset("reference", **{**common, **(ref_overrides or {})})
    fast_opt = preset(fast_preset, **{**common, **(fast_overrides or {})})
    ref_engine = engine(ref_opt)
    ref, ref_stats = run_replay(ref_engine, episodes, progress, "reference")
    fast, fast_stats = run_replay(engine(fast_opt), episodes, progress, fast_preset)
    if hf:
        from flashrt_activevln.hf_baseline import hf_model, replay_hf

        model = hf_model(ref_engine.model.cfg, ref_engine.model.w)
        replies = {k: r.tokens for k, r in ref.items()}
        _, seconds = replay_hf(model, ref_engine.proc, episodes, replies)
        ref_stats["hf_generate_ms_per_frame"] = 1000 * sum(seconds) / max(len(seconds), 1)
        ref_stats["hf_frames"] = len(seconds)
    return ref_stats, fast_stats, agreement(fast, ref), fast_opt


def demo(progress: bool = True) -> list[dict]:
    """Rows for `flashrt demo`'s table: package, what, result, detail."""
    return demo_rows(progress)


def demo_rows(progress=True, n_episodes=4, mean_frames=4, height=480, width=640) -> list[dict]:
    from flashrt_activevln.data import synthetic_episodes
    from flashrt_activevln.engine_setup import write_tiny_random_checkpoint

    ckpt = write_tiny_random_checkpoint()
    episodes = synthetic_episodes(
        n_episodes, seed=0, mean_frames=mean_frames, min_frames=2, height=height, width=width
    )
    ref, fast, (same, n), opt = _compare(
        ckpt, episodes, "cpu", "float64", progress, fast_overrides={"batch_size": 4}
    )
    return [
        {
            "package": PACKAGE,
            "what": f"fast vs reference replay (tiny random checkpoint, {width}x{height} "
            "synthetic frames, float64 CPU, grammar-constrained)",
            "result": "PASS" if same == n else "FAIL",
            "detail": f"{same}/{n} frames identical; decode forwards per reply "
            f"{ref['decode_forwards_per_reply']:.2f} -> {fast['decode_forwards_per_reply']:.2f} "
            f"(tree budget {opt.grammar_tree_budget}, B={opt.batch_size})",
        }
    ]


def register(subparsers) -> None:
    parser = subparsers.add_parser("activevln", help="ActiveVLN engine")
    sub = parser.add_subparsers(dest="activevln_command", required=True)
    sub.add_parser("demo", help="run the built-in demo").set_defaults(
        func=lambda args: _print_demo()
    )

    rp = sub.add_parser("replay", help="replay a folder of episodes")
    rp.add_argument("--checkpoint", required=True)
    rp.add_argument("--data", required=True)
    rp.add_argument("--preset", default="fast")
    rp.add_argument("--option", action="append", default=[], help="NAME=VALUE override")
    rp.add_argument("--device", default=None)
    rp.add_argument("--log", default="activevln_replay.jsonl")
    rp.set_defaults(func=_replay)

    bp = sub.add_parser("bench", help="plain path vs a preset on a synthetic R2R replay")
    bp.add_argument("--checkpoint", default=None, help="default: random weights (--random-config)")
    bp.add_argument("--random-config", default="tiny", choices=["tiny", "3b"])
    bp.add_argument("--episodes", type=int, default=64)
    bp.add_argument("--mean-frames", type=int, default=64)
    bp.add_argument(
        "--baseline-episodes",
        type=int,
        default=4,
        help="episodes the slower paths replay (plain, no tree, HF)",
    )
    bp.add_argument(
        "--baseline-frames",
        type=int,
        default=None,
        help="cut the slower paths' episodes to this many frames (default: whole)",
    )
    bp.add_argument("--preset", default="fast")
    bp.add_argument("--option", action="append", default=[], help="NAME=VALUE override")
    bp.add_argument("--dtype", default="bfloat16")
    bp.add_argument("--device", default=None)
    bp.add_argument("--out", default=None, help="write the results as JSON here")
    bp.add_argument(
        "--hf", action="store_true", help="also time HF transformers generate at B=1 (same work)"
    )
    bp.set_defaults(func=_bench)


PYTHON_WORDS = {"True": True, "False": False, "None": None}


def _parse_overrides(items: list[str]) -> dict:
    """``NAME=VALUE`` items: the value as JSON (``2``, ``0.7``, ``true``), or Python's ``True`` /
    ``False`` / ``None``, else the string itself."""
    out = {}
    for item in items:
        if "=" not in item:
            raise SystemExit(f"--option {item!r}: expected NAME=VALUE")
        k, v = item.split("=", 1)
        if v in PYTHON_WORDS:
            out[k] = PYTHON_WORDS[v]
            continue
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out


def _replay(args) -> int:
    from flashrt_activevln.data import JsonlLog, read_replay_set
    from flashrt_activevln.engine_setup import build_engine, default_device, run_replay
    from flashrt_activevln.presets import preset

    opt = preset(args.preset, **_parse_overrides(args.option))
    episodes = read_replay_set(args.data)
    engine = build_engine(args.checkpoint, opt, args.device or default_device())
    log = JsonlLog(args.log)
    _, stats = run_replay(engine, episodes, progress=True, label=args.preset, log=log)
    log.close()
    print(json.dumps(stats, indent=2))
    return 0


def _bench(args) -> int:
    from flashrt_activevln import bench
    from flashrt_activevln.engine_setup import default_device
    from flashrt_kernels.benchmarking import markdown_table

    result = bench.run(
        checkpoint=args.checkpoint,
        random_config=args.random_config,
        episodes=args.episodes,
        mean_frames=args.mean_frames,
        baseline_episodes=args.baseline_episodes,
        baseline_frames=args.baseline_frames,
        preset_name=args.preset,
        overrides=_parse_overrides(args.option),
        dtype=args.dtype,
        device=args.device or default_device(),
        hf=args.hf,
    )
    print(markdown_table(bench.rows(result)))
    for what, (same, n) in result["identical"].items():
        print(f"identical replies, {what}: {same}/{n} frames")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=2)
    return 0


def _print_demo() -> int:
    from flashrt_kernels.benchmarking import markdown_table

    print(markdown_table(demo()))
    return 0
