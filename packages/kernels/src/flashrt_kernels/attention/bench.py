"""Attention benchmarks: ours vs ``torch.nn.functional.scaled_dot_product_attention`` in one run.

- decode q=1: B in {1, 4, 8, 16} x L in {2k, 8k, 32k}, shapes 16/2 and 32/8 heads, d=128;
- tree verification: 24 and 64 nodes with a per-row ancestor mask (SDPA gets the same mask), and
  our own q=1 time at the same B, L for the tree/q=1 ratio;
- vision: 44 windows of 64 patches (8 images x 352, d=80) vs SDPA over the windows batched as
  sequences, and 16 images x 720 patches (d=72) vs per-image SDPA;
- packed prefill vs the same rows padded to the longest through SDPA (with a mask);
- the query-invariant mode (``query_invariant=True``): q=1 and trees of 24 / 33 / 64 nodes, B in
  {1, 8}, L in {2k, 8k}, 16/2 heads, beside the default mode and SDPA in the same row.
A separate ``rope_qk`` benchmark times the fp32 vision rotary of q and k (from one q|k|v output)
against the torch composition it replaces.
The floor is one read of K and V (plus q and the output for vision / prefill) over the measured
copy bandwidth; ``floor_frac`` = floor / ours.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F

from flashrt_kernels.attention import reference
from flashrt_kernels.attention.gqa_kernels import launch_gqa_tiles
from flashrt_kernels.attention.invariant_kernels import launch_invariant
from flashrt_kernels.attention.properties import random_tree_mask
from flashrt_kernels.attention.rope_qk import rope_qk
from flashrt_kernels.attention.segmented import launch_segmented
from flashrt_kernels.attention.splits import workspace_numel
from flashrt_kernels.benchmarking import floor_us, rotation, time_graph_us
from flashrt_kernels.registry import register_benchmark

SHAPES = ((16, 2), (32, 8))
D = 128
DT = torch.bfloat16
DEVICE = "cuda"


def _decode_sets(bsz, length, n, hq, hkv, with_mask, config=None, invariant=False):
    """Input sets for ours ([B, cap, Hkv, d] pool layout) and SDPA ([B, H, L, d]); the workspace
    holds either mode's partials (``invariant``: both)."""
    total = length + n
    kv_bytes = 2 * bsz * total * hkv * D * DT.itemsize
    sets = []
    for s in range(rotation(kv_bytes, limit=16)):
        q = torch.randn(bsz, n, hq, D, dtype=DT, device=DEVICE)
        k = torch.randn(bsz, total, hkv, D, dtype=DT, device=DEVICE)
        v = torch.randn_like(k)
        mask = None
        if with_mask:
            mask = torch.stack([random_tree_mask(n, 8, 100 * s + b) for b in range(bsz)]).to(DEVICE)
        numel = workspace_numel(bsz, n, hq, hkv, D, total, config)
        if invariant:
            numel = max(numel, workspace_numel(bsz, n, hq, hkv, D, total, query_invariant=True))
        ws = torch.empty(numel, device=DEVICE)
        sets.append((q, k, v, mask, torch.empty_like(q), ws))
    cl = torch.full((bsz,), length, dtype=torch.int32, device=DEVICE)
    ql = torch.full((bsz,), n, dtype=torch.int32, device=DEVICE)
    return sets, cl, ql, kv_bytes


def _ours_decode(sets, cl, ql, config=None, invariant=False, bits=False):
    """Our launches over ``sets``, timed; ``bits``: tree masks as bit rows (mask mode 2)."""
    calls = []
    for q, k, v, mask, out, ws in sets:
        mode = 0 if mask is None else 2 if bits else 1
        m = mask
        if mask is not None:
            m = reference.pack_tree_mask(mask) if bits else mask.view(torch.uint8)

        def call(q=q, k=k, v=v, m=m, out=out, ws=ws, mode=mode):
            if invariant:
                launch_invariant(q, k, v, out, cl, ql, cache_rows=None, mask=m, mask_mode=mode,
                                 workspace=ws, scale=D**-0.5, config=config)  # fmt: skip
                return
            launch_gqa_tiles(q, k, v, out, cl, ql, q_starts=None, cache_rows=None, mask=m,
                             mask_mode=mode, q_max=q.shape[1], split=True, workspace=ws,
                             scale=D**-0.5, config=config)  # fmt: skip

        calls.append(call)
    return time_graph_us(calls)


