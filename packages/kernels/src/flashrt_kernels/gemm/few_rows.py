"""Batch-invariant few-row linears (M = 1..64): bf16 weights, W8A16 (int8 / fp8 weights with per-row
scales), gate|up with the SwiGLU epilogue, q|k|v in one launch.

``y[m, n] = round(scale[n] * sum_k x[m, k] * w[n, k])`` (scale 1 for bf16 weights), fp32
accumulation.

Contracts:
- batch invariance (``exact``): rows are tiled by a fixed 16 (a program takes 1, 2 or 4 such tiles
  as the batches of one dot, sharing the weight tile; many rows of bf16 weights take wide tiles,
  one 2D dot over 64 or 128 rows, whose 16-wide steps round as the 16-row mma's: compared on
  the GPU) and K is walked in one fixed order (16-wide mma steps in sequence, then, for a
  K-dependent split at multiples of ``SPLIT_GRANULE``, the partial sums added in split order);
  the split depends on K alone, so row r is bit-identical for every M and columns for every N
  (q|k|v fused == separate, gate|up fused == separate projections followed by
  ``quant.silu_mul``); the tile (columns, K tile, warps, stages) does not move a bit, so on the
  GPU it is chosen by M and N (``tile_for``, ``wide_tile_for``); the interpreter runs one tile
  (numpy's fp32 dot sums in a tile-dependent order);
- against ``reference.linear`` (float64 products): ``faithful``, |y - y_ref| <= 2**-8 |y_ref| +
  K * 2**-22 * sum_k |x_k w_k scale| (fp32 accumulation in another order plus the output rounding).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashrt_kernels import arrival
from flashrt_kernels.arrival import arrived_last
from flashrt_kernels.backends import resolve_backend, triton_interpreter_active
from flashrt_kernels.checks import check_tensor
from flashrt_kernels.gemm import reference
from flashrt_kernels.gemm.fp8_linear import SMS
from flashrt_kernels.quant.device import swiglu
from flashrt_kernels.triton_helpers import cast_rne, to_f32

BLOCK_M = 16
# Split boundaries are multiples of this (not of BLOCK_K), so the K tile never moves them.
SPLIT_GRANULE = tl.constexpr(256)
WEIGHT_DTYPES = (torch.bfloat16, torch.int8, torch.float8_e4m3fn)
IMPLEMENTED = ("triton", "reference")


def split_for(k: int) -> int:
    """The split of K: a function of K alone (never of M or N), so it never moves a column's bits."""
    return 4 if k >= 8192 else 1


# Named tiles (BLOCK_N, BLOCK_K, num_warps, num_stages). A tile never changes the bits (the mma
# sequence per 16-row tile is the same; split boundaries are multiples of SPLIT_GRANULE), so the
# tile may depend on M and N. CANDIDATES (each tile with split_for(K)) are what the benchmark
# times and the GPU tests check one by one.
TILES = {
    "n32_k128": (32, 128, 4, 4),  # the default outside tile_for's measured range
    "n16_k128_w2s7": (16, 128, 2, 7),
    "n32_k128_s3": (32, 128, 4, 3),
    "n64_k128": (64, 128, 4, 4),
    "n64_k64": (64, 64, 4, 4),
    "n32_k256": (32, 256, 4, 4),
}
DEFAULT = "n32_k128"


def _tile_config(name: str, k: int) -> dict:
    bn, bk, warps, stages = TILES[name]
    return {"BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": split_for(k), "num_warps": warps,
            "num_stages": stages}  # fmt: skip


CANDIDATES = {name: (lambda k, name=name: _tile_config(name, k)) for name in TILES}

# Wide tiles for many rows with bf16 weights (prefill): (16-row tiles, BLOCK_N, BLOCK_K, warps,
# stages), one 2D dot a K step (wgmma on Hopper), which gives the bits of the 16-row mma.sync
# tiles above (compared on the GPU at every ActiveVLN prefill shape, M 65-2816).
WIDE_TILES = {
    "m128_n128_k64": (8, 128, 64, 8, 3),
    "m64_n128_k64": (4, 128, 64, 4, 4),
    "m128_n256_k64": (8, 256, 64, 8, 3),
}
WIDE_FROM = 65  # the fewest rows that may take a wide tile (``wide_pays``)


