"""``flashrt dsv4-indexer bench``: one decode step of the indexer (logits + top-K) per cell.

Per (preset, B, N) cell, in one run: ours = the paged FP8 logits kernel with the routed tier's
emissions + the routed top-K (flashrt-kernels' hint consumers); (b) our logits without emissions +
the hint-free top-K; (a) what a user writes in torch: gather and dequantize the paged keys, einsum,
ReLU, weighted head sum, ``torch.topk``. Rows have independent live lengths in [3N/4, N] and their
own drifting queries; the state (previous indices, lines, counts) comes from three eager closed-loop
steps before timing. Key pages are drawn (per row, in random order) from a pool of distinct
pages so the largest cells fit the benchmark's time; every row has its own queries and lengths.
Each timed callable is replayed from a CUDA graph (``benchmarking.time_graph_us``).
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from flashrt_dsv4_indexer import config, topk_stage
from flashrt_dsv4_indexer.indexer import Indexer
from flashrt_dsv4_indexer.key_cache import PagedKeyCache, quantize_fp8_rows
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


def _time_cell(cfg, pool, batch, n, gen, row):
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

    def logits_emit(em=em):
        if em is not None and em.list_indices is not None:
            em.list_indices.fill_(-1)
        paged_indexer_logits(qc, wf, pool.codes, pool.scales, bt_p, lengths_t,
                             out=logits, emissions=em, fill_padding=False)  # fmt: skip

    def logits_plain():
        paged_indexer_logits(qc, wf, pool.codes, pool.scales, bt_p, lengths_t,
                             out=logits, fill_padding=False)  # fmt: skip

    logits_emit()
    vo = torch.empty(batch, k, device=DEVICE)
    io = torch.empty(batch, k, dtype=torch.int32, device=DEVICE)

    def routed(em=em, tier=tier):
        topk_stage.select(logits, k, lengths_t, tier=tier, prev_indices=prev,
                          emissions=em, out_values=vo, out_indices=io)  # fmt: skip

    def hint_free():
        topk_stage.select(logits, k, lengths_t, tier="none", out_values=vo,
                          out_indices=io)  # fmt: skip

    t_le = time_graph_us([logits_emit])
    t_lp = time_graph_us([logits_plain])
    t_tr = time_graph_us([routed])
    t_tn = time_graph_us([hint_free])
    keys_read = sum(lens_n)
    fl = floor_us(keys_read * cfg.key_bytes() + batch * n * 4)
    row.update(tier=tier, logits_us=t_le, logits_plain_us=t_lp, topk_routed_us=t_tr,
               topk_hintfree_us=t_tn, step_us=t_le + t_tr,
               x_topk_b=t_tn / t_tr, x_step_b=(t_lp + t_tn) / (t_le + t_tr),
               floor_us=fl, logits_floor_frac=fl / t_lp)  # fmt: skip
    if batch * n <= TORCH_MAX_KEYS:
        lt = lengths_t.long()
        t_a = time_graph_us([lambda: _torch_step(pool, bt_p, qc.view(torch.float8_e4m3fn).float(), wf, lt, k, logits.shape[1])])  # fmt: skip
        row.update(torch_step_us=t_a, x_step_a=t_a / (t_le + t_tr))
    return row


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
        pool = PagedKeyCache(
            POOL_KEYS // cfg.block_size, cfg.block_size, cfg.head_dim, "fp8", DEVICE
        )
        for c0 in range(0, POOL_KEYS, 1 << 18):
            keys = torch.randn(1 << 18, cfg.head_dim, device=DEVICE)
            keys += 2.0 * torch.randn(64, cfg.head_dim, device=DEVICE)[
                torch.randint(0, 64, (1 << 18,), device=DEVICE)]  # fmt: skip
            codes, scales = quantize_fp8_rows(keys)
            blk = slice(c0 // cfg.block_size, (c0 + (1 << 18)) // cfg.block_size)
            pool.codes[blk] = codes.view(-1, cfg.block_size, cfg.head_dim)
            pool.scales[blk] = scales.view(-1, cfg.block_size)
        for batch in batches:
            for n in lengths:
                row = {"preset": name, "B": batch, "N": n}
                if time.time() - t_start > budget_s:
                    row["tier"] = "skipped (time budget)"
                    rows.append(row)
                    continue
                rows.append(_time_cell(cfg, pool, batch, n, gen, row))
                if on_row is not None:
                    on_row(rows)

        torch.cuda.empty_cache()
    return rows


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
    }]  # fmt: skip


def main(argv=None) -> int:
    from flashrt_kernels.benchmarking import markdown_table, write_results

    ap = argparse.ArgumentParser(prog="flashrt dsv4-indexer bench")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=None, help="directory for dsv4-indexer.json / .md")
    ap.add_argument("--budget-s", type=float, default=150.0)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("dsv4-indexer bench needs a CUDA device")
        return 1

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
