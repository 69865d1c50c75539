"""CUDA graphs of the text step, one per token bucket, and of the vision tower, one per list of
image grids (the ``cuda_graphs`` option).

A step's text work is the packed decoder forward over its live tokens (``packed_prefill``), the
LM head over the verified positions and the greedy choice. Its shapes are the live token count
``T``, the padded query count ``Q`` and the verified count ``R``; the graph for a step is the
one of its buckets ``(T_b, Q_b)`` (``buckets``) with ``R`` padded to its fixed maximum
(every row's chain token plus a full tree). The first step of a bucket runs the work once
eagerly (compilation, library workspaces), captures it, and replays it; later steps of that
bucket only copy their inputs into the graph's static buffers and replay.

Padding: the extra ``T_b - T`` live-index entries all name one position that is not live (it
exists whenever padding is needed, since ``T_b <= B * Q_b``), so they write K/V only past that
row's live extent (never read) and the output at that position is unspecified; padded verified
positions repeat position 0 and their choices are ignored. Graphs hold the addresses of the KV
pool and of the model's weights, so they belong to one pool (``Engine`` drops them with it).
On a CPU there is nothing to capture: the bucketed step runs eagerly (so the tests check the
padding on the CPU reference path).
"""

from __future__ import annotations

import time

import torch

from flashrt_activevln.model.ops import FEW_QUERIES
from flashrt_activevln.speculation import greedy_choices

TOKEN_BUCKET = 64
GRAPH_INPUTS = ("pos", "lengths", "vis", "q_lens", "live", "verify", "after", "chain")


def next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def buckets(tokens: int, queries: int, rows: int) -> tuple[int, int]:
    """(T_b, Q_b): queries to a power of two of at least ``FEW_QUERIES`` (so the few-query
    kernels are chosen exactly as the eager step chooses them), tokens to a multiple of
    ``TOKEN_BUCKET`` (of twice that past 8 of them, four times past 16: at most 1/8 padding and
    few graphs), at most ``rows * Q_b``."""
    q_b = max(FEW_QUERIES, next_pow2(queries))
    tokens = max(tokens, 1)
    step = TOKEN_BUCKET * (
        1 if tokens <= 8 * TOKEN_BUCKET else 2 if tokens <= 16 * TOKEN_BUCKET else 4
    )
    t_b = -(-tokens // step) * step
    return min(t_b, rows * q_b), q_b


def all_buckets(rows: int, max_queries: int) -> list[tuple[int, int]]:
    """Every (T_b, Q_b) that ``buckets`` returns for steps of at most ``max_queries`` queries per
    row over ``rows`` rows (what ``StepGraphs.capture_all`` captures ahead of a replay)."""
    top = buckets(1, max_queries, rows)[1]
    found = set()
    q_b = FEW_QUERIES
    while q_b <= top:
        found.update(buckets(t, q_b, rows) for t in range(1, rows * q_b + 1))
        q_b *= 2
    return sorted(found, key=lambda k: (k[1], k[0]))


def _capture(graph: torch.cuda.CUDAGraph, pool, work) -> float:
    """Runs ``work`` once eagerly on a side stream (kernel compilation, library workspaces, the
    caches it fills), then captures it into ``graph``; returns the seconds it took."""
    t0 = time.perf_counter()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        work()
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph, pool=pool):
        work()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


class VisionGraphs:
    """The vision tower replayed from one CUDA graph per list of image grids (frames of one size:
    one graph per image count). Graphs hold only the weights' addresses and the model's cached
    vision plans, so they outlive KV pools. On a CPU the tower runs eagerly."""

    def __init__(self, model):
        self.model = model
        self.graphs: dict[tuple, tuple] = {}  # grids -> (graph, pixel buffer, output holder)
        self.mempool = torch.cuda.graph_pool_handle() if torch.cuda.is_available() else None
        self.capture_seconds = 0.0

    def run(self, pixels: torch.Tensor, grids: list[tuple[int, int, int]]) -> torch.Tensor:
        """Merged image embeddings (a static tensor, valid until the next call)."""
        if not pixels.is_cuda:
            return self.model.vision(pixels, grids)
        key = tuple(tuple(g) for g in grids)
        entry = self.graphs.get(key)
        if entry is None:
            buf, out = pixels.clone(), {}

            def work():
                out["embeds"] = self.model.vision(buf, grids)

            graph = torch.cuda.CUDAGraph()
            self.capture_seconds += _capture(graph, self.mempool, work)
            entry = self.graphs[key] = (graph, buf, out)
        graph, buf, out = entry
        buf.copy_(pixels)
        graph.replay()
        return out["embeds"]