def _sdpa_decode(sets, length):
    calls = []
    for q, k, v, mask, _, _ in sets:
        qs, ks, vs = q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous(), None
        vs = v.transpose(1, 2).contiguous()
        am = None
        if mask is not None:
            bsz, n = mask.shape[:2]
            am = torch.ones(bsz, 1, n, length + n, dtype=torch.bool, device=DEVICE)
            am[:, 0, :, length:] = mask
        calls.append(
            lambda qs=qs, ks=ks, vs=vs, am=am: F.scaled_dot_product_attention(
                qs, ks, vs, attn_mask=am, enable_gqa=True
            )
        )
    return time_graph_us(calls)


def _decode_rows(quick):
    rows = []
    for hq, hkv in SHAPES:
        for bsz in (1, 4, 8, 16):
            for length in (2048, 8192) if quick else (2048, 8192, 32768):
                sets, cl, ql, nbytes = _decode_sets(bsz, length - 1, 1, hq, hkv, False)
                t = _ours_decode(sets, cl, ql)
                ts = _sdpa_decode(sets, length - 1)
                fl = floor_us(nbytes)
                rows.append({"case": "decode q=1", "heads": f"{hq}/{hkv}", "B": bsz, "L": length,
                             "ours_us": t, "sdpa_us": ts, "x_sdpa": ts / t, "floor_us": fl,
                             "floor_frac": fl / t})  # fmt: skip
                del sets
    return rows


def _tree_rows(quick):
    rows = []
    cases = [(16, 2, L) for L in (2048, 8192, 32768)] + [(32, 8, 8192)]
    for hq, hkv, length in cases[:2] if quick else cases:
        bsz = 8
        sets1, cl1, ql1, _ = _decode_sets(bsz, length - 1, 1, hq, hkv, False)
        t1 = _ours_decode(sets1, cl1, ql1)
        del sets1
        for n in (24, 64):
            sets, cl, ql, nbytes = _decode_sets(bsz, length, n, hq, hkv, True)
            t = _ours_decode(sets, cl, ql)
            tb = _ours_decode(sets, cl, ql, bits=True)  # the same mask as bit rows
            ts = _sdpa_decode(sets, length)
            fl = floor_us(nbytes)
            rows.append({"case": f"tree {n} nodes", "heads": f"{hq}/{hkv}", "B": bsz, "L": length,
                         "ours_us": t, "sdpa_us": ts, "x_sdpa": ts / t, "floor_us": fl,
                         "floor_frac": fl / t, "ours_q1_us": t1, "tree_over_q1": t / t1,
                         "ours_bits_us": tb, "x_sdpa_bits": ts / tb})  # fmt: skip
            del sets
    return rows


def _vision_rows(config=None):
    rows = []
    for name, n_seg, seg, heads, d in (("vision windows 8x352", 44, 64, 16, 80),
                                       ("vision per-image 16x720", 16, 720, 16, 72)):  # fmt: skip
        t_tok = n_seg * seg
        nbytes = 4 * t_tok * heads * d * DT.itemsize
        flops = 4 * n_seg * seg * seg * heads * d
        cu = torch.arange(0, t_tok + 1, seg, dtype=torch.int32, device=DEVICE)
        sets = []
        for _ in range(rotation(nbytes, limit=16)):
            q, k, v = (torch.randn(t_tok, heads, d, dtype=DT, device=DEVICE) for _ in range(3))
            sets.append((q, k, v, torch.empty_like(q)))
        ours = [partial(launch_segmented, *x, cu, seg, d**-0.5, config) for x in sets]
        t = time_graph_us(ours)
        batched = []
        for q, k, v, _ in sets:
            qs, ks, vs = (x.view(n_seg, seg, heads, d).transpose(1, 2).contiguous()
                          for x in (q, k, v))  # fmt: skip
            batched.append(lambda qs=qs, ks=ks, vs=vs: F.scaled_dot_product_attention(qs, ks, vs))
        ts = time_graph_us(batched)
        row = {"case": name, "heads": f"{heads}/{heads}", "B": n_seg, "L": seg, "ours_us": t,
               "sdpa_us": ts, "x_sdpa": ts / t, "floor_us": floor_us(nbytes),
               "floor_frac": floor_us(nbytes) / t, "tflops": flops / t * 1e-6}  # fmt: skip
        rows.append(row)
    return rows