def wide_tile_for(k: int, n: int, m: int) -> str:
    """The wide tile measured fastest (H100 probe, docs/kernels/gemm.md): 128 x 256 for long K
    and many rows, else 128 x 128 where its grid fills the SMs, else 64 x 128."""
    if k >= 8192 and m >= 1024:
        return "m128_n256_k64"
    if triton.cdiv(m, 128) * triton.cdiv(n, 128) * split_for(k) >= SMS:
        return "m128_n128_k64"
    return "m64_n128_k64"


def wide_pays(k: int, n: int, m: int) -> bool:
    """Whether the wide tiles beat the 16-row ones (H100, docs/kernels/gemm.md): from 256 rows
    always, from ``WIDE_FROM`` where 64 x 128 tiles make at least 64 programs (at 65 rows the
    16-row tiles won on 2048 -> 2048 and 1280 -> 1280 by 2-3 us)."""
    if m >= 256:
        return True
    return m >= WIDE_FROM and triton.cdiv(m, 64) * triton.cdiv(n, 128) * split_for(k) >= 64


def rows_aligned(*tensors: torch.Tensor) -> bool:
    """Whether every tensor's rows start on 16 bytes (bf16: a row stride of a multiple of 8), which
    the wide tiles need for vectorized loads."""
    return all(t.stride(0) % 8 == 0 and t.data_ptr() % 16 == 0 for t in tensors)


def _wide_config(name: str, k: int) -> dict:
    row_tiles, bn, bk, warps, stages = WIDE_TILES[name]
    return {"ROW_TILES": row_tiles, "WIDE": True, "BLOCK_N": bn, "BLOCK_K": bk,
            "SPLIT_K": split_for(k), "num_warps": warps, "num_stages": stages}  # fmt: skip


WIDE_CANDIDATES = {name: (lambda k, name=name: _wide_config(name, k)) for name in WIDE_TILES}


def row_tiles_for(m: int) -> int:
    """16-row tiles per program (1, 2 or 4): they share each weight tile, so M = 64 reads the
    weights once; the bits do not depend on it (each tile is its own batch of the dot)."""
    return 1 if m <= BLOCK_M else 2 if m <= 2 * BLOCK_M else 4


def tile_for(k: int, n: int, m: int, weight_dtype=torch.bfloat16) -> str:
    """The tile measured fastest on the H200 (docs/kernels/gemm.md): for bf16 weights the
    2026-12-03 sweep, the default outside its range (N < 4096 or N > 32768, 17-32 rows); for
    int8 / fp8 weights (W8A16) the 2026-12-04 sweep at M <= 16 (wide N: 64 columns, else 256-wide
    K tiles, which read as many bytes a step as the bf16 tiles), the default above 16 rows."""
    if weight_dtype != torch.bfloat16:
        if m > BLOCK_M:
            return DEFAULT
        return "n64_k128" if n >= 16384 else "n32_k256"
    if n < 4096 or n > 32768 or BLOCK_M < m <= 2 * BLOCK_M:
        return DEFAULT
    if m > 2 * BLOCK_M:  # 4 row tiles: wider columns read the activations fewer times
        return "n64_k128" if k >= 8192 or n <= 8192 else "n64_k64"
    if k >= 8192:
        return DEFAULT
    return "n16_k128_w2s7" if n <= 8192 else "n32_k128_s3"


def launch_config(k: int, n: int | None = None, m: int = 1, weight_dtype=torch.bfloat16,
                  aligned: bool = True) -> dict:  # fmt: skip
    """Tile and split: the split is a function of K only; the tile (bits-neutral) is chosen by
    ``tile_for`` when N is given, or by ``wide_tile_for`` from ``WIDE_FROM`` rows of bf16
    weights whose rows are 16-byte ``aligned`` (else the wide tiles' loads are not vectorized:
    2-4x slower than the 16-row tiles at K = 3420); else the default tile."""
    if n is None:
        return _tile_config(DEFAULT, k)
    if weight_dtype == torch.bfloat16 and aligned and wide_pays(k, n, m):
        return _wide_config(wide_tile_for(k, n, m), k)
    return _tile_config(tile_for(k, n, m, weight_dtype), k)


