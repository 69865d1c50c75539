"""The baseline a user would run: HF transformers ``generate`` at B=1, one call per frame over the
whole conversation so far (benchmarks and tests only; the engine never imports this module).

Each call gets exactly our engine's context for that frame (the same prompt, frames and earlier
replies) and generates as many tokens as our reply has, so both do the same work; with
unconstrained greedy decoding its replies must equal ours token for token.
"""

from __future__ import annotations

import time

import torch

from flashrt_activevln.config import ModelConfig
from flashrt_activevln.processor import ActiveVLNProcessor
from flashrt_activevln.runtime import Episode, load_frame


def hf_model(cfg: ModelConfig, weights: dict[str, torch.Tensor]):
    """Qwen2_5_VLForConditionalGeneration holding ``weights`` (released HF names)."""
    import transformers

    from flashrt_activevln.model.vision import unpad_mlp

    weights = unpad_mlp(weights, cfg.vision)
    hf_cfg = transformers.Qwen2_5_VLConfig(**cfg.to_hf())
    dtype = weights["model.embed_tokens.weight"].dtype
    device = weights["model.embed_tokens.weight"].device
    with torch.device(device):
        model = transformers.Qwen2_5_VLForConditionalGeneration(hf_cfg).to(dtype)
    state = {}
    for name, t in weights.items():
        if name.startswith("visual."):
            state["model." + name] = t
        elif name.startswith("model."):
            state["model.language_model." + name[len("model.") :]] = t
        else:
            state[name] = t
    result = model.load_state_dict(state, strict=False)
    missing = [n for n in result.missing_keys if n != "lm_head.weight"]
    if missing:
        raise ValueError(f"hf_model: parameters not provided: {missing[:3]}")
    model.eval()
    model.model.rope_deltas = None
    return model


def replay_hf(model, proc: ActiveVLNProcessor, episodes: list[Episode], replies: dict):
    """replies: {(episode id, frame): token list} from our engine. Returns ({key: tokens},
    seconds per frame list). HF finds images by token equality, so an episode stops at the first
    reply that contains a vision special token (random weights can emit one)."""
    cfg = proc.cfg
    vision_ids = {cfg.image_token_id, cfg.video_token_id, cfg.vision_start_token_id}
    vision_ids.add(cfg.vision_end_token_id)
    dev = next(model.parameters()).device
    out, times = {}, []
    for ep in episodes:
        ids: list[int] = []
        pix, grids = [], []
        for j, f in enumerate(ep.frames):
            frame = load_frame(f)
            t0 = time.perf_counter()
            pv, grid = proc.preprocess_cpu(frame)
            pix.append(pv)
            grids.append(grid)
            turn = proc.turn(ep.instruction, j == 0, frame.shape[0], frame.shape[1])
            ids = ids + list(turn.ids)
            want = replies[(ep.id, j)]
            x = torch.tensor([ids], device=dev)
            with torch.no_grad():
                gen = model.generate(
                    input_ids=x,
                    attention_mask=torch.ones_like(x),
                    pixel_values=torch.cat(pix).to(dev),
                    image_grid_thw=torch.tensor(grids, device=dev),
                    mm_token_type_ids=(x == cfg.image_token_id).int(),
                    max_new_tokens=len(want),
                    min_new_tokens=len(want),
                    do_sample=False,
                    eos_token_id=None,
                    pad_token_id=cfg.eos_token_ids[-1],
                )
            if dev.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            out[(ep.id, j)] = gen[0, x.shape[1] :].tolist()
            if vision_ids & set(want):
                break
            ids = ids + list(want)
            if want[-1] != cfg.eos_token_ids[0]:
                ids.append(cfg.eos_token_ids[0])
    return out, times
