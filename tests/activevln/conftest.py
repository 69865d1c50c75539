"""A tiny tokenizer + random checkpoint written once per session and read by the real loaders."""

import pytest
import torch

from flashrt_activevln.model import Qwen25VL
from flashrt_activevln.processor import ActiveVLNProcessor
from flashrt_activevln.tiny_tokenizer import build_tiny_tokenizer, tiny_config_for
from flashrt_activevln.weights import load_checkpoint, load_tokenizer, write_random_checkpoint


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    tok, n = build_tiny_tokenizer()
    cfg = tiny_config_for(tok, n)
    path = tmp_path_factory.mktemp("tiny_ckpt")
    write_random_checkpoint(path, cfg, seed=1, std=0.3, tokenizer_json=tok.to_str())
    return path


@pytest.fixture(scope="session")
def tiny64(tiny_ckpt):
    """(config, float64 weights, processor)."""
    cfg, w = load_checkpoint(tiny_ckpt, dtype=torch.float64)
    return cfg, w, ActiveVLNProcessor(load_tokenizer(tiny_ckpt), cfg)


@pytest.fixture(scope="session")
def make_engine():
    from flashrt_activevln.runtime import Engine

    def make(tiny, options):
        cfg, w, proc = tiny
        return Engine(Qwen25VL(cfg, w, Engine.ops_for(options)), proc, options)

    return make
