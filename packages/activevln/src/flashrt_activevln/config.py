"""Model configuration: the real Qwen2.5-VL-3B (ActiveVLN) shapes and a tiny one for tests.

``ModelConfig.from_hf`` reads a Hugging Face ``config.json`` in either layout (text fields at the
top level, as the released checkpoints have them, or under ``text_config``); ``to_hf`` writes the
top-level layout, which HF transformers also reads.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace


@dataclass(frozen=True)
class TextConfig:
    vocab_size: int = 151936
    hidden_size: int = 2048
    intermediate_size: int = 11008
    num_layers: int = 36
    num_heads: int = 16
    num_kv_heads: int = 2
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1000000.0
    mrope_section: tuple[int, int, int] = (16, 24, 24)
    tie_word_embeddings: bool = True

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


@dataclass(frozen=True)
class VisionConfig:
    depth: int = 32
    hidden_size: int = 1280
    intermediate_size: int = 3420
    num_heads: int = 16
    in_channels: int = 3
    patch_size: int = 14
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    window_size: int = 112
    out_hidden_size: int = 2048
    fullatt_block_indexes: tuple[int, ...] = (7, 15, 23, 31)
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @property
    def merge_unit(self) -> int:
        return self.spatial_merge_size**2


@dataclass(frozen=True)
class ModelConfig:
    text: TextConfig = field(default_factory=TextConfig)
    vision: VisionConfig = field(default_factory=VisionConfig)
    image_token_id: int = 151655
    video_token_id: int = 151656
    vision_start_token_id: int = 151652
    vision_end_token_id: int = 151653
    eos_token_ids: tuple[int, ...] = (151645, 151643)

    def __post_init__(self):
        t, v = self.text, self.vision
        if t.hidden_size % t.num_heads or t.num_heads % t.num_kv_heads:
            raise ValueError("text: hidden_size must split into num_heads, num_heads into kv heads")
        if sum(t.mrope_section) * 2 != t.head_dim:
            raise ValueError(f"text: 2 * sum(mrope_section) must equal head_dim {t.head_dim}")
        if v.hidden_size % v.num_heads or v.head_dim % 4:
            raise ValueError("vision: head_dim must be an integer multiple of 4")
        if v.out_hidden_size != t.hidden_size:
            raise ValueError("vision.out_hidden_size must equal text.hidden_size")
        if any(not 0 <= i < v.depth for i in v.fullatt_block_indexes):
            raise ValueError("vision.fullatt_block_indexes must lie in [0, depth)")
        ids = (self.image_token_id, self.vision_start_token_id, self.vision_end_token_id)
        if any(not 0 <= i < t.vocab_size for i in ids + self.eos_token_ids):
            raise ValueError("special token ids must lie inside the vocabulary")

    @classmethod
    def from_hf(cls, d: dict) -> ModelConfig:
        td = d.get("text_config") or d
        vd = d["vision_config"]
        rope = td.get("rope_scaling") or td.get("rope_parameters") or {}
        theta = td.get("rope_theta", rope.get("rope_theta", 1000000.0))
        eos = d.get("eos_token_id", td.get("eos_token_id", 151645))
        eos = tuple(eos) if isinstance(eos, list) else (eos,)
        text = TextConfig(
            vocab_size=td["vocab_size"],
            hidden_size=td["hidden_size"],
            intermediate_size=td["intermediate_size"],
            num_layers=td["num_hidden_layers"],
            num_heads=td["num_attention_heads"],
            num_kv_heads=td.get("num_key_value_heads", td["num_attention_heads"]),
            rms_norm_eps=td.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            mrope_section=tuple(rope.get("mrope_section", (16, 24, 24))),
            tie_word_embeddings=d.get("tie_word_embeddings", td.get("tie_word_embeddings", False)),
        )
        vision = VisionConfig(
            depth=vd["depth"],
            hidden_size=vd["hidden_size"],
            intermediate_size=vd["intermediate_size"],
            num_heads=vd["num_heads"],
            in_channels=vd.get("in_channels", vd.get("in_chans", 3)),
            patch_size=vd.get("patch_size", 14),
            temporal_patch_size=vd.get("temporal_patch_size", 2),
            spatial_merge_size=vd.get("spatial_merge_size", 2),
            window_size=vd.get("window_size", 112),
            out_hidden_size=vd.get("out_hidden_size", text.hidden_size),
            fullatt_block_indexes=tuple(vd.get("fullatt_block_indexes", (7, 15, 23, 31))),
        )
        return cls(
            text=text,
            vision=vision,
            image_token_id=d.get("image_token_id", 151655),
            video_token_id=d.get("video_token_id", 151656),
            vision_start_token_id=d.get("vision_start_token_id", 151652),
            vision_end_token_id=d.get("vision_end_token_id", 151653),
            eos_token_ids=eos,
        )

    def to_hf(self) -> dict:
        t, v = self.text, self.vision
        return {
            "architectures": ["Qwen2_5_VLForConditionalGeneration"],
            "model_type": "qwen2_5_vl",
            "vocab_size": t.vocab_size,
            "hidden_size": t.hidden_size,
            "intermediate_size": t.intermediate_size,
            "num_hidden_layers": t.num_layers,
            "num_attention_heads": t.num_heads,
            "num_key_value_heads": t.num_kv_heads,
            "hidden_act": "silu",
            "rms_norm_eps": t.rms_norm_eps,
            "rope_theta": t.rope_theta,
            "rope_scaling": {"type": "mrope", "mrope_section": list(t.mrope_section)},
            "max_position_embeddings": 128000,
            "tie_word_embeddings": t.tie_word_embeddings,
            "use_sliding_window": False,
            "image_token_id": self.image_token_id,
            "video_token_id": self.video_token_id,
            "vision_start_token_id": self.vision_start_token_id,
            "vision_end_token_id": self.vision_end_token_id,
            "bos_token_id": self.eos_token_ids[-1],
            "eos_token_id": self.eos_token_ids[0],
            "vision_config": {
                "depth": v.depth,
                "hidden_size": v.hidden_size,
                "intermediate_size": v.intermediate_size,
                "num_heads": v.num_heads,
                "in_chans": v.in_channels,
                "in_channels": v.in_channels,
                "patch_size": v.patch_size,
                "temporal_patch_size": v.temporal_patch_size,
                "spatial_merge_size": v.spatial_merge_size,
                "window_size": v.window_size,
                "out_hidden_size": v.out_hidden_size,
                "fullatt_block_indexes": list(v.fullatt_block_indexes),
                "hidden_act": "silu",
                "tokens_per_second": 2,
            },
        }

    def as_dict(self) -> dict:
        return asdict(self)


def qwen25_vl_3b() -> ModelConfig:
    """Qwen2.5-VL-3B-Instruct, the base of the ActiveVLN checkpoints."""
    return ModelConfig()


def tiny(vocab_size: int = 160, **special_ids) -> ModelConfig:
    """A few-layer model with the real structure (GQA, M-RoPE, windowed + full vision blocks,
    2x2 merge); small enough to run in float64 on a CPU in tests."""
    text = TextConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=96,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        mrope_section=(2, 3, 3),
        tie_word_embeddings=True,
    )
    vision = VisionConfig(
        depth=3,
        hidden_size=32,
        intermediate_size=48,
        num_heads=2,
        window_size=56,
        out_hidden_size=64,
        fullatt_block_indexes=(1,),
    )
    cfg = ModelConfig(
        text=text,
        vision=vision,
        image_token_id=vocab_size - 4,
        video_token_id=vocab_size - 5,
        vision_start_token_id=vocab_size - 3,
        vision_end_token_id=vocab_size - 2,
        eos_token_ids=(vocab_size - 1,),
    )
    return replace(cfg, **special_ids) if special_ids else cfg