def _prefill_rows():
    rows = []
    new = [392, 120, 40, 352, 600, 88, 200, 1000]
    for prefix in ([0] * 8, [0, 2000, 4000, 300, 0, 1000, 3000, 50]):
        for hq, hkv in SHAPES:
            bsz = len(new)
            cap = max(p + n for p, n in zip(prefix, new, strict=True))
            t_tok = sum(new)
            cu = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], dtype=torch.int32,
                              device=DEVICE)  # fmt: skip
            cl = torch.tensor(prefix, dtype=torch.int32, device=DEVICE)
            q = torch.randn(t_tok, hq, D, dtype=DT, device=DEVICE)
            k = torch.randn(bsz, cap, hkv, D, dtype=DT, device=DEVICE)
            v = torch.randn_like(k)
            out = torch.empty_like(q)
            ours = [partial(launch_gqa_tiles, q, k, v, out, cl, None, q_starts=cu,
                            cache_rows=None, mask=None, mask_mode=0, q_max=max(new),
                            split=False, workspace=None, scale=D**-0.5)]  # fmt: skip
            t = time_graph_us(ours)
            mx = max(new)
            qp = torch.zeros(bsz, hq, mx, D, dtype=DT, device=DEVICE)
            for b in range(bsz):
                qp[b, :, : new[b]] = q[int(cu[b]) : int(cu[b + 1])].transpose(0, 1)
            kp, vp = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
            qi = torch.arange(mx, device=DEVICE)[None, :, None]
            pos = torch.arange(cap, device=DEVICE)[None, None, :]
            am = (pos <= cl[:, None, None] + qi)[:, None]
            sdpa = partial(
                F.scaled_dot_product_attention, qp, kp, vp, attn_mask=am, enable_gqa=True
            )
            ts = time_graph_us([sdpa])
            live = sum(p + n for p, n in zip(prefix, new, strict=True))
            nbytes = (2 * live * hkv + 2 * t_tok * hq) * D * DT.itemsize
            rows.append({"case": "packed prefill" + (" +prefix" if any(prefix) else ""),
                         "heads": f"{hq}/{hkv}", "B": bsz, "L": cap, "ours_us": t, "sdpa_us": ts,
                         "x_sdpa": ts / t, "floor_us": floor_us(nbytes),
                         "floor_frac": floor_us(nbytes) / t})  # fmt: skip
    return rows


def _invariant_rows(quick, config=None):
    """Query-invariant mode vs the default mode and SDPA on the same inputs (Qwen2.5-VL-3B: 16/2,
    d=128). q=1 rows have L - 1 cached tokens and the new one; tree rows L cached plus the nodes."""
    rows = []
    hq, hkv = 16, 2
    for bsz in (1, 8):
        for length in (2048, 8192):
            for n in (1, 24, 64) if quick else (1, 24, 33, 64):
                cached = length - 1 if n == 1 else length
                sets, cl, ql, nbytes = _decode_sets(bsz, cached, n, hq, hkv, n > 1,
                                                    invariant=True)  # fmt: skip
                t = _ours_decode(sets, cl, ql, config, invariant=True)
                t_default = _ours_decode(sets, cl, ql)
                ts = _sdpa_decode(sets, cached)
                fl = floor_us(nbytes)
                row = {
                    "case": "invariant " + ("q=1" if n == 1 else f"tree {n} nodes"),
                    "heads": f"{hq}/{hkv}",
                    "B": bsz,
                    "L": length,
                    "ours_us": t,
                    "default_us": t_default,
                    "over_default": t / t_default,
                    "sdpa_us": ts,
                    "x_sdpa": ts / t,
                    "floor_us": fl,
                    "floor_frac": fl / t,
                }
                if n > 1:  # the same trees as bit rows (the same bits, tested)
                    row["ours_bits_us"] = _ours_decode(sets, cl, ql, config, invariant=True,
                                                       bits=True)  # fmt: skip
                rows.append(row)
                del sets
    # a frame's prefill in the lossless replay: a causal chain of new tokens over the context
    # (no SDPA column: its causal mask would be aligned to the top left)
    for length in () if quick else (2048, 8192):
        sets, cl, ql, nbytes = _decode_sets(2, length, 450, hq, hkv, False, invariant=True)
        t = _ours_decode(sets, cl, ql, config, invariant=True)
        tile = {**(config or {}), "CAUSAL_TILE_STEPS": True}
        t_tile = _ours_decode(sets, cl, ql, tile, invariant=True)
        t_default = _ours_decode(sets, cl, ql)
        rows.append({"case": "invariant causal chain 450", "heads": f"{hq}/{hkv}", "B": 2,
                     "L": length, "ours_us": t, "tile_steps_us": t_tile, "default_us": t_default,
                     "over_default": t / t_default, "floor_us": floor_us(nbytes)})  # fmt: skip
        del sets
    return rows