@triton.jit
def _load_tiles(X, W, rows, cols, m, n_rows_w, k0, kk, k_len, stride_x, stride_w,
                BLOCK_K: tl.constexpr, UPCAST: tl.constexpr):  # fmt: skip
    """The activation tile [rows, BLOCK_K] and the weight tile, transposed to [BLOCK_K, cols],
    in the dot's input dtype."""
    ks = kk + tl.arange(0, BLOCK_K)
    k_ok = ks < k_len
    a = tl.load(X + rows[:, None] * stride_x + (k0 + ks)[None, :],
                mask=(rows < m)[:, None] & k_ok[None, :], other=0.0)  # fmt: skip
    b = tl.load(W + cols[:, None] * stride_w + (k0 + ks)[None, :],
                mask=(cols < n_rows_w)[:, None] & k_ok[None, :], other=0.0)  # fmt: skip
    # one return: triton 3.9 type-checks every return of a function, the constexpr-dead ones too
    if UPCAST:
        a = to_f32(a)
        b = to_f32(b)
    else:
        b = b.to(tl.bfloat16)
    return a, tl.trans(b)


@triton.jit
def _mma(a, b, acc, UPCAST: tl.constexpr):
    if UPCAST:
        return tl.dot(a, b, acc, input_precision="ieee")
    return tl.dot(a, b, acc)


@triton.jit
def _dot_columns(X, W, rows, cols, m, n_rows_w, k0, k_len, stride_x, stride_w,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ROW_TILES: tl.constexpr,
                 UPCAST: tl.constexpr, WIDE: tl.constexpr):  # fmt: skip
    """fp32 [ROW_TILES * 16, BLOCK_N] dots. Several 16-row tiles share each weight tile as the
    batches of one dot: every tile runs the same mma instructions in the same K order as a lone
    16-row tile (which keeps the plain 2D dot: Triton compiles it leaner). ``WIDE`` tiles (many
    rows, bf16 weights) are one 2D dot over all their rows, the tensor cores' wide form on
    Hopper, which rounds each 16-wide K step as the 16-row mma does (tested on the GPU)."""
    if ROW_TILES == 1 or WIDE:
        acc = tl.zeros((16 * ROW_TILES, BLOCK_N), dtype=tl.float32)
        for kk in range(0, k_len, BLOCK_K):
            a, b = _load_tiles(X, W, rows, cols, m, n_rows_w, k0, kk, k_len, stride_x, stride_w,
                               BLOCK_K, UPCAST)  # fmt: skip
            acc = _mma(a, b, acc, UPCAST)
        return acc
    acc3 = tl.zeros((ROW_TILES, 16, BLOCK_N), dtype=tl.float32)
    for kk in range(0, k_len, BLOCK_K):
        a, b = _load_tiles(X, W, rows, cols, m, n_rows_w, k0, kk, k_len, stride_x, stride_w,
                           BLOCK_K, UPCAST)  # fmt: skip
        a3 = tl.reshape(a, (ROW_TILES, 16, BLOCK_K))
        acc3 = _mma(a3, tl.broadcast_to(b[None, :, :], (ROW_TILES, BLOCK_K, BLOCK_N)), acc3, UPCAST)
    return tl.reshape(acc3, (ROW_TILES * 16, BLOCK_N))


@triton.jit(do_not_specialize=["m"])  # M only enters masks: one compilation for every M
def _few_rows_kernel(
    X, W, WS, Y, P, T, m, n_out, k, split, stride_x, stride_w, stride_y,
    HAS_SCALE: tl.constexpr, GATE_UP: tl.constexpr, PARTIAL: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ROW_TILES: tl.constexpr, UPCAST: tl.constexpr,
    WIDE: tl.constexpr = False,
):  # fmt: skip
    pid_m, pid_n, pid_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = pid_m * 16 * ROW_TILES + tl.arange(0, 16 * ROW_TILES)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k_len = tl.cdiv(tl.cdiv(k, split), SPLIT_GRANULE) * SPLIT_GRANULE
    k0 = pid_s * k_len
    k_len = tl.minimum(k_len, k - k0)
    n_w = 2 * n_out if GATE_UP else n_out
    acc = _dot_columns(X, W, rows, cols, m, n_out, k0, k_len, stride_x, stride_w,
                       BLOCK_N, BLOCK_K, ROW_TILES, UPCAST, WIDE)  # fmt: skip
    acc_up = acc
    if GATE_UP:
        acc_up = _dot_columns(X, W + n_out * stride_w, rows, cols, m, n_out, k0, k_len,
                              stride_x, stride_w, BLOCK_N, BLOCK_K, ROW_TILES, UPCAST,
                              WIDE)  # fmt: skip
    mask = (rows < m)[:, None] & (cols < n_out)[None, :]
    if PARTIAL:
        # fp32 partials [split, (gate|up,) m, n_w]; the last split to arrive adds them in split
        # order (``arrival``)
        base = P + rows[:, None] * n_w + cols[None, :]
        tl.store(base + pid_s * m * n_w, acc, mask=mask)
        if GATE_UP:
            tl.store(base + pid_s * m * n_w + n_out, acc_up, mask=mask)
        if arrived_last(T, pid_m * tl.num_programs(1) + pid_n, split):
            acc = tl.load(base, mask=mask, other=0.0, cache_modifier=".cg")
            if GATE_UP:
                acc_up = tl.load(base + n_out, mask=mask, other=0.0, cache_modifier=".cg")
            for sp in range(1, split):
                part = base + sp * m * n_w
                acc += tl.load(part, mask=mask, other=0.0, cache_modifier=".cg")
                if GATE_UP:
                    acc_up += tl.load(part + n_out, mask=mask, other=0.0, cache_modifier=".cg")
            _epilogue(acc, acc_up, WS, Y, rows, cols, mask, n_out, stride_y,
                      HAS_SCALE, GATE_UP)  # fmt: skip
    else:
        _epilogue(acc, acc_up, WS, Y, rows, cols, mask, n_out, stride_y,
                  HAS_SCALE, GATE_UP)  # fmt: skip


