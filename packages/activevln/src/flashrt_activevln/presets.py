"""Engine options, their numerics contracts, and the named presets ``reference``, ``fast`` and
``lossless``.

| option | values | contract |
| --- | --- | --- |
| ``attention_kernel`` | "reference" | masked softmax attention in torch (the specification) |
|  | "gqa" | flashrt_kernels.gqa_attention (bf16/fp16): faithful, batch-invariant |
|  | "gqa_invariant" | the same with ``query_invariant=True``: faithful, and exact per query (a |
|  |  | query's bits independent of the row's query count, tree and prefix cut); |
|  |  | needs packed_prefill and a tree budget of at most 63 nodes |
| ``vision_kernel`` | "reference" | per-window / per-image attention in torch |
|  | "segmented" | flashrt_kernels.segmented_attention (bf16/fp16): faithful; the |
|  |  | tower's q/k rotary through flashrt_kernels.rope_qk on CUDA: exact |
| ``decode_linear`` | "reference" | torch linears (cuBLAS on a GPU) |
|  | "batch_invariant" | flashrt_kernels.gemm.linear on decode / tree steps (bf16): faithful, |
|  |  | a row's result independent of the row count; q, k, v one launch (bit-equal), |
|  |  | gate, up + SwiGLU one launch (one rounding: faithful) |
| ``prefill_linear`` | "reference" | torch linears on prefill steps and in the vision tower |
|  | "batch_invariant" | flashrt_kernels.gemm.linear there too (bf16; bias added after): a |
|  |  | token's result independent of the step's token and image counts |
| ``rms_norm_kernel`` | bool | flashrt_kernels.rms_norm: faithful (1.5 ulp bf16), rows independent; |
|  |  | each residual add fused into the norm after it (exact) |
| ``swiglu_kernel`` | bool | flashrt_kernels.quant.silu_mul after torch's gate|up linear (text |
|  |  | prefill, vision MLP; bf16/fp16): faithful (the fp32 product rounded once) |
| ``gpu_preprocess`` | bool | exact: the same bytes as the CPU Pillow path |
| ``packed_prefill`` | bool | faithful: norms, projections and MLP over the live tokens only, |
|  |  | packed back to back (no work for padded slots or empty rows); attention |
|  |  | over the padded view with per-row query lengths |
| ``cuda_graphs`` | bool | the text step (last commit, embedding, packed forward, LM head, greedy |
|  |  | choice) and the vision tower (with gpu_preprocess) replayed from a |
|  |  | CUDA graph per token bucket (needs packed_prefill and gqa; on a CPU the |
|  |  | bucketed step runs eagerly): decode steps bit-identical to the eager |
|  |  | step, prefill steps faithful (cuBLAS sees the bucket's row count) |
| ``grammar_tree_budget`` | 0..256 | exact acceptance: greedy tokens identical to plain greedy up to the |
|  |  | forward's float rounding (bitwise with batch-invariant kernels); sampling distribution |
|  |  | unchanged |
| ``grammar_step_budget`` | 0..2048 | at most this many draft nodes per step over all rows, the most |
|  |  | likely first (each row at most ``grammar_tree_budget``; 0: no cap); exact |
|  |  | acceptance as above, so replies do not change, only the tree sizes |
| ``batch_size`` | >= 1 | rows replayed together; with reference kernels a row's numbers depend on |
|  |  | the batch's padded shape only through float rounding |
| ``vision_ahead`` | 0..8 | frames per row whose vision tower runs ahead of their turn, behind an |
|  |  | earlier step's text forward, at most ``batch_size`` frames a call (0: each |
|  |  | frame's vision runs in the step that starts it): the same embeddings |
|  |  | computed in other image batches: exact where the tower is batch-invariant |
|  |  | (``prefill_linear="batch_invariant"``), else faithful (cuBLAS sees other |
|  |  | image counts) |
| ``vision_stream`` | bool | the vision ahead on a CUDA stream of its own: the next text forward waits |
|  |  | for it only where it takes one of its frames (needs ``vision_ahead``): |
|  |  | exact (the same calls over the same frames, only their timing moves) |
| ``constrain_to_grammar`` | bool | benchmarks with random weights: logits outside the grammar masked |
| sampling | do_sample, temperature, top_p, repetition_penalty, seed | HF's order |
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from flashrt_activevln.model.ops import ATTENTION, INVARIANT_TREE, LINEARS
from flashrt_activevln.speculation import Sampling

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Options:
    attention_kernel: str = "reference"
    vision_kernel: str = "reference"
    decode_linear: str = "reference"
    prefill_linear: str = "reference"
    rms_norm_kernel: bool = False
    swiglu_kernel: bool = False
    gpu_preprocess: bool = False
    packed_prefill: bool = False
    cuda_graphs: bool = False
    grammar_tree_budget: int = 0
    grammar_step_budget: int = 0
    vision_ahead: int = 0
    vision_stream: bool = False
    batch_size: int = 1
    constrain_to_grammar: bool = False
    dataset: str = "r2r"
    max_new_tokens: int = 32
    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int = 0
    dtype: str = "bfloat16"

    def __post_init__(self):
        for name, allowed in (
            ("attention_kernel", ATTENTION),
            ("vision_kernel", ("reference", "segmented")),
            ("decode_linear", LINEARS),
            ("prefill_linear", LINEARS),
            ("dataset", ("r2r", "rxr")),
            ("dtype", tuple(DTYPES)),
        ):
            v = getattr(self, name)
            if v not in allowed:
                raise ValueError(f"option {name}={v!r}: expected one of {list(allowed)}")
        for name in ("packed_prefill", "cuda_graphs", "rms_norm_kernel", "swiglu_kernel",
                     "vision_stream"):  # fmt: skip
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"option {name}={getattr(self, name)!r}: expected a bool")
        if self.cuda_graphs and not (self.packed_prefill and self.attention_kernel != "reference"):
            raise ValueError(
                "option cuda_graphs=True needs packed_prefill=True and attention_kernel 'gqa' or "
                "'gqa_invariant' (the captured step is the packed forward over the pool kernel)"
            )
        if self.attention_kernel == "gqa_invariant" and not self.packed_prefill:
            raise ValueError(
                "option attention_kernel='gqa_invariant' needs packed_prefill=True (a row's "
                "causal chain and its tree are told apart by the live query counts)"
            )
        if self.attention_kernel == "gqa_invariant" and self.grammar_tree_budget >= INVARIANT_TREE:
            raise ValueError(
                f"option attention_kernel='gqa_invariant' verifies trees of at most "
                f"{INVARIANT_TREE - 1} nodes, got grammar_tree_budget={self.grammar_tree_budget}"
            )
        if (
            not isinstance(self.grammar_tree_budget, int)
            or not 0 <= self.grammar_tree_budget <= 256
        ):
            raise ValueError(
                f"option grammar_tree_budget={self.grammar_tree_budget!r}: expected an int in [0, 256]"
            )
        if (
            not isinstance(self.grammar_step_budget, int)
            or not 0 <= self.grammar_step_budget <= 2048
        ):
            raise ValueError(
                f"option grammar_step_budget={self.grammar_step_budget!r}: expected an int in "
                "[0, 2048]"
            )
        if not isinstance(self.vision_ahead, int) or not 0 <= self.vision_ahead <= 8:
            raise ValueError(
                f"option vision_ahead={self.vision_ahead!r}: expected an int in [0, 8]"
            )
        if self.vision_stream and not self.vision_ahead:
            raise ValueError(
                "option vision_stream=True needs vision_ahead >= 1 (it moves the vision ahead "
                "to a stream of its own)"
            )
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"option batch_size={self.batch_size!r}: expected an int >= 1")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"option max_new_tokens={self.max_new_tokens!r}: expected an int >= 1")
        if not self.do_sample and (self.temperature != 1.0 or self.top_p != 1.0):
            raise ValueError("options temperature / top_p only apply with do_sample=True")
        Sampling(self.do_sample, self.temperature, self.top_p, self.repetition_penalty)

    @property
    def sampling(self) -> Sampling:
        return Sampling(self.do_sample, self.temperature, self.top_p, self.repetition_penalty)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]


PRESETS = {
    "reference": Options(),
    "fast": Options(
        attention_kernel="gqa",
        vision_kernel="segmented",
        decode_linear="batch_invariant",
        rms_norm_kernel=True,
        swiglu_kernel=True,
        gpu_preprocess=True,
        packed_prefill=True,
        cuda_graphs=True,
        grammar_tree_budget=32,
        vision_ahead=2,
        batch_size=8,
    ),
}
# fast, with every kernel invariant to the step's composition: greedy replies identical with and
# without the tree and at every batch size, bit for bit (bf16 on a GPU; with the vision ahead
# too: checked on an H100, docs/activevln.md)
PRESETS["lossless"] = replace(
    PRESETS["fast"],
    attention_kernel="gqa_invariant",
    prefill_linear="batch_invariant",
)


def preset(name: str, **overrides) -> Options:
    """A named preset with option overrides; unknown names and options raise ValueError."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}: expected one of {sorted(PRESETS)}")
    known = {f.name for f in fields(Options)}
    bad = sorted(set(overrides) - known)
    if bad:
        raise ValueError(f"unknown option(s) {bad}: expected some of {sorted(known)}")
    return replace(PRESETS[name], **overrides)