@register_benchmark(
    "attention", "attention", "GQA decode / tree verify / vision / prefill vs SDPA",
    plots={"decode": {"x": "L", "ys": ["ours_us", "sdpa_us", "floor_us"], "by": ["heads", "B"],
                      "where": {"case": "decode q=1"}},
           "trees": {"x": "L", "ys": ["ours_us", "sdpa_us", "floor_us"],
                     "by": ["case", "heads", "B"], "where": {"case": "tree*"}}},
)  # fmt: skip
def run(quick: bool = False) -> list[dict]:
    return (_decode_rows(quick) + _tree_rows(quick) + _invariant_rows(quick) + _vision_rows()
            + _prefill_rows())  # fmt: skip


@register_benchmark("rope_qk", "attention", "fp32 q/k rotary of vision towers vs torch")
def run_rope_qk(quick: bool = False) -> list[dict]:
    rows = []
    cases = (("Qwen2.5-VL 1 image", 1408, 16, 80), ("Qwen2.5-VL 8 images", 11264, 16, 80),
             ("Qwen3-VL 16 images", 11520, 16, 72))  # fmt: skip
    for name, n, heads, d in cases[:2] if quick else cases:
        nbytes = 4 * n * heads * d * DT.itemsize + 2 * n * d * 4  # q, k in and out; cos, sin
        sets = []
        for _ in range(rotation(nbytes, limit=16)):
            qkv = torch.randn(n, 3, heads, d, dtype=DT, device=DEVICE)
            ang = torch.rand(n, d, device=DEVICE) * 100
            out = tuple(torch.empty(n, heads, d, dtype=DT, device=DEVICE) for _ in "qk")
            sets.append((qkv[:, 0], qkv[:, 1], ang.cos(), ang.sin(), out))
        t = time_graph_us([partial(rope_qk, q, k, c, s, out=o) for q, k, c, s, o in sets])
        tt = time_graph_us([partial(reference.rope_qk, q, k, c, s) for q, k, c, s, _ in sets])
        fl = floor_us(nbytes)
        rows.append({"case": name, "tokens": n, "heads": heads, "d": d, "ours_us": t,
                     "torch_us": tt, "x_torch": tt / t, "floor_us": fl,
                     "floor_frac": fl / t})  # fmt: skip
    return rows


@register_benchmark("attention_invariant", "attention",
                    "query-invariant decode / tree verify vs the default mode and SDPA")  # fmt: skip
def run_invariant(quick: bool = False) -> list[dict]:
    return _invariant_rows(quick)


DECODE_SWEEP = (
    {},
    {"narrow": {"num_stages": 2}},
    {"narrow": {"BLOCK_N": 128}},
    {"MIN_CHUNK": 64},
    {"MIN_CHUNK": 256},
    {"TARGET": 32},
)
TREE_SWEEP = (
    {},
    {"wide": {"num_stages": 3}},
    {"wide": {"BLOCK_M": 128, "num_warps": 8}},
    {"wide": {"BLOCK_N": 128}},
    {"KEYS_PER_ROW": 1},
    {"KEYS_PER_ROW": 16},
)
INVARIANT_SWEEP = (
    {},
    {"TMA": False},
    {"SPLIT_KEYS": 256},
    {"SPLIT_KEYS": 1024},
    {"num_stages": 3},
    {"BLOCK_N": 32},
)
SEG_SWEEP = (
    {},
    {"num_stages": 3},
    {"BLOCK_N": 128},
    {"BLOCK_M": 128, "num_warps": 8},
)


def _sweep_row(case, heads, bsz, length, cfg, t, frac, tflops):
    return {"case": case, "heads": heads, "B": bsz, "L": length, "config": str(cfg), "ours_us": t,
            "floor_frac": frac, "tflops": tflops}  # fmt: skip