@triton.jit
def _epilogue(acc, acc_up, WS, Y, rows, cols, mask, n_out, stride_y,
              HAS_SCALE: tl.constexpr, GATE_UP: tl.constexpr):  # fmt: skip
    col_ok = cols < n_out
    if HAS_SCALE:
        acc = acc * tl.load(WS + cols, mask=col_ok, other=0.0)[None, :]
        if GATE_UP:
            acc_up = acc_up * tl.load(WS + n_out + cols, mask=col_ok, other=0.0)[None, :]
    y = cast_rne(acc, tl.bfloat16)
    if GATE_UP:
        up = cast_rne(acc_up, tl.bfloat16)
        y = cast_rne(swiglu(y.to(tl.float32), up.to(tl.float32)), tl.bfloat16)
    tl.store(Y + rows[:, None] * stride_y + cols[None, :], y, mask=mask)


def _launch(x, w, w_scale, y, n_out, gate_up, config=None):
    m, k = x.shape
    if m == 0 or n_out == 0:
        return
    upcast = triton_interpreter_active() or x.device.type == "cpu"
    # the interpreter's fp32 dot (numpy) sums in a tile-dependent order: one tile there
    aligned = rows_aligned(x, w)
    cfg = dict(config or (launch_config(k) if upcast else
                          launch_config(k, n_out, m, w.dtype, aligned)))  # fmt: skip
    if gate_up and config is None and cfg.get("WIDE"):  # two accumulators: <= 64 columns
        cfg["BLOCK_N"] = min(cfg["BLOCK_N"], 64)
    split, bn = cfg.pop("SPLIT_K"), cfg["BLOCK_N"]
    stages = cfg.pop("num_stages")
    row_tiles = cfg.pop("ROW_TILES", None) or row_tiles_for(m)
    grid = (triton.cdiv(m, BLOCK_M * row_tiles), triton.cdiv(n_out, bn), split)
    n_w = 2 * n_out if gate_up else n_out
    part = torch.empty(split, m, n_w, dtype=torch.float32, device=x.device) if split > 1 else y
    ticket = arrival.tickets(x.device, grid[0] * grid[1]) if split > 1 else y
    has_scale = w_scale is not None
    ws = w_scale if has_scale else y
    _few_rows_kernel[grid](
        x, w, ws, y, part, ticket, m, n_out, k, split, x.stride(0), w.stride(0), y.stride(0),
        HAS_SCALE=has_scale, GATE_UP=gate_up, PARTIAL=split > 1, ROW_TILES=row_tiles,
        UPCAST=upcast, **cfg, num_stages=stages, enable_fp_fusion=False,
    )  # fmt: skip


