# ruff: noqa: B023  (every closure is timed inside the iteration that defines it)
"""gemm benchmarks: few-row linears vs cuBLAS bf16, ``torch._scaled_mm`` fp8 rowwise and torch's
int4 weight-only GEMM; FP8 prefill vs ``_scaled_mm`` (alone and with separate epilogue ops);
NVFP4 W4A4 against FP8 W8A8 and bf16; quantizing producers vs their bandwidth floor; a small tile
sweep. Protocol: benchmarking.py."""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from flashrt_kernels.benchmarking import floor_us, rotation, time_graph_us
from flashrt_kernels.gemm import few_rows, w4a8
from flashrt_kernels.gemm.few_rows import linear
from flashrt_kernels.gemm.fp8_linear import fp8_linear
from flashrt_kernels.gemm.nvfp4_linear import nvfp4_linear
from flashrt_kernels.gemm.w4a8 import w4a8_linear
from flashrt_kernels.quant.int4 import make_int4_weight
from flashrt_kernels.quant.layer_norm import layer_norm_quantize
from flashrt_kernels.quant.nvfp4_rows import quantize_rows_nvfp4, rms_norm_quantize_nvfp4
from flashrt_kernels.quant.reference import quantize_int4_groups
from flashrt_kernels.quant.rows import quantize_rows, rms_norm_quantize, silu_mul_quantize
from flashrt_kernels.registry import register_benchmark

SHAPES = ((2048, 2560), (2048, 22016), (11008, 2048), (4096, 6144), (4096, 24576),
          (12288, 4096), (2048, 151936), (4096, 155697))  # fmt: skip
ROWS = (1, 16, 64)
REP_MS = 50


def _t(calls) -> float:
    return time_graph_us(calls, rep_ms=REP_MS)


def _int4_weight(n, k):
    w = torch.randn(n, k, device="cuda")
    codes, scales, zeros = quantize_int4_groups(w)
    return make_int4_weight(codes, scales, zeros, pad_to=32)