class _Graph:
    def __init__(self, rows: int, queries: int, inputs: dict[str, torch.Tensor]):
        self.rows, self.queries, self.inputs = rows, queries, inputs
        self.graph = torch.cuda.CUDAGraph() if inputs["embeds"].is_cuda else None
        self.logits: torch.Tensor | None = None
        self.choices: torch.Tensor | None = None


class StepGraphs:
    """Captured text steps of one engine and one KV pool."""

    def __init__(self, model, pool, max_verify: int, children: torch.Tensor | None, greedy: bool):
        self.model, self.pool = model, pool
        self.max_verify = max_verify
        self.children = children  # the trie's children table on the device (constrained)
        self.greedy = greedy
        self.graphs: dict[tuple[int, int], _Graph] = {}
        self.capture_seconds = 0.0  # eager first runs and captures of new buckets
        self.mempool = torch.cuda.graph_pool_handle() if torch.cuda.is_available() else None

    def _work(self, g: _Graph, extent: int) -> None:
        x, b, q_b = g.inputs, g.rows, g.queries
        hidden = self.model.decode(
            x["embeds"], x["pos"], self.pool, x["lengths"], x["vis"], x["q_lens"], extent,
            x["live"], x.get("chain"),
        )  # fmt: skip
        g.logits = self.model.logits(hidden.reshape(b * q_b, -1)[x["verify"]])
        if self.greedy:
            allowed = None if self.children is None else self.children[x["after"]]
            g.choices = greedy_choices(g.logits, allowed)

    def run(self, embeds: torch.Tensor, dv: dict[str, torch.Tensor], extent: int):
        """``embeds`` [B, Q_b, H] and the step's device inputs at bucket shapes (``dv``: pos,
        lengths, vis, q_lens, live, verify, after) -> (logits [R_max, V], choices [R_max] or
        None), static tensors valid until the next call."""
        b, q_b = embeds.shape[:2]
        key = (dv["live"].numel(), q_b)
        g = self.graphs.get(key)
        fresh = g is None
        if fresh:
            inputs = {k: torch.empty_like(v) for k, v in dv.items()}
            inputs["embeds"] = torch.empty_like(embeds)
            g = _Graph(b, q_b, inputs)
        for k, v in dv.items():
            g.inputs[k].copy_(v)
        g.inputs["embeds"].copy_(embeds)
        if embeds.device.type != "cuda":  # nothing to capture: the bucketed step runs eagerly
            self.graphs[key] = g
            self._work(g, extent)
            return g.logits, g.choices
        if fresh:
            self.capture_seconds += _capture(g.graph, self.mempool, lambda: self._work(g, extent))
            self.graphs[key] = g
        # (the eager run's K/V writes are the same values the replay writes again)
        g.graph.replay()
        return g.logits, g.choices

    def capture_all(self, bucket_list: list[tuple[int, int]], constrained: bool,
                    chains: bool = False) -> int:  # fmt: skip
        """Captures every bucket of ``bucket_list`` not captured yet, over placeholder inputs of
        the bucket's shapes (query lengths that fill ``T_b``, KV lengths 0: the K/V they write
        lie past every row's committed prefix, never read). Returns how many were captured."""
        b = self.pool.k.shape[1]
        dev = self.pool.k.device
        hidden = self.model.cfg.text.hidden_size
        new = 0
        for t_b, q_b in bucket_list:
            if (t_b, q_b) in self.graphs:
                continue
            q_lens = torch.full((b,), t_b // b, dtype=torch.long)
            q_lens[: t_b % b] += 1
            live = (torch.arange(q_b)[None] < q_lens[:, None]).reshape(-1).nonzero()[:, 0]
            host = {
                "pos": torch.zeros(3, b, q_b, dtype=torch.long),
                "lengths": torch.zeros(b, dtype=torch.long),
                "vis": torch.eye(q_b, dtype=torch.bool).repeat(b, 1, 1),
                "q_lens": q_lens,
                "live": live,
                "verify": torch.zeros(self.max_verify, dtype=torch.long),
            }
            if constrained:
                host["after"] = torch.zeros(self.max_verify, dtype=torch.long)
            if chains:
                host["chain"] = q_lens.clone()
            dv = {k: v.to(dev) for k, v in host.items()}
            embeds = torch.zeros(b, q_b, hidden, dtype=self.model.dtype, device=dev)
            self.run(embeds, dv, q_b)
            new += 1
        return new