def _validate(op, x, w, w_scale, out, n_out):
    check_tensor(op, "x", x, dtypes=(torch.bfloat16,), ndim=2, last_dim_contiguous=True)
    check_tensor(op, "weight", w, dtypes=WEIGHT_DTYPES, ndim=2, device=x.device,
                 last_dim_contiguous=True)  # fmt: skip
    if w.shape[1] != x.shape[1]:
        raise ValueError(f"{op}: weight must be [N, {x.shape[1]}] (K of x), got {list(w.shape)}")
    if w.dtype != torch.bfloat16:
        if w_scale is None:
            raise ValueError(f"{op}: {w.dtype} weights need w_scale (fp32 [N])")
        check_tensor(op, "w_scale", w_scale, dtypes=(torch.float32,), shape=[w.shape[0]],
                     device=x.device, contiguous=True)  # fmt: skip
    elif w_scale is not None:
        raise ValueError(f"{op}: w_scale is only for int8 / fp8 weights")
    if out is not None:
        check_tensor(op, "out", out, dtypes=(torch.bfloat16,), shape=[x.shape[0], n_out],
                     device=x.device, last_dim_contiguous=True)  # fmt: skip


def linear(x, weight, w_scale=None, *, out=None, backend: str = "auto", config=None):
    """Batch-invariant ``x @ weight.T`` (times ``w_scale`` per output column for int8 / fp8
    weights): x bf16 [M, K], weight [N, K] -> bf16 [M, N]. ``out`` may be a column slice of a
    wider buffer (unit column stride)."""
    op = "few_rows_linear"
    n = weight.shape[0] if isinstance(weight, torch.Tensor) else 0
    _validate(op, x, weight, w_scale, out, n)
    if out is None:
        out = torch.empty(x.shape[0], n, dtype=torch.bfloat16, device=x.device)
    if resolve_backend(op, backend, x.device, IMPLEMENTED) == "reference":
        out.copy_(reference.linear(x, weight, w_scale))
    else:
        _launch(x, weight, w_scale, out, n, False, config)
    return out


def linear_qkv(x, w_qkv, sizes, w_scale=None, *, out=None, backend: str = "auto"):
    """q|k|v in one launch over the row-concatenated weight; returns views (q, k, v) of one
    [M, sum(sizes)] output, bit-equal to three separate ``linear`` calls."""
    if sum(sizes) != w_qkv.shape[0]:
        raise ValueError(f"linear_qkv: sizes {sizes} must add up to the weight's {w_qkv.shape[0]}")
    y = linear(x, w_qkv, w_scale, out=out, backend=backend)
    return tuple(y.split(list(sizes), dim=1))


def linear_gate_up_swiglu(x, w_gate_up, w_scale=None, *, out=None, backend: str = "auto",
                          config=None):  # fmt: skip
    """``silu_mul`` of the gate|up projection in one launch: weight [2I, K] (gate rows then up
    rows) -> bf16 [M, I]; bit-equal to two ``linear`` calls followed by ``quant.silu_mul``."""
    op = "few_rows_gate_up_swiglu"
    two_i = w_gate_up.shape[0] if isinstance(w_gate_up, torch.Tensor) else 0
    if two_i % 2:
        raise ValueError(f"{op}: weight must have an even number of rows (gate | up)")
    _validate(op, x, w_gate_up, w_scale, out, two_i // 2)
    if out is None:
        out = torch.empty(x.shape[0], two_i // 2, dtype=torch.bfloat16, device=x.device)
    if resolve_backend(op, backend, x.device, IMPLEMENTED) == "reference":
        from flashrt_kernels.quant.reference import silu_mul

        out.copy_(silu_mul(reference.linear(x, w_gate_up, w_scale)))
    else:
        _launch(x, w_gate_up, w_scale, out, two_i // 2, True, config)
    return out


# torch.library registration (functional forms with fake implementations).
@torch.library.custom_op("flashrt::few_rows_linear", mutates_args=())
def _linear_op(x: torch.Tensor, weight: torch.Tensor, w_scale: torch.Tensor | None,
               backend: str) -> torch.Tensor:  # fmt: skip
    return linear(x, weight, w_scale, backend=backend)


@_linear_op.register_fake
def _(x, weight, w_scale, backend):
    return x.new_empty(x.shape[0], weight.shape[0])


@torch.library.custom_op("flashrt::few_rows_gate_up_swiglu", mutates_args=())
def _gate_up_op(x: torch.Tensor, weight: torch.Tensor, w_scale: torch.Tensor | None,
                backend: str) -> torch.Tensor:  # fmt: skip
    return linear_gate_up_swiglu(x, weight, w_scale, backend=backend)


@_gate_up_op.register_fake
def _(x, weight, w_scale, backend):
    return x.new_empty(x.shape[0], weight.shape[0] // 2)