def _torch_int4(n, k):
    wi = torch.randint(0, 16, (n, k // 2), dtype=torch.uint8, device="cuda")
    packed = torch.ops.aten._convert_weight_to_int4pack(wi, 8)
    sz = torch.randn(k // 128, n, 2, device="cuda", dtype=torch.bfloat16)
    return packed, sz


def _few_rows_shape(k, n, rows):
    out = []
    bf = [
        torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(rotation(2 * n * k))
    ]
    i8 = [quantize_rows(w, "int8") for w in bf[: rotation(n * k)]]
    f8 = [quantize_rows(w, "fp8") for w in bf[: rotation(n * k)]]
    w4 = [_int4_weight(n, k) for _ in range(rotation(n * k // 2))]
    try:
        ti4 = [_torch_int4(n, k) for _ in range(rotation(n * k // 2))]
    except Exception:  # torch without the int4 weight-only kernel on this device
        ti4 = None
    for m in rows:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        xq, xs = quantize_rows(x, "int8")
        x8, x8s = quantize_rows(x, "fp8")
        y = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
        t_cublas = _t([lambda w=w: F.linear(x, w) for w in bf])
        cand = {}
        for name, make in few_rows.CANDIDATES.items():
            cfg = make(k)
            cand[f"bf16[{name}]_us"] = _t([lambda w=w: linear(x, w, out=y, config=cfg) for w in bf])
        t_bf16 = _t([lambda w=w: linear(x, w, out=y) for w in bf])
        t_i8 = _t([lambda w=w: linear(x, w[0], w[1], out=y) for w in i8])
        t_f8 = _t([lambda w=w: linear(x, w[0], w[1], out=y) for w in f8])
        sa = x8s[:, None]
        try:  # _scaled_mm needs N divisible by 16 (not so for a 155697-token vocabulary)
            t_smm = _t([lambda w=w: torch._scaled_mm(x8, w[0].t(), scale_a=sa,
                                                     scale_b=w[1][None, :],
                                                     out_dtype=torch.bfloat16) for w in f8])  # fmt: skip
        except RuntimeError:
            t_smm = float("nan")
        for name, make in w4a8.CANDIDATES.items():
            cfg = make(k, n)
            cand[f"w4a8[{name}]_us"] = _t([lambda w=w: w4a8_linear(xq=xq, xs=xs, weight=w, out=y,
                                                                   config=cfg) for w in w4])  # fmt: skip
        t_w4 = cand[f"w4a8[{w4a8.DEFAULT}]_us"]
        t_w4p = _t([lambda w=w: w4a8_linear(x, w, out=y) for w in w4])
        t_ti4 = float("nan")
        try:  # the int4 weight-only kernel rejects N = 155697 (the odd vocabulary)
            if ti4 is not None:
                t_ti4 = _t([lambda p=p: torch.ops.aten._weight_int4pack_mm(x, p[0], 128, p[1])
                            for p in ti4])  # fmt: skip
        except RuntimeError:
            pass
        fl16, fl8 = floor_us(2 * n * k), floor_us(n * k)
        fl4 = floor_us(n * k // 2 + 3 * n * (k // 128))
        out.append({
            "K": k, "N": n, "M": m, "cublas_us": t_cublas, "bf16_us": t_bf16,
            "bf16_floor_frac": fl16 / t_bf16, "cublas_floor_frac": fl16 / t_cublas,
            "x_cublas_bf16": t_cublas / t_bf16, "w8a16_int8_us": t_i8, "w8a16_fp8_us": t_f8,
            "w8_floor_frac": fl8 / t_i8, "x_cublas_w8": t_cublas / t_i8, "scaled_mm_us": t_smm,
            "w4a8_us": t_w4, "w4a8_prologue_us": t_w4p, "w4_floor_frac": fl4 / t_w4,
            "x_cublas_w4a8": t_cublas / t_w4, "torch_int4_us": t_ti4, "x_torch_int4": t_ti4 / t_w4,
            "floor16_us": fl16, "floor8_us": fl8, "floor4_us": fl4, **cand,
        })  # fmt: skip
    return out


@register_benchmark(
    "gemm", "gemm", "few-row linears (bf16, W8A16, W4A8) vs cuBLAS / scaled_mm / int4"
)
def run(quick: bool = False) -> list[dict]:
    rows_out = []
    for k, n in SHAPES:
        rows_out += _few_rows_shape(k, n, ROWS[:2] if quick else ROWS)
        torch.cuda.empty_cache()
    return rows_out


@triton.jit
def _read_kernel(X, Y, n_words, BLOCK: tl.constexpr):
    """A plain streaming read (each program sums one contiguous block): what reading the same
    bytes costs in the same harness, launch and tail included."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + tl.program_id(0), tl.sum(tl.load(X + offs, mask=offs < n_words, other=0), 0))


def _read_us(ws, block=4096, warps=4) -> float:
    words = [w.view(torch.int32).reshape(-1) for w in ws]
    grid = (triton.cdiv(words[0].numel(), block),)
    out = torch.empty(grid[0], dtype=torch.int32, device="cuda")
    return _t([lambda v=v: _read_kernel[grid](v, out, v.numel(), BLOCK=block, num_warps=warps,
                                          enable_fp_fusion=True)
               for v in words])  # fmt: skip


@register_benchmark(
    "gemm_bf16", "gemm", "batch-invariant bf16 few-row linear vs cuBLAS and the n32_k128 tile"
)
def run_bf16(quick: bool = False) -> list[dict]:
    """M = 1, 4, 16, 64 on every shape: cuBLAS, ours (``launch_config``'s tile), the tile before
    the 2026-12-03 sweep (``n32_k128`` everywhere), a plain read of the same weight bytes, and at
    M = 64 each wide tile (which ``wide_pays`` takes only from 65 rows)."""
    out = []
    for k, n in SHAPES[:6] if quick else SHAPES:
        bf = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
              for _ in range(rotation(2 * n * k))]  # fmt: skip
        fl = floor_us(2 * n * k)
        t_read = min(_read_us(bf), _read_us(bf, 16384, 8))
        for m in (1, 4, 16, 64):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            y = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
            old = few_rows.CANDIDATES[few_rows.DEFAULT](k)
            t_cublas = _t([lambda w=w: F.linear(x, w) for w in bf])
            t_ours = _t([lambda w=w: linear(x, w, out=y) for w in bf])
            t_old = _t([lambda w=w: linear(x, w, out=y, config=old) for w in bf])
            wide = {}
            if m > 2 * few_rows.BLOCK_M:  # the wide tiles where 4 row tiles would run
                for name, make in few_rows.WIDE_CANDIDATES.items():
                    cfg = make(k)
                    wide[f"wide[{name}]_us"] = _t([lambda w=w: linear(x, w, out=y, config=cfg)
                                                   for w in bf])  # fmt: skip
                wide["wide_floor_frac"] = fl / min(wide.values())
            out.append({
                "K": k, "N": n, "M": m, "floor_us": fl, "read_us": t_read, "cublas_us": t_cublas,
                "ours_us": t_ours, "before_us": t_old, "ours_floor_frac": fl / t_ours,
                "before_floor_frac": fl / t_old, "cublas_floor_frac": fl / t_cublas,
                "read_floor_frac": fl / t_read, "x_cublas": t_cublas / t_ours,
                "x_before": t_old / t_ours, "tile": few_rows.tile_for(k, n, m), **wide,
            })  # fmt: skip
        del bf
        torch.cuda.empty_cache()
    return out


# (K, N) of the ActiveVLN prefill and vision linears (text q|k|v, o, gate|up, down; vision q|k|v,
# proj, gate|up, down)
PREFILL_SHAPES = ((2048, 2560), (2048, 2048), (2048, 22016), (11008, 2048), (1280, 3840),
                  (1280, 1280), (1280, 6840), (3420, 1280))  # fmt: skip


@register_benchmark(
    "gemm_bf16_prefill", "gemm", "batch-invariant bf16 linear at prefill sizes vs cuBLAS"
)
def run_bf16_prefill(quick: bool = False) -> list[dict]:
    """M = 65 .. 2816 on the prefill shapes: cuBLAS, ours (``launch_config``: the wide tiles
    from ``WIDE_FROM`` rows), the 16-row tiles ``tile_for`` chose before them, and whether the
    two give the same bits."""
    out = []
    for k, n in PREFILL_SHAPES[:4] if quick else PREFILL_SHAPES:
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        for m in (65, 260, 1040, 2816):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            y = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
            narrow = few_rows.CANDIDATES[few_rows.tile_for(k, n, m)](k)
            cfg = few_rows.launch_config(k, n, m, aligned=few_rows.rows_aligned(x, w))
            t_cublas = _t([lambda: F.linear(x, w)])
            t_ours = _t([lambda: linear(x, w, out=y)])
            t_narrow = _t([lambda: linear(x, w, out=y, config=narrow)])
            same = torch.equal(linear(x, w), linear(x, w, config=narrow))
            tile = ("wide " if cfg.get("WIDE") else "") + "x".join(
                str(cfg[c]) for c in ("ROW_TILES", "BLOCK_N", "BLOCK_K") if c in cfg
            )
            out.append({
                "K": k, "N": n, "M": m, "cublas_us": t_cublas, "ours_us": t_ours,
                "narrow_us": t_narrow, "x_cublas": t_cublas / t_ours,
                "x_narrow": t_narrow / t_ours, "same_bits": same,
                "tfl_s": 2 * m * n * k / t_ours / 1e6, "tile": tile,
            })  # fmt: skip
    return out


@register_benchmark("gemm_prefill", "gemm", "FP8 W8A8 prefill GEMM vs torch._scaled_mm")
def run_prefill(quick: bool = False) -> list[dict]:
    out = []
    shapes = ((4096, 6144), (4096, 24576), (12288, 4096), (1152, 4304))
    for k, n in shapes[:2] if quick else shapes:
        w8, ws = quantize_rows(torch.randn(n, k, device="cuda", dtype=torch.bfloat16), "fp8")
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        for m in (2048, 8192) if quick else (2048, 4096, 8192):
            x8, xs = quantize_rows(torch.randn(m, k, device="cuda", dtype=torch.bfloat16), "fp8")
            res = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
            y = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
            sa, sb = xs[:, None], ws[None, :]

            def smm():
                return torch._scaled_mm(
                    x8, w8.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16
                )

            def smm_epi():
                return F.gelu(smm() + bias, approximate="tanh") + res

            t_smm, t_smm_e = _t([smm]), _t([smm_epi])
            t_ours = _t([lambda: fp8_linear(x8, xs, w8, ws, out=y)])
            t_ours_e = _t([lambda: fp8_linear(x8, xs, w8, ws, bias=bias, residual=res,
                                              activation="gelu_tanh", out=y)])  # fmt: skip
            tf = 2 * m * n * k / 1e6
            out.append({
                "M": m, "K": k, "N": n, "ours_us": t_ours, "scaled_mm_us": t_smm,
                "x_scaled_mm": t_smm / t_ours, "ours_tflops": tf / t_ours,
                "scaled_mm_tflops": tf / t_smm, "ours_epilogue_us": t_ours_e,
                "scaled_mm+ops_us": t_smm_e, "x_scaled_mm+ops": t_smm_e / t_ours_e,
            })  # fmt: skip
    return out


def _rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    """Frobenius norm of y - ref over that of ref (ref in float64)."""
    return float((y.double() - ref).norm() / ref.norm())


@register_benchmark("gemm_nvfp4", "gemm", "NVFP4 W4A4 (Hopper: dequantized to bf16) vs FP8 / bf16")
def run_nvfp4(quick: bool = False) -> list[dict]:
    """The same bf16 weights and activations four ways: cuBLAS bf16, our FP8 W8A8
    (``fp8_linear``), ``torch._scaled_mm`` fp8 rowwise, our NVFP4 W4A4 (``nvfp4_linear``); each
    quantized path also with its activation quantizer in the timed call. Bytes are the weight
    bytes read (NVFP4: half a byte a value, one e4m3 scale per 16, an fp32 alpha per row); the
    error is against the float64 product of the unquantized operands. Each format cycles through
    weight sets past the L2 (rotation), so the few-row cases read their weights from memory;
    ``nvfp4_weight_floor_fraction`` is the NVFP4 weight read's floor over its time. On Hopper
    NVFP4 saves weight memory, not arithmetic: its tiles are dequantized to bf16 for a bf16 dot."""
    out = []
    shapes = (
        ((4096, 6144), (12288, 4096))
        if quick
        else ((2048, 22016), (4096, 6144), (4096, 24576), (12288, 4096))
    )
    for k, n in shapes:
        # weight sets cycled past the L2 (the few-row cases read each weight once a call)
        bfs = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
               for _ in range(rotation(2 * n * k))]  # fmt: skip
        f8s = [quantize_rows(bfs[i % len(bfs)], "fp8") for i in range(rotation(n * k))]
        f4s = [quantize_rows_nvfp4(bfs[i % len(bfs)]) for i in range(rotation(n * k // 2))]
        w_bf, (w8, ws), w4 = bfs[0], f8s[0], f4s[0]
        bytes_w = {
            "bf16": 2 * n * k,
            "fp8": n * k + 4 * n,
            "nvfp4": n * k // 2 + n * k // 16 + 4 * n,
        }
        for m in (16, 2048) if quick else (16, 256, 2048, 8192):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = x.double() @ w_bf.double().t()
            y = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
            x8, xs = quantize_rows(x, "fp8")
            a4 = quantize_rows_nvfp4(x)
            sa = xs[:, None]

            def smm(w8, ws):
                return torch._scaled_mm(x8, w8.t(), scale_a=sa, scale_b=ws[None, :],
                                        out_dtype=torch.bfloat16)  # fmt: skip

            def fp8_q(w8, ws):
                xq, s = quantize_rows(x, "fp8")
                return fp8_linear(xq, s, w8, ws, out=y)

            def nvfp4_q(w4):
                return nvfp4_linear(*quantize_rows_nvfp4(x), *w4, out=y)

            t_bf16 = _t([partial(F.linear, x, w) for w in bfs])
            t_fp8 = _t([partial(fp8_linear, x8, xs, *w, out=y) for w in f8s])
            t_fp8_q = _t([partial(fp8_q, *w) for w in f8s])
            t_smm = _t([partial(smm, *w) for w in f8s])
            t_fp4 = _t([partial(nvfp4_linear, *a4, *w, out=y) for w in f4s])
            t_fp4_q = _t([partial(nvfp4_q, w) for w in f4s])
            tf = 2 * m * n * k / 1e6
            out.append({
                "M": m, "K": k, "N": n, "cublas_bf16_us": t_bf16, "fp8_us": t_fp8,
                "fp8_quant_us": t_fp8_q, "scaled_mm_us": t_smm, "nvfp4_us": t_fp4,
                "nvfp4_quant_us": t_fp4_q, "nvfp4_over_fp8": t_fp4 / t_fp8,
                "nvfp4_tflops": tf / t_fp4, "fp8_tflops": tf / t_fp8,
                "nvfp4_weight_floor_fraction": floor_us(bytes_w["nvfp4"]) / t_fp4,
                "weight_mb_bf16": bytes_w["bf16"] / 1e6, "weight_mb_fp8": bytes_w["fp8"] / 1e6,
                "weight_mb_nvfp4": bytes_w["nvfp4"] / 1e6,
                "err_bf16": _rel_err(F.linear(x, w_bf), ref),
                "err_fp8": _rel_err(fp8_linear(x8, xs, w8, ws), ref),
                "err_nvfp4": _rel_err(nvfp4_linear(*a4, *w4), ref),
            })  # fmt: skip
    return out


@register_benchmark(
    "gemm_producers", "gemm", "RMSNorm / SiLU-mul / LayerNorm -> INT8 / FP8 / NVFP4 rows vs floor"
)
def run_producers(quick: bool = False) -> list[dict]:
    """RMSNorm + residual -> rows (INT8, FP8, NVFP4), SiLU-mul -> rows and LayerNorm -> rows
    (INT8, FP8; there is no NVFP4 SiLU-mul or LayerNorm producer), each with its bandwidth floor:
    the bf16 inputs read (x and residual; gate|up; x), the new residual and the codes written,
    plus scales. 11008 columns: a width that is not a power of two (the RMSNorm producers hold it
    as two column segments, 8192 + 4096; SiLU-mul and LayerNorm pad it to 16384)."""
    out = []
    for cols in (2048, 4096, 11008):
        w = torch.randn(cols, device="cuda", dtype=torch.bfloat16)
        for rows in (1, 16, 4096) if quick else (1, 16, 1024, 4096, 16384):
            for fmt in ("int8", "fp8", "nvfp4"):
                fp4 = fmt == "nvfp4"
                codes = rows * cols // 2 + rows * cols // 16 if fp4 else rows * cols
                nbytes = rows * cols * (2 + 2 + 2) + codes + rows * 4
                sets = [(torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16),
                         torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16))
                        for _ in range(rotation(nbytes))]  # fmt: skip
                ro = torch.empty_like(sets[0][0])
                if fp4:
                    q4 = (torch.empty(rows, cols // 2, dtype=torch.uint8, device="cuda"),
                          torch.empty(rows, cols // 16, dtype=torch.float8_e4m3fn, device="cuda"),
                          torch.empty(rows, device="cuda"))  # fmt: skip
                    t_rms = _t([lambda a=a: rms_norm_quantize_nvfp4(a[0], w, 1e-6, residual=a[1],
                                out=q4, residual_out=ro) for a in sets])  # fmt: skip
                    t_silu, gnb, t_ln, lnb = float("nan"), 0, float("nan"), 0
                else:
                    q = torch.empty(rows, cols, dtype=torch.int8 if fmt == "int8" else
                                    torch.float8_e4m3fn, device="cuda")  # fmt: skip
                    s = torch.empty(rows, device="cuda")
                    t_rms = _t([lambda a=a: rms_norm_quantize(a[0], w, 1e-6, fmt, residual=a[1],
                                out=(q, s), residual_out=ro) for a in sets])  # fmt: skip
                    gnb = rows * cols * (4 + 1) + rows * 4
                    gus = [torch.randn(rows, 2 * cols, device="cuda", dtype=torch.bfloat16)
                           for _ in range(rotation(gnb))]  # fmt: skip
                    t_silu = _t([lambda g=g: silu_mul_quantize(g, fmt, out=(q, s)) for g in gus])
                    lnb = rows * cols * 3 + rows * 4
                    b = torch.randn(cols, device="cuda", dtype=torch.bfloat16)
                    xs = [torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
                          for _ in range(rotation(lnb))]  # fmt: skip
                    t_ln = _t([lambda x=x: layer_norm_quantize(x, w, b, 1e-6, fmt, out=(q, s))
                               for x in xs])  # fmt: skip
                out.append({
                    "cols": cols, "rows": rows, "fmt": fmt, "rms_norm_q_us": t_rms,
                    "rms_floor_frac": floor_us(nbytes) / t_rms, "silu_mul_q_us": t_silu,
                    "silu_floor_frac": floor_us(gnb) / t_silu if gnb else float("nan"),
                    "layer_norm_q_us": t_ln,
                    "ln_floor_frac": floor_us(lnb) / t_ln if lnb else float("nan"),
                })  # fmt: skip
    return out


def main() -> None:
    """``python -m flashrt_kernels.gemm.bench --out DIR [--quick] NAME...`` (no registry import
    of other families)."""
    import argparse

    from flashrt_kernels.benchmarking import markdown_table, write_results

    table = {"gemm": run, "gemm_bf16": run_bf16, "gemm_bf16_prefill": run_bf16_prefill,
             "gemm_prefill": run_prefill, "gemm_nvfp4": run_nvfp4,
             "gemm_producers": run_producers}  # fmt: skip
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("names", nargs="+", choices=sorted(table))
    args = ap.parse_args()
    for name in args.names:
        if name == "gemm":  # written shape by shape, so a time limit keeps what was measured
            rows = []
            for k, n in SHAPES:
                rows += _few_rows_shape(k, n, ROWS[:2] if args.quick else ROWS)
                torch.cuda.empty_cache()
                write_results(name, rows, args.out)
                print(markdown_table(rows[-3:]), flush=True)
        else:
            rows = table[name](quick=args.quick)
            write_results(name, rows, args.out)
            print(markdown_table(rows), flush=True)


if __name__ == "__main__":
    main()
