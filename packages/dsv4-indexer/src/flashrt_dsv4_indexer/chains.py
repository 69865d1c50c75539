"""Synthetic decode chains: the test and benchmark workload (an engine in miniature).

A chain runs ``slots`` batch rows. Each request has its own length, its own structured keys
(clustered around a few per-request centres, so scores have real tails) and its own query, which
drifts from step to step (``q <- a q + sqrt(1 - a^2) noise``): consecutive selections overlap a lot
but not fully. Every step each row gains ``next_n`` tokens (multi-token prediction) and, when its
length crosses a multiple of the compression ratio, a compressed key is appended through the cache's
write path. With probability ``churn`` a request finishes after a step and a new one (new id, new
length, cold) takes the freed slot; slots can also be compacted (rows permuted) so a request moves
to another batch row. Pages come from a shared free list, so block tables are scattered.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from flashrt_dsv4_indexer.config import IndexerConfig


@dataclass(frozen=True)
class ChainSpec:
    slots: int = 4
    min_len: int = 64
    max_len: int = 256
    next_n: int = 1
    churn: float = 0.0
    compact: float = 0.0  # probability a step permutes the rows
    drift: float = 0.95
    steps_headroom: int = 64
    seed: int = 0


@dataclass
class Request:
    rid: int
    seq_len: int
    q: torch.Tensor  # [H, D] float32
    w: torch.Tensor  # [H] float32
    centres: torch.Tensor  # [C, D]
    pages: list[int] = field(default_factory=list)


@dataclass
class Step:
    """One decode step's engine inputs (device tensors plus the host lengths)."""

    q: torch.Tensor  # [B * next_n, H, D] float32 (unrotated)
    weights: torch.Tensor  # [B * next_n, H]
    seq_lens: torch.Tensor  # int32 [B]
    seq_lens_host: list[int]
    block_table: torch.Tensor  # int32 [B, max_pages]
    request_ids: list[int]
    new: list[int]  # batch rows holding requests that started this step (prefill first)
    finished: list[int]  # request ids that finished before this step


