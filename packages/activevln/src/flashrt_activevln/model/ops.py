"""The model's numeric building blocks behind one small boundary, so kernels can be switched in.

``reference`` ops are plain torch and follow HF transformers' order of operations (RMSNorm and the
vision rotary embedding computed in float32, softmax in at least float32). ``Ops`` picks, per
building block, the reference or a flashrt-kernels op; every choice states its contract:
- ``rms_norm="kernel"``: flashrt_kernels.rms_norm on CUDA tensors (faithful, 1.5 ulp in bf16;
  rows independent); float64 and CPU tensors take the reference (on a CPU the kernel library
  would run the same reference, with more per-call overhead).
- ``attention="reference"``: masked softmax attention over the live KV extent (the specification);
- ``attention="gqa"``: flashrt_kernels.gqa_attention (split-KV GQA decode / tree verify over the
  pool) for bf16 / fp16: faithful to the reference (its stated bound), exact across batch
  compositions and padded query counts; other dtypes take the reference;
- ``attention="gqa_invariant"``: the same op with ``query_invariant=True``: also exact per query
  (a query's bits depend only on it and the keys it sees, not on the row's query count, the tree
  or where the committed prefix ends), so a tree step and a chain of single steps agree bit for
  bit. Its tree masks hold at most ``INVARIANT_TREE`` nodes: rows of at most that many queries go
  through one tree launch over the first ``INVARIANT_TREE`` query slots, longer (prefill) rows,
  which are causal, through one causal launch;
- ``decode_linear="batch_invariant"``: flashrt_kernels.gemm.linear for the text projections of
  decode / tree steps in bf16 (faithful: the kernel's bound, plus one rounding of the bias add;
  exact across row counts);
- ``prefill_linear="batch_invariant"``: the same kernel for the text projections of every other
  step (prefill) and for every vision-tower linear (bias added after in bf16): a token's result
  never depends on how many tokens or images a step packs (exact across row counts), so with the
  invariant attention and rows independent norms a row's replies do not depend on the batch;
- ``vision_attention="segmented"``: flashrt_kernels.segmented_attention (per window / per image,
  variable lengths) for bf16 / fp16: faithful; other dtypes take the reference. The tower's
  rotary embedding of q and k then goes through flashrt_kernels.rope_qk on CUDA tensors
  (``exact``: the bits of the float32 torch rotation), straight from the q|k|v projection into
  the token-major layout the kernel reads (no transposed copies);
- ``activation="kernel"``: SwiGLU after a torch gate|up linear (text prefill, the vision MLP) as
  flashrt_kernels.quant.silu_mul on CUDA bf16 / fp16 tensors: one launch over the gate|up
  output, the fp32 product rounded once (faithful, 2 ulp; torch rounds silu(gate) first). The
  fused batch-invariant launch of decode steps rounds the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
FEW_QUERIES = 64
INVARIANT_TREE = 64  # flashrt_kernels' query-invariant tree masks hold at most this many nodes
ATTENTION = ("reference", "gqa", "gqa_invariant")
ACTIVATIONS = ("reference", "kernel")
LINEARS = ("reference", "batch_invariant")


def rms_norm_reference(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.to(torch.float32)
    inv = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * (xf * inv).to(x.dtype)


def softmax_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def attention_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor, scale: float
) -> torch.Tensor:
    """q [B, H, Q, D], k/v [B, Hkv, K, D], visible [B, Q, K] bool (every query sees >= 1 key).
    Values at keys no query sees are zeroed first, so a stale NaN slot cannot reach the output."""
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    seen = visible.any(dim=1)[:, None, :, None]
    v = torch.where(seen, v, torch.zeros((), dtype=v.dtype))
    k = torch.where(seen, k, torch.zeros((), dtype=k.dtype))
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~visible[:, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=softmax_dtype(q.dtype)).to(q.dtype)
    return torch.matmul(probs, v)


def segment_attention_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bounds: list[int], scale: float
) -> torch.Tensor:
    """Full attention inside each segment [bounds[i], bounds[i+1]); q/k/v [H, N, D]."""
    out = torch.empty_like(q)
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        if b > a:
            s = torch.matmul(q[:, a:b], k[:, a:b].transpose(-1, -2)) * scale
            p = torch.softmax(s, dim=-1, dtype=softmax_dtype(q.dtype)).to(q.dtype)
            out[:, a:b] = torch.matmul(p, v[:, a:b])
    return out


@dataclass(frozen=True)
class Ops:
    rms_norm: str = "reference"
    attention: str = "reference"
    vision_attention: str = "reference"
    decode_linear: str = "reference"
    prefill_linear: str = "reference"
    activation: str = "reference"

    def __post_init__(self):
        for name in ("decode_linear", "prefill_linear"):
            if getattr(self, name) not in LINEARS:
                raise ValueError(
                    f"Ops.{name} must be one of {list(LINEARS)}, got {getattr(self, name)!r}"
                )
        if self.rms_norm not in ("reference", "kernel"):
            raise ValueError(f"Ops.rms_norm must be 'reference' or 'kernel', got {self.rms_norm!r}")
        if self.attention not in ATTENTION:
            raise ValueError(
                f"Ops.attention must be one of {list(ATTENTION)}, got {self.attention!r}"
            )
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"Ops.activation must be one of {list(ACTIVATIONS)}, got {self.activation!r}"
            )
        if self.vision_attention not in ("reference", "segmented"):
            raise ValueError(
                "Ops.vision_attention must be 'reference' or 'segmented', "
                f"got {self.vision_attention!r}"
            )

    def norm(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        if self.rms_norm == "kernel" and x.dtype in KERNEL_DTYPES and x.is_cuda:
            import flashrt_kernels

            return flashrt_kernels.rms_norm(x.contiguous(), w, eps)
        return rms_norm_reference(x, w, eps)

    def add_norm(self, x: torch.Tensor, delta: torch.Tensor | None, w: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """(norm(x + delta), x + delta); ``delta`` None: (norm(x), x). With ``rms_norm="kernel"``
        the add is the norm kernel's residual input (one launch; the sum rounded to the dtype
        as torch rounds ``x + delta``, so both outputs equal the two separate steps')."""
        if delta is None:
            return self.norm(x, w, eps), x
        if self.rms_norm == "kernel" and x.dtype in KERNEL_DTYPES and x.is_cuda:
            import flashrt_kernels

            return flashrt_kernels.rms_norm(delta.contiguous(), w, eps, residual=x.contiguous())
        x = x + delta
        return self.norm(x, w, eps), x

    def appends_rotary(self, x: torch.Tensor) -> bool:
        """Whether a packed step's bias add, rotary embedding and K/V append go through
        flashrt_kernels.rope_append (with the pool attention kernels, in bf16 / fp16 / fp32):
        ``exact``, the same bits as the torch composition it replaces."""
        return self.attention != "reference" and x.dtype in KERNEL_DTYPES

    @staticmethod
    def rope_append(q, k, v, cos, sin, k_layer, v_layer, rows, slots, q_out, q_index, biases):
        from flashrt_kernels.attention import rope_append

        rope_append(q, k, v, cos, sin, k_layer, v_layer, rows, slots, q_out, q_index,
                    biases=biases)  # fmt: skip

    def qkv_unbiased(self, x: torch.Tensor, w_qkv: torch.Tensor, sizes, few_queries: bool):
        """q, k, v [T, n] (column views of one output) before their biases: the fused
        batch-invariant launch where ``text_linear`` would use that kernel, else one torch
        linear over the row-concatenated weight."""
        if self.fuses(x, few_queries):
            from flashrt_kernels.gemm import linear_qkv

            return linear_qkv(x.contiguous(), w_qkv, sizes)
        return F.linear(x, w_qkv).split(list(sizes), dim=-1)

    def gate_up_then_swiglu(self, x: torch.Tensor, w_gate_up: torch.Tensor) -> torch.Tensor:
        """One torch linear over the gate|up weight, then SiLU(gate) * up."""
        return self.swiglu_halves(F.linear(x, w_gate_up))

    def swiglu_halves(self, gate_up: torch.Tensor) -> torch.Tensor:
        """SiLU(gate) * up of a [..., 2I] gate|up tensor: ``activation="kernel"`` on CUDA bf16 /
        fp16 is one flashrt_kernels.quant.silu_mul launch, else torch on the two halves."""
        if (self.activation == "kernel" and gate_up.is_cuda
                and gate_up.dtype in (torch.bfloat16, torch.float16)):  # fmt: skip
            from flashrt_kernels.quant import silu_mul

            y = silu_mul(gate_up.reshape(-1, gate_up.shape[-1]))
            return y.view(*gate_up.shape[:-1], y.shape[-1])
        gate, up = gate_up.chunk(2, dim=-1)
        return self.swiglu(gate, up)

    def invariant_steps_for(self, new_visible, q_lens, chain_lens, dtype):
        """A packed forward's ``invariant_steps``, once for all its layers, where the
        query-invariant kernel will run (else None)."""
        if self.attention != "gqa_invariant" or dtype not in (torch.bfloat16, torch.float16):
            return None
        return invariant_steps(new_visible, q_lens, chain_lens, new_visible.shape[1])

    def attend_pool(self, q, k_layer, v_layer, lengths, new_visible, extent, scale, q_lens=None,
                    chain_lens=None, steps=None):  # fmt: skip
        """q [B, H, Q, D] over one pool layer [rows, capacity, Hkv, D] -> [B, Q, H, D].
        ``q_lens`` [B]: live queries per row (default all Q); the kernel skips the others.
        ``chain_lens`` [B] (``gqa_invariant``): each row's leading causal queries; the rest of
        its live queries are a tree of at most ``INVARIANT_TREE`` nodes over them (without it,
        rows of more than ``INVARIANT_TREE`` queries must be causal). ``new_visible`` is bool
        ``[B, Q, Q]``, or int64 bit rows ``[B, Q]`` of each row's tree after its ``chain_lens``
        chain. ``steps``: ``invariant_steps`` of this mask, prepared once per forward
        (``invariant_steps_for``; built here when None)."""
        b, _, nq, _ = q.shape
        bit_rows = new_visible.dtype == torch.int64
        if self.attention != "reference" and q.dtype in (torch.bfloat16, torch.float16):
            from flashrt_kernels.attention import gqa_attention

            lens = lengths.to(torch.int32)
            given = q_lens is not None
            q_lens = q_lens.to(torch.int32) if given else torch.full_like(lens, nq)
            qq = q.transpose(1, 2).contiguous()
            if self.attention == "gqa_invariant":
                if not given and nq > INVARIANT_TREE:  # rows' masks unknown: not causal
                    raise ValueError(
                        "Ops(attention='gqa_invariant'): a step of more than "
                        f"{INVARIANT_TREE} queries needs q_lens (the packed forward)"
                    )
                if steps is None:
                    steps = invariant_steps(new_visible, q_lens, chain_lens, nq)
                return _invariant_attention(qq, k_layer, v_layer, lens, q_lens, steps, scale)
            return gqa_attention(qq, k_layer, v_layer, lens, q_lens, tree_mask=new_visible,
                                 scale=scale, chain_lens=chain_lens if bit_rows else None)  # fmt: skip
        from flashrt_activevln.model.text import visibility

        if bit_rows:
            from flashrt_kernels.attention.reference import unpack_tree_mask

            new_visible = unpack_tree_mask(new_visible, nq, chain_lens)
            if q_lens is not None:  # padded slots are never written: unseen
                live = torch.arange(nq, device=q.device) < q_lens[:, None]
                new_visible = new_visible & live[:, None, :]

        visible = visibility(lengths, new_visible, extent)
        k = k_layer[:, :extent].transpose(1, 2)
        v = v_layer[:, :extent].transpose(1, 2)
        return attention_reference(q, k, v, visible, scale).transpose(1, 2)

    def vision_rope(self, q, k, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """q, k [N, H, D] (views of the q|k|v projection) rotated in float32 by cos / sin [N, D]
        float32 -> [N, H, D] each: flashrt_kernels.rope_qk (one launch, exact) with the
        segmented vision kernel on CUDA, else HF's torch composition per tensor."""
        if self.vision_attention == "segmented" and q.is_cuda and q.dtype in KERNEL_DTYPES:
            from flashrt_kernels.attention import rope_qk

            return rope_qk(q, k, cos, sin)
        from flashrt_activevln.model.rope import apply_vision_rope

        return apply_vision_rope(q, cos, sin), apply_vision_rope(k, cos, sin)

    def attend_segments(self, q, k, v, bounds, scale, cu=None):
        """q/k/v [N, H, D] (token-major, any token / head strides) -> [N, H, D]: full attention
        inside each [bounds[i], bounds[i+1]) (``cu``: the bounds as an int32 device tensor, if
        the caller has it; the bounds must cover all N tokens)."""
        if self.vision_attention == "segmented" and q.dtype in (torch.bfloat16, torch.float16):
            from flashrt_kernels.attention import segmented_attention

            if cu is None:
                cu = torch.tensor(bounds, dtype=torch.int32, device=q.device)
            longest = max(b - a for a, b in zip(bounds[:-1], bounds[1:], strict=True))
            out = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # every row is written
            return segmented_attention(q, k, v, cu, longest, scale=scale, out=out)
        heads_first = (x.transpose(0, 1) for x in (q, k, v))
        return segment_attention_reference(*heads_first, bounds, scale).transpose(0, 1)

    def linear(
        self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Vision-tower linears (batch-invariant with ``prefill_linear="batch_invariant"``)."""
        if self.prefill_linear == "batch_invariant" and x.dtype == torch.bfloat16:
            return _invariant_linear(x, w, b)
        return F.linear(x, w, b)

    @property
    def fused_weights(self) -> bool:
        """Whether the model keeps q|k|v and gate|up row-concatenated for the fused launches."""
        return "batch_invariant" in (self.decode_linear, self.prefill_linear)

    def text_linear(self, x, w, b=None, few_queries: bool = False) -> torch.Tensor:
        """Text-decoder projections. With ``decode_linear="batch_invariant"``, bf16 steps of at most
        ``FEW_QUERIES`` queries per row go through flashrt_kernels.gemm.linear (fp32 accumulation
        in one fixed K order: a row's result never depends on how many rows there are), the bias
        added after in bf16; prefill steps keep torch's linear unless
        ``prefill_linear="batch_invariant"``."""
        if self.fuses(x, few_queries):
            return _invariant_linear(x, w, b)
        return F.linear(x, w, b)

    def fuses(self, x: torch.Tensor, few_queries: bool) -> bool:
        """Whether a text step goes to the batch-invariant kernels: ``text_linear``'s, and the
        fused ``qkv`` / ``gate_up_swiglu`` launches."""
        option = self.decode_linear if few_queries else self.prefill_linear
        return option == "batch_invariant" and x.dtype == torch.bfloat16

    @staticmethod
    def qkv(x, w_qkv, sizes, biases) -> tuple[torch.Tensor, ...]:
        """q|k|v in one batch-invariant launch (flashrt_kernels.gemm.linear_qkv over the
        row-concatenated weight), each bias added after in bf16: bit-equal to three
        ``text_linear`` calls."""
        from flashrt_kernels.gemm import linear_qkv

        ys = linear_qkv(x.reshape(-1, x.shape[-1]).contiguous(), w_qkv, sizes)
        return tuple(
            y.view(*x.shape[:-1], y.shape[-1]) + b for y, b in zip(ys, biases, strict=True)
        )

    @staticmethod
    def gate_up_swiglu(x, w_gate_up) -> torch.Tensor:
        """silu(gate) * up in one batch-invariant launch (flashrt_kernels.gemm
        .linear_gate_up_swiglu): the product in fp32, rounded once to bf16 (``swiglu`` rounds
        silu(gate) first): faithful."""
        from flashrt_kernels.gemm import linear_gate_up_swiglu

        y = linear_gate_up_swiglu(x.reshape(-1, x.shape[-1]).contiguous(), w_gate_up)
        return y.view(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return F.silu(gate) * up


def _invariant_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    from flashrt_kernels.gemm import linear

    y = linear(x.reshape(-1, x.shape[-1]).contiguous(), w).view(*x.shape[:-1], w.shape[0])
    return y if b is None else y + b


@dataclass(frozen=True)
class InvariantSteps:
    """How a step's queries split between the query-invariant launches (``invariant_steps``):
    the causal launch's query count per row (each long row's chain; None when the step is one
    tree launch), each row's first query slot in the tree launch (``offset``; None with one
    launch) and those slots (``index`` [B, t]), and the tree launch's mask: bool [B, t, t] or
    int64 bit rows [B, t]."""

    causal_q: torch.Tensor | None
    offset: torch.Tensor | None
    index: torch.Tensor | None
    tree_mask: torch.Tensor


def _low_bits(n: torch.Tensor) -> torch.Tensor:
    """int64 with the low ``n`` bits set (0 <= n <= 64)."""
    one = torch.ones_like(n)
    return torch.where(n >= 64, -one, (one << n.clamp(max=63)) - 1)


def invariant_steps(mask, q_lens, chain_lens, nq: int) -> InvariantSteps:
    """The split of ``_invariant_attention`` for a step of ``nq`` query slots: ``mask`` is bool
    [B, nq, nq], or int64 bit rows [B, nq] of each row's tree after its ``chain_lens`` chain
    (``flashrt_kernels.attention.reference.unpack_tree_mask``); the engine's packed forward
    builds it once per forward. A row launched whole as a tree gets the whole-row bit rows
    (chain tokens causal, bit ``c + t`` for node ``t``); a long row's tree launch starts at its
    chain's end, where its bit rows are already relative."""
    t = INVARIANT_TREE
    b = q_lens.shape[0]
    bits = mask.dtype == torch.int64
    dev = q_lens.device
    chain = q_lens if chain_lens is None else chain_lens.to(q_lens.dtype)
    if nq <= t:
        long = torch.zeros_like(q_lens, dtype=torch.bool)
        causal_q = offset = index = None
        slots = torch.arange(nq, device=dev).expand(b, nq)
    else:
        long = q_lens > t
        causal_q = offset = torch.where(long, chain, torch.zeros_like(q_lens))
        index = slots = (offset[:, None] + torch.arange(t, device=dev)).long()  # < nq + t
    if not bits:
        if index is None:
            return InvariantSteps(None, None, None, mask)
        m_pad = torch.nn.functional.pad(mask, (0, t, 0, t))
        m_rows = m_pad.gather(1, index[:, :, None].expand(b, t, nq + t))
        return InvariantSteps(
            causal_q, offset, index, m_rows.gather(2, index[:, None, :].expand(b, t, t))
        )
    node_bits = torch.nn.functional.pad(mask, (0, t)).gather(1, slots)
    c = chain.long()[:, None]
    i = torch.arange(slots.shape[1], device=dev)[None]
    nodes = torch.where(c >= 64, 0, node_bits << c.clamp(max=63))
    whole = torch.where(i < c, _low_bits(i + 1), _low_bits(c) | nodes)
    return InvariantSteps(causal_q, offset, index, torch.where(long[:, None], node_bits, whole))


def _invariant_attention(q, k_layer, v_layer, lens, q_lens, steps: InvariantSteps, scale):
    """``gqa_attention(query_invariant=True)`` for a step whose rows may mix trees (at most
    ``INVARIANT_TREE`` queries, or a causal chain followed by a tree of at most that many nodes)
    with long causal prefill chains (``steps``: ``invariant_steps``). Steps of at most
    ``INVARIANT_TREE`` queries are one tree launch. Longer steps are two launches: a causal one
    over each long row's chain, and one tree launch over ``INVARIANT_TREE`` query slots gathered
    per row from an offset: 0 for a short row (its whole mask), the chain's end for a long row,
    whose nodes then see the chain as committed keys (the kernel's bits do not depend on where
    the prefix is cut, nor on the mask's form). Each query's output comes from the launch that
    holds it."""
    from flashrt_kernels.attention import gqa_attention

    b, nq = q.shape[:2]
    t = INVARIANT_TREE
    if steps.index is None:
        return gqa_attention(q, k_layer, v_layer, lens, q_lens, tree_mask=steps.tree_mask,
                             scale=scale, query_invariant=True)  # fmt: skip
    out = gqa_attention(q, k_layer, v_layer, lens, steps.causal_q, scale=scale,
                        query_invariant=True)  # fmt: skip
    offset = steps.offset
    q_pad = torch.cat([q, q.new_zeros(b, t, *q.shape[2:])], 1)
    view = steps.index[:, :, None, None].expand(b, t, *q.shape[2:])
    tree = gqa_attention(q_pad.gather(1, view).contiguous(), k_layer, v_layer, lens + offset,
                         q_lens - offset, tree_mask=steps.tree_mask, scale=scale,
                         query_invariant=True)  # fmt: skip
    o_pad = torch.cat([out, out.new_zeros(b, t, *out.shape[2:])], 1)
    held = (torch.arange(t, device=q.device)[None] < (q_lens - offset)[:, None])[..., None, None]
    o_pad.scatter_(1, view, torch.where(held, tree, o_pad.gather(1, view)))
    return o_pad[:, :nq]