def invariant_sweep(quick: bool = False) -> list[dict]:
    """The query-invariant geometry: split size, stages, key block (each one set of bits)."""
    rows = []
    cases = [(1, 2048, 1), (8, 8192, 1), (8, 8192, 24), (8, 8192, 64)]
    for bsz, length, n in cases[1:3] if quick else cases:
        for cfg in INVARIANT_SWEEP:
            cached = length - 1 if n == 1 else length
            sets, cl, ql, nbytes = _decode_sets(bsz, cached, n, 16, 2, n > 1, invariant=True)
            if cfg.get("SPLIT_KEYS", 512) < 512:
                numel = workspace_numel(bsz, n, 16, 2, D, cached + n, cfg, query_invariant=True)
                sets = [(*x[:5], torch.empty(numel, device=DEVICE)) for x in sets]
            t = _ours_decode(sets, cl, ql, cfg, invariant=True)
            flops = 4 * bsz * 16 * n * length * D
            rows.append(_sweep_row(f"invariant q={n}", "16/2", bsz, length, cfg, t,
                                   floor_us(nbytes) / t, flops / t * 1e-6))  # fmt: skip
            del sets
    return rows


# (mask form, geometry): "bool" masks [B, q, q] (mask mode 1), or "bits": bit rows after each
# row's causal chain (mode 2 with chain_lens; the trees' rows alone for the tree cases)
STEP_SWEEP = (
    ("bool", {}),
    ("bits", {}),
    ("bits", {"wide": {"MAXNREG": 168}}),
    ("bits", {"wide": {"MAXNREG": 128}}),
    ("bits", {"wide": {"MASKED_ELEMENTS": 4096}}),
    ("bits", {"wide": {"MASKED_ELEMENTS": 4096, "MAXNREG": 168}}),
    ("bool", {"wide": {"MAXNREG": 168}}),
)
# A replay step of the ActiveVLN engine at B = 8 (Qwen2.5-VL-3B: 16/2 heads, d = 128): two rows
# start a frame (150 causal queries: image and prompt tokens), six verify a grammar tree of 14
# nodes; each row's context is its own (scaled by the case's factor).
STEP_QUERIES = (150, 14, 14, 150, 14, 14, 14, 14)
STEP_CONTEXT = (4000, 6000, 2000, 8000, 5000, 3000, 7000, 4500)


def _step_sets(scale: float, hq: int = 16, hkv: int = 2):
    """Input sets of one replay-shaped step: per-row cached lengths and query counts, a causal
    mask for the frame rows and a random ancestor mask for the tree rows (mask mode 1), and the
    same mask as bit rows after each row's chain (the frame rows' whole query count)."""
    bsz, n = len(STEP_QUERIES), max(STEP_QUERIES)
    lens = [int(c * scale) for c in STEP_CONTEXT]
    cap = max(lens) + n
    mask = torch.zeros(bsz, n, n, dtype=torch.bool)
    for b, q in enumerate(STEP_QUERIES):
        sub = torch.ones(q, q).tril().bool() if q > 16 else random_tree_mask(q, 8, b)
        mask[b, :q, :q] = sub
    live = sum(c + q for c, q in zip(lens, STEP_QUERIES, strict=True))
    kv_bytes = 2 * live * hkv * D * DT.itemsize
    sets = []
    for _ in range(rotation(2 * bsz * cap * hkv * D * DT.itemsize, limit=8)):
        q = torch.randn(bsz, n, hq, D, dtype=DT, device=DEVICE)
        k = torch.randn(bsz, cap, hkv, D, dtype=DT, device=DEVICE)
        sets.append((q, k, torch.randn_like(k), mask.to(DEVICE), torch.empty_like(q)))
    cl = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    ql = torch.tensor(STEP_QUERIES, dtype=torch.int32, device=DEVICE)
    chains = torch.tensor([q if q > 16 else 0 for q in STEP_QUERIES], dtype=torch.int32)
    bits = torch.zeros(bsz, n, dtype=torch.int64)
    for b, q in enumerate(STEP_QUERIES):
        if q <= 16:
            bits[b, :q] = reference.pack_tree_mask(mask[b, :q, :q])
    chain = (bits.to(DEVICE), chains.to(DEVICE))
    flops = sum(4 * hq * D * q * (c + q) for c, q in zip(lens, STEP_QUERIES, strict=True))
    return sets, cl, ql, kv_bytes, flops, chain


def step_masking(form: str, mask, bits, chains) -> dict:
    """``launch_gqa_tiles``' mask arguments for a ``_step_sets`` step in one form: "bool" (mask
    mode 1) or "bits" (bit rows after each row's chain)."""
    if form == "bits":
        return {"mask": bits, "mask_mode": 2, "chain_lens": chains}
    return {"mask": mask.view(torch.uint8), "mask_mode": 1}