class DecodeChain:
    def __init__(self, config: IndexerConfig, spec: ChainSpec, indexer, device="cpu") -> None:
        self.cfg, self.spec, self.ix = config, spec, indexer
        self.device = torch.device(device)
        self.rng = random.Random(spec.seed)
        self.gen = torch.Generator(device=self.device).manual_seed(spec.seed)
        cap_tokens = spec.max_len + spec.steps_headroom * spec.next_n
        self.max_pages = -(-(cap_tokens // config.compress_ratio + 1) // indexer.cache.block_size)
        if indexer.cache.num_blocks < 2 * spec.slots * self.max_pages:
            raise ValueError("DecodeChain: the cache needs 2 * slots * max_pages blocks")
        self.free = list(range(indexer.cache.num_blocks))
        self.rng.shuffle(self.free)
        self.block_table = torch.zeros(spec.slots, self.max_pages, dtype=torch.int32, device=device)
        self.next_id = 0
        self.rows: list[Request] = []
        for r in range(spec.slots):
            self._start(r)
        self._new = list(range(spec.slots))
        self._finished: list[int] = []

    @staticmethod
    def cache_blocks(config: IndexerConfig, spec: ChainSpec, block_size: int) -> int:
        cap_tokens = spec.max_len + spec.steps_headroom * spec.next_n
        pages = -(-(cap_tokens // config.compress_ratio + 1) // block_size)
        return 2 * spec.slots * pages

    def _randn(self, *shape) -> torch.Tensor:
        return torch.randn(*shape, generator=self.gen, device=self.device)

    def _keys(self, req: Request, start: int, n: int) -> torch.Tensor:
        c = req.centres.shape[0]
        pick = torch.randint(0, c, (n,), generator=self.gen, device=self.device)
        amp = 0.5 + torch.rand(n, 1, generator=self.gen, device=self.device)
        return req.centres[pick] * amp + 0.6 * self._randn(n, self.cfg.head_dim)

    def _ensure_pages(self, row: int, n_keys: int) -> None:
        req = self.rows[row]
        need = -(-n_keys // self.ix.cache.block_size)
        while len(req.pages) < need:
            req.pages.append(self.free.pop())
        self.block_table[row, : len(req.pages)] = torch.tensor(req.pages, dtype=torch.int32)

    def _start(self, row: int) -> Request:
        cfg, spec = self.cfg, self.spec
        centres = self._randn(8, cfg.head_dim)
        q = centres[torch.randint(0, 8, (cfg.n_heads,), generator=self.gen, device=self.device)]
        q = q + 0.5 * self._randn(cfg.n_heads, cfg.head_dim)
        w = self._randn(cfg.n_heads).abs() * cfg.n_heads**-0.5
        req = Request(self.next_id, self.rng.randint(spec.min_len, spec.max_len), q, w, centres)
        self.next_id += 1
        if row < len(self.rows):
            self.rows[row] = req
        else:
            self.rows.append(req)
        n = cfg.n_keys(req.seq_len)
        self._ensure_pages(row, n)
        if n:
            self._write(row, 0, self._keys(req, 0, n))
        return req

    def _write(self, row: int, start: int, keys: torch.Tensor) -> None:
        n = keys.shape[0]
        rows = torch.full((n,), row, dtype=torch.int64, device=self.device)
        pos = torch.arange(start, start + n, device=self.device)
        self.ix.write_keys(self.block_table, rows, pos, keys)

    def _finish(self, row: int) -> None:
        req = self.rows[row]
        self.free.extend(req.pages)
        self._finished.append(req.rid)
        self.block_table[row].zero_()
        self._start(row)
        self._new.append(row)

    def _advance(self) -> None:
        """Grow every row by next_n tokens, appending the compressed keys that completes."""
        for row, req in enumerate(self.rows):
            before = self.cfg.n_keys(req.seq_len)
            req.seq_len += self.spec.next_n
            after = self.cfg.n_keys(req.seq_len)
            if after > before:
                self._ensure_pages(row, after)
                self._write(row, before, self._keys(req, before, after - before))
            a = self.spec.drift
            req.q = a * req.q + (1 - a * a) ** 0.5 * self._randn(*req.q.shape)

    def _compact(self) -> None:
        perm = list(range(len(self.rows)))
        self.rng.shuffle(perm)
        self.rows = [self.rows[p] for p in perm]
        self.block_table = self.block_table[perm].contiguous()
        self._new = [perm.index(r) for r in self._new]

    def step(self) -> Step:
        """The next decode step's inputs (the first step is the prefill -> decode handoff)."""
        spec = self.spec
        for row in range(len(self.rows)):
            if row not in self._new and self.rng.random() < spec.churn:
                self._finish(row)
        if spec.compact and self.rng.random() < spec.compact:
            self._compact()
        self._advance()
        nn, h = spec.next_n, self.cfg.n_heads
        q = torch.stack([r.q for r in self.rows]).repeat_interleave(nn, 0)
        q = q + 0.05 * self._randn(*q.shape)
        w = torch.stack([r.w for r in self.rows]).repeat_interleave(nn, 0).reshape(-1, h)
        host = [r.seq_len for r in self.rows]
        out = Step(
            q=q.contiguous(),
            weights=w.contiguous(),
            seq_lens=torch.tensor(host, dtype=torch.int32, device=self.device),
            seq_lens_host=host,
            block_table=self.block_table.clone(),
            request_ids=[r.rid for r in self.rows],
            new=sorted(self._new),
            finished=self._finished,
        )
        self._new, self._finished = [], []
        return out


def prefill_inputs(step: Step, next_n: int):
    """The new rows' last-context-token inputs for ``Indexer.prefill``: (q, w, seq_lens, host
    lengths, block_table, request_ids), the length being the context before this step's tokens."""
    rows = step.new
    idx = torch.tensor(rows, dtype=torch.int64, device=step.q.device)
    last = idx * next_n
    host = [step.seq_lens_host[r] - next_n for r in rows]
    seq = torch.tensor(host, dtype=torch.int32, device=step.q.device)
    return (step.q[last], step.weights[last], seq, host, step.block_table[idx],
            [step.request_ids[r] for r in rows])  # fmt: skip


def drive(indexer, step: Step, next_n: int) -> torch.Tensor:
    """What an engine does each step: hand new requests over from prefill, then decode."""
    if step.finished:
        indexer.finish(step.finished)
    if step.new:
        q, w, seq, host, bt, ids = prefill_inputs(step, next_n)
        indexer.prefill(q, w, seq, bt, ids, seq_lens_host=host)
    return indexer.decode_step(step.q, step.weights, step.seq_lens, step.block_table,
                               step.request_ids, seq_lens_host=step.seq_lens_host)  # fmt: skip
