"""The ``Indexer``: what an inference engine calls around its sparse attention.

    idx = Indexer(config, cache, max_requests=..., device=...)
    idx.write_keys(block_table, rows, positions, keys)        # new compressed keys (any step)
    top = idx.prefill(q, w, seq_lens, block_table, request_ids, seq_lens_host=...)  # handoff
    top = idx.decode_step(q, w, seq_lens, block_table, request_ids, seq_lens_host=...)
    idx.finish(request_ids)                                   # when requests leave the batch
    tops = idx.context_topk(q_ctx, w_ctx, block_table, token_counts, starts=...)  # every prefill
                                                              # token's selection (eager)

``q`` [B * next_n, H, D] (float: rotated and quantized here; or uint8 e4m3 codes with the query
scales already folded into ``w``), ``w`` [B * next_n, H] head weights, ``seq_lens`` [B] the rows'
token lengths including the tokens being decoded, ``block_table`` int32 [B, pages] the engine's
page table of the indexer cache, ``request_ids`` one hashable id per batch row (the state follows
the id, not the row), ``seq_lens_host`` the same lengths as host ints (engines keep them for
scheduling; routing uses them, so a CUDA ``seq_lens`` needs them). Returns int32 top-K indices
[B * next_n, K] into each row's compressed keys, ``-1`` past a row's length.

``capture(batch, next_n, max_n)`` returns a ``CapturedStep`` whose ``replay(...)`` runs the same
step from a CUDA graph: every buffer is allocated before capture, the tier is fixed for the length
bucket, and calling the step under capture without those buffers raises.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton

from flashrt_dsv4_indexer import reference, routing, topk_stage
from flashrt_dsv4_indexer.config import IndexerConfig
from flashrt_dsv4_indexer.key_cache import PagedKeyCache, hadamard_rotate, quantize_queries
from flashrt_dsv4_indexer.logits import Emissions, paged_indexer_logits
from flashrt_dsv4_indexer.state import RequestState


@dataclass
class _Buffers:
    lengths: torch.Tensor
    logits: torch.Tensor
    emissions: dict[str, Emissions]
    values: torch.Tensor
    indices: torch.Tensor
    slot_index: torch.Tensor


class Indexer:
    def __init__(
        self,
        config: IndexerConfig,
        cache: PagedKeyCache,
        *,
        max_requests: int = 1024,
        rotate: bool = True,
        policy: routing.RoutingPolicy = routing.DEFAULT_POLICY,
        logits_backend: str = "auto",
        topk_backend: str = "auto",
    ) -> None:
        if cache.head_dim != config.head_dim or cache.key_format != config.key_format:
            raise ValueError("Indexer: the cache's head_dim / key_format must match the config")
        self.config, self.cache, self.rotate, self.policy = config, cache, rotate, policy
        self.logits_backend, self.topk_backend = logits_backend, topk_backend
        self.device = cache.device
        self.state = RequestState(max_requests, config.topk, self.device)
        self.seg_cap = 2 * config.topk
        self._buffers: dict[tuple[int, int, int], _Buffers] = {}
        self.last_tier = "none"
        self.last_buffers: _Buffers | None = None

    # keys ---------------------------------------------------------------------------------------
    def write_keys(self, block_table, rows, positions, keys) -> None:
        """Rotate (when ``rotate``), quantize and write compressed keys into the paged cache."""
        self.cache.write(
            block_table, rows, positions, hadamard_rotate(keys) if self.rotate else keys
        )

    # the step -----------------------------------------------------------------------------------
    def _pages(self, block_table: torch.Tensor, live_n: Sequence[int]) -> int:
        n = routing.bucket_length(max(live_n, default=1))
        return min(block_table.shape[1], triton.cdiv(n, self.cache.block_size))

    def reserve(self, batch: int, next_n: int, pages: int) -> _Buffers:
        key = (batch, next_n, pages)
        if key in self._buffers:
            return self._buffers[key]
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"Indexer: buffers for batch={batch}, next_n={next_n}, pages={pages} were not "
                "allocated before CUDA-graph capture; call capture() (or reserve()) first"
            )
        rows, width, k, dev = (
            batch * next_n,
            pages * self.cache.block_size,
            self.config.topk,
            self.device,
        )
        em = {
            "none": None,
            "rungs": None,
            "counts": Emissions.allocate(rows, width, 1, dev, candidate_list=False),
            "list": Emissions.allocate(rows, width, self.seg_cap, dev, block_max=False),
        }
        buf = _Buffers(
            lengths=torch.zeros(rows, dtype=torch.int32, device=dev),
            logits=torch.empty(rows, width, device=dev),
            emissions=em,
            values=torch.empty(rows, k, device=dev),
            indices=torch.empty(rows, k, dtype=torch.int32, device=dev),
            slot_index=torch.zeros(batch, dtype=torch.int64, device=dev),
        )
        self._buffers[key] = buf
        return buf

    def _host_lengths(self, seq_lens, seq_lens_host) -> list[int]:
        if seq_lens_host is not None:
            return [int(x) for x in seq_lens_host]
        if seq_lens.device.type != "cpu":
            raise ValueError(
                "Indexer: seq_lens_host (host ints) is required when seq_lens is on the device: "
                "routing uses the rows' live lengths and must not synchronize"
            )
        return [int(x) for x in seq_lens.tolist()]

    def _query_codes(self, q, weights) -> tuple[torch.Tensor, torch.Tensor]:
        """e4m3 query codes and fp32 head weights with the query scales folded in (``q`` float:
        rotated when ``rotate`` and quantized per row here; uint8: codes already)."""
        if q.dtype == torch.uint8:
            return q, weights.float().contiguous()
        return quantize_queries(hadamard_rotate(q) if self.rotate else q, weights)

    def _core(self, q, weights, seq_lens, block_table, buf: _Buffers, next_n: int, tier: str):
        """The device work of one step (capturable): lengths, logits + emissions, top-K, state."""
        cfg, batch = self.config, block_table.shape[0]
        buf.lengths.copy_(reference.row_lengths(seq_lens.to(buf.lengths.device), next_n,
                                                cfg.compress_ratio))  # fmt: skip
        q_codes, w = self._query_codes(q, weights)
        slot = buf.slot_index
        em = buf.emissions[tier]
        if em is not None:
            em.lines.copy_(self.state.lines[slot].repeat_interleave(next_n, 0))
            if em.list_indices is not None:
                em.list_indices.fill_(-1)
        pages = buf.logits.shape[1] // self.cache.block_size
        paged_indexer_logits(
            q_codes, w, self.cache.codes, self.cache.scales, block_table[:, :pages],
            buf.lengths, key_format=cfg.key_format, out=buf.logits, emissions=em,
            fill_padding=False, backend=self.logits_backend,
        )  # fmt: skip
        prev = self.state.prev[slot].repeat_interleave(next_n, 0) if tier != "none" else None
        topk_stage.select(
            buf.logits, cfg.topk, buf.lengths, tier=tier, prev_indices=prev, emissions=em,
            out_values=buf.values, out_indices=buf.indices, backend=self.topk_backend,
        )  # fmt: skip
        last = torch.arange(batch, device=slot.device) * next_n + next_n - 1
        counts = None
        if tier == "counts":
            counts = em.counts[last]
        elif tier == "list":
            counts = em.list_claims[last].cumsum(1).to(torch.int32)
        self.state.update(slot, buf.values[last], buf.indices[last], counts)
        return buf.indices

    def _step(self, q, weights, seq_lens, block_table, request_ids, seq_lens_host, force_tier):
        batch = len(request_ids)
        if block_table.shape[0] != batch or q.shape[0] % max(batch, 1):
            raise ValueError("Indexer: block_table rows and q rows must match request_ids")
        next_n = q.shape[0] // batch
        host = self._host_lengths(seq_lens, seq_lens_host)
        live_n = [self.config.n_keys(s) for s in host]
        slots = self.state.slots(request_ids)
        tier = force_tier or routing.plan_tier(
            live_n, warm_rows=self.state.warm_count(slots), policy=self.policy
        )
        buf = self.reserve(batch, next_n, self._pages(block_table, live_n))
        buf.slot_index.copy_(torch.tensor(slots, dtype=torch.int64), non_blocking=False)
        self.last_tier, self.last_buffers = tier, buf
        out = self._core(q, weights, seq_lens, block_table, buf, next_n, tier)
        self.state.mark_warm(slots)
        return out.clone()

    def prefill(self, q, weights, seq_lens, block_table, request_ids, *, seq_lens_host=None):
        """The prefill -> decode handoff: select for each request's last context token (``q`` [B,
        H, D]) and seed its state from that selection. Ids seen before start over."""
        self.state.finish(request_ids)
        return self._step(q, weights, seq_lens, block_table, request_ids, seq_lens_host, "none")

    def decode_step(self, q, weights, seq_lens, block_table, request_ids, *, seq_lens_host=None):
        """One decode step; see the module docstring."""
        return self._step(q, weights, seq_lens, block_table, request_ids, seq_lens_host, None)

    def finish(self, request_ids: Sequence[object]) -> None:
        self.state.finish(request_ids)

    def context_topk(self, q, weights, block_table, token_counts: Sequence[int], *,
                     starts: Sequence[int] | None = None,
                     chunk_tokens: int | None = None) -> torch.Tensor:  # fmt: skip
        """The selection of every token of a (chunked) prefill, for the sparse attention over the
        context. ``q`` [T, H, D] / ``weights`` [T, H]: the batch's prefill tokens packed request
        after request, ``token_counts[r]`` of request ``r`` at positions ``starts[r]`` (default 0)
        .. ``starts[r] + token_counts[r] - 1`` of its sequence; ``block_table`` int32 [R, pages]
        the requests' pages, the compressed keys of every position up to the chunk's end written.
        The token at position ``p`` selects among its request's first ``(p + 1) //
        compress_ratio`` keys, the selection a decode step (tier ``none``) makes for a row of
        ``p + 1`` tokens with that query. Returns int32 [T, K], ``-1`` past a token's keys.

        Eager: the packing is host ints. The queries are quantized and the logits computed
        ``chunk_tokens`` rows at a time (default: about 256 MB of fp32 logits), so a long prompt
        never holds more than a chunk's. The published state is not touched: ``prefill`` seeds
        it at the handoff."""
        cfg, cache, dev = self.config, self.cache, self.device
        counts = [int(c) for c in token_counts]
        starts = [0] * len(counts) if starts is None else [int(s) for s in starts]
        total = sum(counts)
        if len(starts) != len(counts) or block_table.shape[0] != len(counts):
            raise ValueError(
                "Indexer.context_topk: token_counts, starts and block_table rows must agree "
                f"(got {len(counts)}, {len(starts)} and {block_table.shape[0]})"
            )
        if min(counts + starts, default=0) < 0:
            raise ValueError("Indexer.context_topk: token_counts and starts must be >= 0")
        if chunk_tokens is not None and chunk_tokens < 1:
            raise ValueError(f"Indexer.context_topk: chunk_tokens must be >= 1, got {chunk_tokens}")
        if q.shape[0] != total or weights.shape[0] != total:
            raise ValueError(
                f"Indexer.context_topk: q and weights need sum(token_counts) = {total} rows, got "
                f"{q.shape[0]} and {weights.shape[0]}"
            )
        out = torch.full((total, cfg.topk), -1, dtype=torch.int32, device=dev)
        if total == 0:
            return out
        row_of = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
        seq = torch.cat(
            [torch.arange(s + 1, s + c + 1) for s, c in zip(starts, counts, strict=True)]
        )
        n_max = max(cfg.n_keys(s + c) for s, c in zip(starts, counts, strict=True))
        if n_max > block_table.shape[1] * cache.block_size:
            raise ValueError(
                f"Indexer.context_topk: a token sees {n_max} keys but block_table holds "
                f"{block_table.shape[1]} pages of {cache.block_size}"
            )
        pages = max(1, triton.cdiv(n_max, cache.block_size))
        width = pages * cache.block_size
        chunk = chunk_tokens or max(1, (256 << 20) // (4 * width))
        logits = torch.empty(min(chunk, total), width, device=dev)
        values = torch.empty(min(chunk, total), cfg.topk, device=dev)
        for a in range(0, total, chunk):
            b = min(total, a + chunk)
            rows = row_of[a:b].to(dev)
            lengths = reference.row_lengths(seq[a:b].to(dev), 1, cfg.compress_ratio)
            q_codes, w = self._query_codes(q[a:b], weights[a:b])  # per row: chunks change nothing
            paged_indexer_logits(
                q_codes, w, cache.codes, cache.scales,
                block_table.index_select(0, rows)[:, :pages].contiguous(), lengths,
                key_format=cfg.key_format, out=logits[: b - a], fill_padding=False,
                backend=self.logits_backend,
            )  # fmt: skip
            topk_stage.select(logits[: b - a], cfg.topk, lengths, out_values=values[: b - a],
                              out_indices=out[a:b], backend=self.topk_backend)  # fmt: skip
        return out

    def capture(self, batch: int, next_n: int, max_n: int, q_dtype=torch.uint8) -> CapturedStep:
        return CapturedStep(self, batch, next_n, max_n, q_dtype)


class CapturedStep:
    """One decode step as a CUDA graph for ``batch`` rows of ``next_n`` tokens and at most
    ``max_n`` live compressed keys (its length bucket fixes the tier)."""

    def __init__(self, indexer: Indexer, batch: int, next_n: int, max_n: int, q_dtype) -> None:
        ix, cfg = indexer, indexer.config
        self.indexer, self.batch, self.next_n = ix, batch, next_n
        self.n_bucket = routing.bucket_length(max_n)
        self.pages = triton.cdiv(self.n_bucket, ix.cache.block_size)
        self.tier = routing.plan_bucket(batch, self.n_bucket, ix.policy)
        rows, dev = batch * next_n, ix.device
        self.q = torch.zeros(rows, cfg.n_heads, cfg.head_dim, dtype=q_dtype, device=dev)
        self.weights = torch.zeros(rows, cfg.n_heads, device=dev)
        self.seq_lens = torch.zeros(batch, dtype=torch.int32, device=dev)
        self.block_table = torch.zeros(batch, self.pages, dtype=torch.int32, device=dev)
        self.buf = ix.reserve(batch, next_n, self.pages)
        saved = _snapshot(ix.state)
        self.buf.slot_index.fill_(ix.state.max_requests - 1)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self._run()  # compile / warm up outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = self._run()
        _restore(ix.state, saved)

    def _run(self):
        return self.indexer._core(self.q, self.weights, self.seq_lens, self.block_table,
                                  self.buf, self.next_n, self.tier)  # fmt: skip

    def replay(self, q, weights, seq_lens, block_table, request_ids, *, seq_lens_host):
        ix = self.indexer
        if len(request_ids) != self.batch or q.shape[0] != self.batch * self.next_n:
            raise ValueError("CapturedStep: batch / next_n differ from the captured ones")
        live = [ix.config.n_keys(int(s)) for s in seq_lens_host]
        if max(live) > self.n_bucket:
            raise ValueError(f"CapturedStep: a row has {max(live)} keys > bucket {self.n_bucket}")
        slots = ix.state.slots(request_ids)
        self.q.copy_(q)
        self.weights.copy_(weights)
        self.seq_lens.copy_(seq_lens)
        cols = min(self.pages, block_table.shape[1])  # pages past every row's end are never read
        self.block_table[:, :cols].copy_(block_table[:, :cols])
        self.buf.slot_index.copy_(torch.tensor(slots, dtype=torch.int64))
        self.graph.replay()
        ix.state.mark_warm(slots)
        return self.out


def _snapshot(state: RequestState):
    return [
        t.clone()
        for t in (state.valid, state.kth, state.top, state.lines, state.counts, state.prev)
    ]


def _restore(state: RequestState, saved) -> None:
    for t, s in zip(
        (state.valid, state.kth, state.top, state.lines, state.counts, state.prev),
        saved,
        strict=True,
    ):
        t.copy_(s)
