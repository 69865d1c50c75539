"""``flashrt dsv4-indexer bench``: one decode step of the indexer (logits + top-K) per cell.

Per (preset, B, N) cell, in one run: ours = the paged FP8 logits kernel with the routed tier's
emissions + the routed top-K (flashrt-kernels' hint consumers); (b) our logits without emissions +
the hint-free top-K; (a) what a user writes in torch: gather and dequantize the paged keys, einsum,
ReLU, weighted head sum, ``torch.topk``. Rows have independent live lengths in [3N/4, N] and their
own drifting queries; the state (previous indices, lines, counts) comes from three eager closed-loop
steps before timing, and the timed step's queries drift once more (the hint is the previous step's
selection, not the timed step's own). Key pages are drawn (per row, in random order) from a pool of
distinct pages so the largest cells fit the benchmark's time; every row has its own queries and
lengths. Each timed callable is replayed from a CUDA graph (``benchmarking.time_graph_us``). Where
the routed tier is ``none``, the routed top-K is the hint-free call itself (one timing for both).

Extra columns: the ``rungs`` tier (the previous step's indices as the hint) on every cell whose
rows are long enough for a hint (routing's ``min_assist_n``), whatever the routing picked there
(``topk_rungs_us``, ``x_topk_rungs`` = hint-free / rungs); the ``counts`` tier (its emission and
its Triton consumer) where ``B * N >= 4M`` (it is off by default: measured, not routed); the MXFP4 logits kernel (v4-flash cells: the kernel does
not depend on the preset's K); and at B = 1 (v4-flash), flashrt-kernels' Triton hint-free select on
our logits, on ``randn`` rows of the same shape with our lengths, and without lengths (its own
benchmark's input), which tells the backend, the lengths and the score distribution apart.

``--prefill`` times ``Indexer.context_topk`` instead (every token of one 8k / 32k-token prompt,
v4-flash fp8 and v4-pro fp4, eager, CUDA events) against torch logits + ``torch.topk`` over the
same chunks (``prefill_row``).
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from flashrt_dsv4_indexer import config, routing, topk_stage
from flashrt_dsv4_indexer.indexer import Indexer
from flashrt_dsv4_indexer.key_cache import PagedKeyCache
from flashrt_dsv4_indexer.logits import paged_indexer_logits

BATCHES = (1, 4, 16, 64, 256)
LENGTHS = (8192, 32768, 131072, 262144)
POOL_KEYS = 1 << 20
TORCH_MAX_KEYS = 1 << 23  # (a) materializes [B, N, D] bf16 keys and [B, H, N] fp32 scores
DEVICE = "cuda"


def _cell(cfg, batch, n, gen, pool_cache):
    dev = DEVICE
    bs = cfg.block_size
    pages = n // bs
    lens_n = [int(n * (0.75 + 0.25 * torch.rand(1, generator=gen).item())) for _ in range(batch)]
    seq_host = [m * cfg.compress_ratio for m in lens_n]
    pool_pages = pool_cache.num_blocks
    bt = torch.randint(0, pool_pages, (batch, pages), generator=gen).int().to(dev)
    ix = Indexer(cfg, pool_cache, max_requests=batch, rotate=False)
    q = torch.randn(batch, cfg.n_heads, cfg.head_dim, generator=gen).to(dev)
    w = (torch.rand(batch, cfg.n_heads, generator=gen) * cfg.n_heads**-0.5).to(dev)
    ids = list(range(batch))
    seq = torch.tensor(seq_host, dtype=torch.int32, device=dev)
    ix.prefill(q, w, seq, bt, ids, seq_lens_host=seq_host)
    for _ in range(3):  # closed-loop steps: drifting queries, same rows
        q = 0.95 * q + 0.31 * torch.randn_like(q)
        ix.decode_step(q, w, seq, bt, ids, seq_lens_host=seq_host)
    q = 0.95 * q + 0.31 * torch.randn_like(q)  # the timed step: one more drift
    return ix, q, w, seq, seq_host, bt, lens_n


def _torch_step(cache, bt, q, w, lengths, k, n):
    """(a): dequantized torch logits + torch.topk."""
    codes = cache.codes[bt.long()].flatten(1, 2)  # [B, N, D]
    scale = cache.scales[bt.long()].flatten(1, 2)
    keys = codes.view(torch.float8_e4m3fn).to(torch.bfloat16) * scale[..., None].to(torch.bfloat16)
    s = torch.einsum("bhd,bnd->bhn", q.to(torch.bfloat16), keys).float()
    logits = (s.relu() * w[:, :, None]).sum(1)
    pos = torch.arange(n, device=q.device)
    logits = logits.masked_fill(pos[None, :] >= lengths[:, None], float("-inf"))
    return torch.topk(logits, k, dim=1)


COUNTS_MIN_WORK = 1 << 22  # cells where the counts tier is timed (B * N)


def _time_cell(cfg, pool, batch, n, gen, row, pool_fp4=None):
    from flashrt_dsv4_indexer.key_cache import quantize_queries
    from flashrt_kernels.benchmarking import floor_us, time_graph_us

    ix, q, w, seq, seq_host, bt, lens_n = _cell(cfg, batch, n, gen, pool)
    buf = ix.last_buffers
    tier = ix.last_tier
    em = buf.emissions[tier]
    lengths_t = buf.lengths
    k = cfg.topk
    qc, wf = quantize_queries(q, w)
    slot = buf.slot_index
    prev = ix.state.prev[slot].contiguous()
    logits = buf.logits
    bt_p = bt[:, : logits.shape[1] // cfg.block_size]
    if em is not None:
        em.lines.copy_(ix.state.lines[slot])

    def logits_emit(em=em, cache=pool, fmt="fp8"):
        if em is not None and em.list_indices is not None:
            em.list_indices.fill_(-1)
        paged_indexer_logits(qc, wf, cache.codes, cache.scales, bt_p, lengths_t, key_format=fmt,
                             out=logits, emissions=em, fill_padding=False)  # fmt: skip

    logits_emit()
    vo = torch.empty(batch, k, device=DEVICE)
    io = torch.empty(batch, k, dtype=torch.int32, device=DEVICE)

    def topk_call(tier_, em_=None, scores=logits, lengths=lengths_t, backend="auto"):
        def call():
            topk_stage.select(scores, k, lengths, tier=tier_, prev_indices=prev, emissions=em_,
                              out_values=vo, out_indices=io, backend=backend)  # fmt: skip

        return call

    t_le = time_graph_us([logits_emit])
    t_lp = time_graph_us([lambda: logits_emit(None)]) if em is not None else t_le
    t_tn = time_graph_us([topk_call("none")])
    t_tr = time_graph_us([topk_call(tier, em)]) if tier != "none" else t_tn
    if n >= routing.DEFAULT_POLICY.min_assist_n:  # rungs wherever a hint can be taken
        t_rg = t_tr if tier == "rungs" else time_graph_us([topk_call("rungs")])
        row.update(topk_rungs_us=t_rg, x_topk_rungs=t_tn / t_rg)
    keys_read = sum(lens_n)
    fl = floor_us(keys_read * cfg.key_bytes() + batch * n * 4)
    row.update(tier=tier, logits_us=t_le, logits_plain_us=t_lp, topk_routed_us=t_tr,
               topk_hintfree_us=t_tn, step_us=t_le + t_tr,
               x_topk_b=t_tn / t_tr, x_step_b=(t_lp + t_tn) / (t_le + t_tr),
               floor_us=fl, logits_floor_frac=fl / t_lp)  # fmt: skip
    if batch * n >= COUNTS_MIN_WORK:  # the counts tier: measured, off by default
        em_c = buf.emissions["counts"]
        em_c.lines.copy_(ix.state.lines[slot])
        t_lc = time_graph_us([lambda: logits_emit(em_c)])
        t_tc = time_graph_us([topk_call("counts", em_c)])
        row.update(logits_counts_us=t_lc, topk_counts_us=t_tc, x_topk_counts=t_tn / t_tc)
    if pool_fp4 is not None:
        t_l4 = time_graph_us([lambda: logits_emit(None, pool_fp4, "fp4")])
        fl4 = floor_us(keys_read * cfg.with_(key_format="fp4").key_bytes() + batch * n * 4)
        row.update(logits_fp4_us=t_l4, fp4_floor_us=fl4, fp4_floor_frac=fl4 / t_l4)
    if batch == 1 and pool_fp4 is not None:  # why the Triton select differs from its benchmark
        logits_emit()
        rnd = torch.randn(
            logits.shape, device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(n)
        )
        row.update(
            topk_triton_us=time_graph_us([topk_call("none", backend="triton")]),
            topk_triton_randn_len_us=time_graph_us([topk_call("none", scores=rnd,
                                                              backend="triton")]),
            topk_triton_randn_us=time_graph_us([topk_call("none", scores=rnd, lengths=None,
                                                          backend="triton")]),
        )  # fmt: skip
    if batch * n <= TORCH_MAX_KEYS:
        lt = lengths_t.long()
        t_a = time_graph_us([lambda: _torch_step(pool, bt_p, qc.view(torch.float8_e4m3fn).float(), wf, lt, k, logits.shape[1])])  # fmt: skip
        row.update(torch_step_us=t_a, x_step_a=t_a / (t_le + t_tr))
    return row


def _pool(cfg, fmt):
    """A cache of POOL_KEYS distinct keys (clustered around 64 centres), ``fmt`` codes."""
    pool = PagedKeyCache(POOL_KEYS // cfg.block_size, cfg.block_size, cfg.head_dim, fmt, DEVICE)
    gen = torch.Generator(DEVICE).manual_seed(1)
    for c0 in range(0, POOL_KEYS, 1 << 18):
        keys = torch.randn(1 << 18, cfg.head_dim, device=DEVICE, generator=gen)
        keys += 2.0 * torch.randn(64, cfg.head_dim, device=DEVICE, generator=gen)[
            torch.randint(0, 64, (1 << 18,), device=DEVICE, generator=gen)]  # fmt: skip
        codes, scales = pool.quantize(keys)
        blk = slice(c0 // cfg.block_size, (c0 + (1 << 18)) // cfg.block_size)
        pool.codes[blk] = codes.view(-1, cfg.block_size, *pool.codes.shape[2:])
        pool.scales[blk] = scales.view(-1, cfg.block_size, *pool.scales.shape[2:])
    return pool


def run(quick: bool = False, budget_s: float = 150.0, on_row=None) -> list[dict]:
    """Result rows (see the module docstring); ``on_row(rows)`` is called after every cell."""
    rows = []
    t_start = time.time()
    gen = torch.Generator().manual_seed(0)
    presets = ("v4-flash", "v4-pro")
    batches = BATCHES[:4] if quick else BATCHES
    lengths = LENGTHS[:3] if quick else LENGTHS
    for name in presets:
        cfg = config.preset(name)
        pool = _pool(cfg, "fp8")
        pool_fp4 = _pool(cfg, "fp4") if name == "v4-flash" else None
        for batch in batches:
            for n in lengths:
                row = {"preset": name, "B": batch, "N": n}
                if time.time() - t_start > budget_s:
                    row["tier"] = "skipped (time budget)"
                    rows.append(row)
                    continue
                rows.append(_time_cell(cfg, pool, batch, n, gen, row, pool_fp4))
                if on_row is not None:
                    on_row(rows)

        del pool, pool_fp4
        torch.cuda.empty_cache()
    return rows


PREFILL_TOKENS = (8192, 32768)  # prompt lengths of the prefill rows (compressed keys: / 4)


def _events_ms(fn, reps: int = 5) -> float:
    """Median wall time of an eager call (CUDA events around it), after one warm-up call."""
    fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def prefill_row(cfg, tokens: int, device: str = DEVICE, seed: int = 0,
                backend: str = "auto") -> dict:  # fmt: skip
    """``Indexer.context_topk`` for one prompt of ``tokens`` tokens (every token's selection)
    against (a): the prompt's keys dequantized once, torch logits from the same e4m3 query codes
    with each token's causal key count, ``torch.topk``, 256 MB of scores at a time.
    ``tokens_equal_to_torch``: tokens whose selection equals (a)'s. The logits differ by the
    kernel's rounding (fp8: Hopper's fp8 MMA accumulates with a reduced mantissa, within the
    faithful contract's 2^-8 of the logits' magnitude; fp4: fp32 rounding), so a difference is a
    near-tie at the K-th logit, counted, not an error."""
    from flashrt_dsv4_indexer.key_cache import quantize_queries

    gen = torch.Generator().manual_seed(seed)
    n = cfg.n_keys(tokens)
    pages = -(-n // cfg.block_size)
    cache = PagedKeyCache(pages, cfg.block_size, cfg.head_dim, cfg.key_format, device)
    ix = Indexer(cfg, cache, max_requests=4, rotate=False, logits_backend=backend,
                 topk_backend=backend)  # fmt: skip
    table = torch.arange(pages, dtype=torch.int32, device=device)[None]
    keys = torch.randn(n, cfg.head_dim, generator=gen).to(device)
    ix.write_keys(table, torch.zeros(n, dtype=torch.long, device=device),
                  torch.arange(n, device=device), keys)  # fmt: skip
    q = torch.randn(tokens, cfg.n_heads, cfg.head_dim, generator=gen).to(device)
    w = (torch.rand(tokens, cfg.n_heads, generator=gen) * cfg.n_heads**-0.5).to(device)
    qc, wf = quantize_queries(q, w)
    qf = qc.view(torch.float8_e4m3fn).float()
    k_deq = ix.cache.dequantize_row(table[0], n).float()  # [n, D]
    seen = torch.arange(1, tokens + 1, device=device) // cfg.compress_ratio
    chunk = max(1, (256 << 20) // (4 * n * cfg.n_heads))
    pos = torch.arange(n, device=device)

    def torch_prefill():
        out = []
        for a in range(0, tokens, chunk):
            b = min(tokens, a + chunk)
            s = torch.einsum("thd,nd->thn", qf[a:b], k_deq).relu()
            logits = (s * wf[a:b, :, None]).sum(1)
            logits = logits.masked_fill(pos[None, :] >= seen[a:b, None], float("-inf"))
            out.append(torch.topk(logits, min(cfg.topk, n), dim=1).indices)
        return torch.cat(out)

    def ours_prefill():
        return ix.context_topk(qc, wf, table, [tokens])

    row = {"preset": cfg.name, "format": cfg.key_format, "tokens": tokens, "keys": n,
           "K": cfg.topk}  # fmt: skip
    if device == "cuda":
        t_ours, t_torch = _events_ms(ours_prefill), _events_ms(torch_prefill)
        row.update(ours_ms=t_ours, torch_ms=t_torch, x_torch=t_torch / t_ours,
                   ours_us_per_token=1000 * t_ours / tokens)  # fmt: skip
    want = torch_prefill()
    want = torch.where(want < seen[:, None], want, n).sort(1).values  # valid first, ascending
    got = ours_prefill()[:, : want.shape[1]].long()
    got = torch.where(got >= 0, got, n)  # pads (-1, at the end) as past every key
    row["tokens_equal_to_torch"] = int((got == want).all(1).sum())
    return row


def geomean(xs) -> float:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def summary(rows: list[dict]) -> list[dict]:
    done = [r for r in rows if "x_topk_b" in r]
    return [{
        "cells": len(done),
        "topk_routed_vs_b_geomean": geomean(r["x_topk_b"] for r in done),
        "topk_routed_vs_b_min": min((r["x_topk_b"] for r in done), default=float("nan")),
        "step_vs_a_geomean": geomean(r.get("x_step_a") for r in done),
        "logits_floor_frac_min_where_floor_ge_10us": min(
            (r["logits_floor_frac"] for r in done if r["floor_us"] >= 10), default=float("nan")),
        "logits_floor_frac_geomean_where_floor_ge_10us": geomean(
            r["logits_floor_frac"] for r in done if r["floor_us"] >= 10),
        "fp4_floor_frac_geomean_where_floor_ge_10us": geomean(
            r["fp4_floor_frac"] for r in done if r.get("fp4_floor_us", 0) >= 10),
        "topk_counts_vs_b_geomean": geomean(r.get("x_topk_counts") for r in done),
        "topk_rungs_vs_b_geomean": geomean(r.get("x_topk_rungs") for r in done),
    }]  # fmt: skip


def main(argv=None) -> int:
    from flashrt_kernels.benchmarking import markdown_table, write_results

    ap = argparse.ArgumentParser(prog="flashrt dsv4-indexer bench")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=None, help="directory for dsv4-indexer.json / .md")
    ap.add_argument("--budget-s", type=float, default=150.0)
    ap.add_argument("--prefill", action="store_true",
                    help="time Indexer.context_topk (every prompt token's selection) instead")  # fmt: skip
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("dsv4-indexer bench needs a CUDA device")
        return 1
    if args.prefill:
        rows = [prefill_row(config.preset(p).with_(key_format=f), t)
                for p, f in (("v4-flash", "fp8"), ("v4-pro", "fp4")) for t in PREFILL_TOKENS]  # fmt: skip
        print(markdown_table(rows))
        if args.out:
            write_results("dsv4-indexer-prefill", rows, args.out)
        return 0

    def save(rows):
        if args.out:
            write_results("dsv4-indexer", rows, args.out)
        print(rows[-1], flush=True)

    rows = run(args.quick, args.budget_s, save)
    print(markdown_table(rows))
    print(markdown_table(summary(rows)))
    if args.out:
        write_results("dsv4-indexer-summary", summary(rows), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
