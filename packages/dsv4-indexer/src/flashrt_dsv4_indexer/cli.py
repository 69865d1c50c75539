"""`flashrt dsv4-indexer ...`: registered through the `flashrt.commands` entry point; `demo()` is what
`flashrt demo` runs for this package (entry point group `flashrt.demos`)."""

from __future__ import annotations

PACKAGE = "flashrt-dsv4-indexer"


def demo(progress: bool = True) -> list[dict]:
    """Rows for `flashrt demo`'s table: package, what, result, detail."""
    return [
        {
            "package": PACKAGE,
            "what": "engine demo",
            "result": "not implemented",
            "detail": "the DeepSeek V4 indexer engine does not exist yet: no numbers to show",
        }
    ]


def register(subparsers) -> None:
    parser = subparsers.add_parser("dsv4-indexer", help="DeepSeek V4 indexer engine")
    sub = parser.add_subparsers(dest="dsv4_indexer_command", required=True)
    sub.add_parser("demo", help="run the built-in demo").set_defaults(
        func=lambda args: _print_demo()
    )


def _print_demo() -> int:
    from flashrt_kernels.benchmarking import markdown_table

    print(markdown_table(demo()))
    return 0
