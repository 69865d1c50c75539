"""Checkpoint directories with Hugging Face parameter names.

A checkpoint directory holds ``config.json``, one or more ``*.safetensors`` files and (optionally)
``tokenizer.json``. Both HF layouts of the names are read: the released checkpoints'
(``visual.*``, ``model.*``, ``lm_head.weight``) and transformers 5's
(``model.visual.*``, ``model.language_model.*``); tensors are kept under the released names.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from flashrt_activevln.config import ModelConfig

_RENAMES = (("model.visual.", "visual."), ("model.language_model.", "model."))


def canonical_name(name: str) -> str:
    for old, new in _RENAMES:
        if name.startswith(old):
            return new + name[len(old) :]
    return name


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter of the model under its HF name, with its shape."""
    t, v = cfg.text, cfg.vision
    hd, kv = t.head_dim, t.num_kv_heads * t.head_dim
    s: dict[str, tuple[int, ...]] = {
        "visual.patch_embed.proj.weight": (
            v.hidden_size,
            v.in_channels,
            v.temporal_patch_size,
            v.patch_size,
            v.patch_size,
        ),
        "visual.merger.ln_q.weight": (v.hidden_size,),
        "visual.merger.mlp.0.weight": (v.hidden_size * v.merge_unit, v.hidden_size * v.merge_unit),
        "visual.merger.mlp.0.bias": (v.hidden_size * v.merge_unit,),
        "visual.merger.mlp.2.weight": (v.out_hidden_size, v.hidden_size * v.merge_unit),
        "visual.merger.mlp.2.bias": (v.out_hidden_size,),
        "model.embed_tokens.weight": (t.vocab_size, t.hidden_size),
        "model.norm.weight": (t.hidden_size,),
    }
    for i in range(v.depth):
        p = f"visual.blocks.{i}."
        s[p + "norm1.weight"] = (v.hidden_size,)
        s[p + "norm2.weight"] = (v.hidden_size,)
        s[p + "attn.qkv.weight"] = (3 * v.hidden_size, v.hidden_size)
        s[p + "attn.qkv.bias"] = (3 * v.hidden_size,)
        s[p + "attn.proj.weight"] = (v.hidden_size, v.hidden_size)
        s[p + "attn.proj.bias"] = (v.hidden_size,)
        for n in ("gate_proj", "up_proj"):
            s[p + f"mlp.{n}.weight"] = (v.intermediate_size, v.hidden_size)
            s[p + f"mlp.{n}.bias"] = (v.intermediate_size,)
        s[p + "mlp.down_proj.weight"] = (v.hidden_size, v.intermediate_size)
        s[p + "mlp.down_proj.bias"] = (v.hidden_size,)
    for i in range(t.num_layers):
        p = f"model.layers.{i}."
        s[p + "input_layernorm.weight"] = (t.hidden_size,)
        s[p + "post_attention_layernorm.weight"] = (t.hidden_size,)
        s[p + "self_attn.q_proj.weight"] = (t.num_heads * hd, t.hidden_size)
        s[p + "self_attn.q_proj.bias"] = (t.num_heads * hd,)
        for n in ("k_proj", "v_proj"):
            s[p + f"self_attn.{n}.weight"] = (kv, t.hidden_size)
            s[p + f"self_attn.{n}.bias"] = (kv,)
        s[p + "self_attn.o_proj.weight"] = (t.hidden_size, t.num_heads * hd)
        s[p + "mlp.gate_proj.weight"] = (t.intermediate_size, t.hidden_size)
        s[p + "mlp.up_proj.weight"] = (t.intermediate_size, t.hidden_size)
        s[p + "mlp.down_proj.weight"] = (t.hidden_size, t.intermediate_size)
    if not t.tie_word_embeddings:
        s["lm_head.weight"] = (t.vocab_size, t.hidden_size)
    return s


def load_config(path: str | Path) -> ModelConfig:
    path = Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise FileNotFoundError(f"checkpoint {path}: no config.json")
    return ModelConfig.from_hf(json.loads(cfg_file.read_text()))


def load_checkpoint(
    path: str | Path, dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu"
) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Reads config.json and every *.safetensors file; checks names and shapes against the config
    (missing or misshapen parameters raise ValueError naming them; unknown extras are ignored)."""
    from safetensors import safe_open

    path = Path(path)
    cfg = load_config(path)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"checkpoint {path}: no *.safetensors files")
    want = expected_shapes(cfg)
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        with safe_open(str(f), framework="pt", device="cpu") as fh:
            for key in fh.keys():
                name = canonical_name(key)
                if name in want or name == "lm_head.weight":
                    tensors[name] = fh.get_tensor(key).to(device=device, dtype=dtype)
    missing = [n for n in want if n not in tensors]
    if missing:
        raise ValueError(
            f"checkpoint {path}: missing {len(missing)} parameters, e.g. {missing[:3]}"
        )
    bad = [(n, tuple(tensors[n].shape), s) for n, s in want.items() if tuple(tensors[n].shape) != s]
    if bad:
        raise ValueError(f"checkpoint {path}: wrong shapes (name, got, want): {bad[:3]}")
    if "lm_head.weight" not in tensors or cfg.text.tie_word_embeddings:
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"]
    return cfg, tensors


def random_state(
    cfg: ModelConfig, seed: int = 0, std: float = 0.02, device="cpu", dtype=torch.float32
) -> dict[str, torch.Tensor]:
    """Seeded random parameters of every expected shape (norm weights near 1, biases of size
    std), drawn in float32 on ``device`` and cast to ``dtype``; tied lm_head included."""
    g = torch.Generator(device=device).manual_seed(seed)
    out = {}
    for name, shape in expected_shapes(cfg).items():
        x = torch.randn(shape, generator=g, device=device)
        if name.endswith("norm.weight") or "norm1" in name or "norm2" in name or "ln_q" in name:
            x = 1.0 + 0.1 * x
        else:
            x = std * x
        out[name] = x.to(dtype)
    if "lm_head.weight" not in out:
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out


def write_random_checkpoint(
    path: str | Path,
    cfg: ModelConfig,
    seed: int = 0,
    std: float = 0.02,
    tokenizer_json: str | None = None,
    dtype: torch.dtype = torch.float32,
) -> Path:
    """Writes config.json, model.safetensors (released HF names) and tokenizer.json if given."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg.to_hf(), indent=2))
    state = {
        k: v.to(dtype).contiguous()
        for k, v in random_state(cfg, seed, std).items()
        if k != "lm_head.weight" or not cfg.text.tie_word_embeddings
    }
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    if tokenizer_json is not None:
        (path / "tokenizer.json").write_text(tokenizer_json)
    return path


def load_tokenizer(path: str | Path):
    """The checkpoint's tokenizer.json through the `tokenizers` library."""
    from tokenizers import Tokenizer

    f = Path(path) / "tokenizer.json"
    if not f.is_file():
        raise FileNotFoundError(f"checkpoint {path}: no tokenizer.json")
    return Tokenizer.from_file(str(f))