def ours_step(sets, cl, ql, bits, chains, config=None, form: str = "bits") -> float:
    """Graph-timed microseconds of our launches over a ``_step_sets`` step under the geometry
    ``config``, its mask in ``form`` (``step_masking``)."""
    q_max, hq, hkv = sets[0][0].shape[1], sets[0][0].shape[2], sets[0][1].shape[2]
    numel = workspace_numel(len(STEP_QUERIES), q_max, hq, hkv, D, sets[0][1].shape[1], config)
    calls = []
    for q, k, v, mask, out in sets:
        ws = torch.empty(numel, device=DEVICE)
        calls.append(partial(launch_gqa_tiles, q, k, v, out, cl, ql, q_starts=None,
                             cache_rows=None, q_max=q_max, split=True, workspace=ws,
                             scale=D**-0.5, config=config,
                             **step_masking(form, mask, bits, chains)))  # fmt: skip
    return time_graph_us(calls)


@register_benchmark("attention_step_sweep", "attention",
                    "tile geometry at a replay step's shapes (frame rows beside tree rows)")  # fmt: skip
def run_step_sweep(quick: bool = False) -> list[dict]:
    """Replay-shaped steps (``STEP_QUERIES`` over contexts ``STEP_CONTEXT`` x 0.25 / 1 / 2), then
    24- and 64-node trees at B = 8, L = 8k (the ``attention`` benchmark's tree rows), each under
    every geometry of ``STEP_SWEEP``."""
    rows = []
    sweep = STEP_SWEEP[:3] if quick else STEP_SWEEP
    for scale in (0.25, 1.0) if quick else (0.25, 1.0, 2.0):
        sets, cl, ql, nbytes, flops, (bits, chains) = _step_sets(scale)
        hq, hkv = sets[0][0].shape[2], sets[0][1].shape[2]
        for form, cfg in sweep:
            t = ours_step(sets, cl, ql, bits, chains, cfg, form)
            rows.append({**_sweep_row("replay step", f"{hq}/{hkv}", len(STEP_QUERIES),
                                      int(cl.float().mean()), cfg, t, floor_us(nbytes) / t,
                                      flops / t * 1e-6), "mask": form})  # fmt: skip
        del sets
    for n in (24,) if quick else (24, 64):
        for form, cfg in sweep:
            sets, cl, ql, nbytes = _decode_sets(8, 8192 - n, n, 16, 2, True, cfg)
            t = _ours_decode(sets, cl, ql, cfg, bits=form == "bits")
            rows.append({**_sweep_row(f"tree {n} nodes", "16/2", 8, 8192, cfg, t,
                                      floor_us(nbytes) / t,
                                      4 * 8 * 16 * n * 8192 * D / t * 1e-6), "mask": form})  # fmt: skip
            del sets
    return rows


@register_benchmark("attention_sweep", "attention", "tile-geometry sweep for the attention kernels")
def run_sweep(quick: bool = False) -> list[dict]:
    rows = []
    decode = [(4, 2048, 16, 2), (1, 32768, 16, 2), (4, 8192, 16, 2)]
    tree = [(8, 8192, 24, 16, 2), (8, 8192, 64, 16, 2)]
    cases = [(b, L, 1, hq, hkv, DECODE_SWEEP) for b, L, hq, hkv in decode]
    cases += [(b, L, n, hq, hkv, TREE_SWEEP) for b, L, n, hq, hkv in tree]
    for bsz, length, n, hq, hkv, sweep in cases[:1] + cases[3:4] if quick else cases:
        for cfg in sweep:
            sets, cl, ql, nbytes = _decode_sets(bsz, length - n, n, hq, hkv, n > 1, cfg)
            t = _ours_decode(sets, cl, ql, cfg)
            flops = 4 * bsz * hq * n * length * D
            rows.append(_sweep_row(f"q={n}", f"{hq}/{hkv}", bsz, length, cfg, t,
                                   floor_us(nbytes) / t, flops / t * 1e-6))  # fmt: skip
            del sets
    rows += invariant_sweep(quick)
    for cfg in SEG_SWEEP:
        for r in _vision_rows(cfg):
            rows.append(_sweep_row(r["case"], r["heads"], r["B"], r["L"], cfg, r["ours_us"],
                                   r["floor_frac"], r["tflops"]))  # fmt: skip
    return rows
