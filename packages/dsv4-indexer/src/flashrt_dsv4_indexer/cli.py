"""`flashrt dsv4-indexer ...`: registered through the `flashrt.commands` entry point; `demo()` is what
`flashrt demo` runs for this package (entry point group `flashrt.demos`)."""

from __future__ import annotations

PACKAGE = "flashrt-dsv4-indexer"


def demo(progress: bool = True) -> list[dict]:
    """Rows for `flashrt demo`'s table: a few closed-loop decode steps of a tiny chain (churn,
    compaction, multi-token prediction), the fast path against the reference, per key format."""
    import torch

    from flashrt_dsv4_indexer import chains, config, routing, topk_stage
    from flashrt_dsv4_indexer.indexer import Indexer
    from flashrt_dsv4_indexer.key_cache import PagedKeyCache
    from flashrt_kernels.backends import triton_interpreter_active

    device = "cuda" if torch.cuda.is_available() else "cpu"
    logits_backend = "triton" if device == "cuda" or triton_interpreter_active() else "reference"
    topk_backend = "auto" if device == "cuda" else "reference"
    policy = routing.RoutingPolicy(min_assist_n=24, list_min_n=80, list_max_batch=2,
                                   counts_min_work=240)  # fmt: skip
    rows = []
    for fmt, next_n in (("fp8", 1), ("fp4", 2)):
        cfg = config.tiny(fmt)
        spec = chains.ChainSpec(slots=3, min_len=40, max_len=480, next_n=next_n, churn=0.3,
                                compact=0.2, seed=1)  # fmt: skip
        cache = PagedKeyCache(chains.DecodeChain.cache_blocks(cfg, spec, cfg.block_size),
                              cfg.block_size, cfg.head_dim, fmt, device)  # fmt: skip
        ix = Indexer(cfg, cache, max_requests=32, policy=policy, logits_backend=logits_backend,
                     topk_backend=topk_backend)  # fmt: skip
        ch = chains.DecodeChain(cfg, spec, ix, device)
        exact, tiers, steps = 0, [], 4
        for _ in range(steps):
            st = ch.step()
            top = chains.drive(ix, st, next_n)
            buf = ix.last_buffers
            _, want = topk_stage.exact_reference(buf.logits, cfg.topk, buf.lengths)
            exact += int(torch.equal(top, want))
            tiers.append(ix.last_tier)
        rows.append({
            "package": PACKAGE,
            "what": f"tiny {fmt} chain, next_n={next_n}, {steps} steps ({device}, logits "
                    f"{logits_backend})",
            "result": "exact" if exact == steps else f"{steps - exact} steps differ",
            "detail": f"tiers {'/'.join(tiers)}; {spec.slots} rows with churn; selection == "
                      "deterministic top-K of the step's logits",
        })  # fmt: skip
    return rows


def register(subparsers) -> None:
    parser = subparsers.add_parser("dsv4-indexer", help="DeepSeek V4 indexer engine")
    sub = parser.add_subparsers(dest="dsv4_indexer_command", required=True)
    sub.add_parser("demo", help="run the built-in demo").set_defaults(
        func=lambda args: _print_demo()
    )
    b = sub.add_parser("bench", help="per-step logits + top-K benchmark (needs a GPU)")
    b.add_argument("--quick", action="store_true")
    b.add_argument("--out", default=None)
    b.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="stop starting new cells after this many seconds (default: the bench's)",
    )
    b.add_argument("--prefill", action="store_true",
                   help="time every prompt token's selection (Indexer.context_topk) instead")  # fmt: skip
    b.set_defaults(func=_bench)


def _bench(args) -> int:
    from flashrt_dsv4_indexer import bench

    argv = (["--quick"] if args.quick else []) + (["--out", args.out] if args.out else [])
    if args.budget_s is not None:
        argv += ["--budget-s", str(args.budget_s)]
    return bench.main(argv + (["--prefill"] if args.prefill else []))


def _print_demo() -> int:
    from flashrt_kernels.benchmarking import markdown_table

    print(markdown_table(demo()))
    return 0
