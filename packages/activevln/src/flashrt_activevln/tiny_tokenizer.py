"""A small word-level tokenizer (``tokenizers`` library) for tests and the demo: the words of the
prompt template, the action grammars and the synthetic instructions, digits one per token like
Qwen's, and the Qwen special tokens at the end of the vocabulary."""

from __future__ import annotations

import re

from flashrt_activevln.grammar import replies
from flashrt_activevln.processor import FIRST_PREFIX, NEXT_PREFIX, SYSTEM, TASK

SPECIALS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
INSTRUCTION_WORDS = (
    "walk go exit turn left right past the kitchen bedroom hallway stairs door table sofa wait "
    "stop at into through and then until you reach near down up enter bathroom living room. , "
    "move forward system Decide"
).split()
PIECE = r" ?[A-Za-z]+|\d| ?[^\sA-Za-z\d]+|\s+"


def _pieces(text: str) -> list[str]:
    return re.findall(PIECE, text)


QWEN_SPECIAL_IDS = {
    "<|endoftext|>": 151643,
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<|vision_start|>": 151652,
    "<|vision_end|>": 151653,
    "<|image_pad|>": 151655,
    "<|video_pad|>": 151656,
}


def build_tiny_tokenizer(qwen_ids: bool = False):
    """Returns (tokenizers.Tokenizer, vocab size). ``qwen_ids=True`` puts the special tokens at
    Qwen2.5-VL's ids (for random checkpoints of the real config, vocabulary 151936)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    texts = [SYSTEM.replace("<|im_start|>", " ").replace("<|im_end|>", " "), FIRST_PREFIX]
    texts += [NEXT_PREFIX, TASK.format(instruction=""), "user\n", "assistant\n", "\n"]
    texts += replies("r2r") + replies("rxr")
    texts += [" " + w for w in INSTRUCTION_WORDS] + INSTRUCTION_WORDS
    vocab: dict[str, int] = {"[UNK]": 0}
    for t in texts:
        for p in _pieces(t):
            vocab.setdefault(p, len(vocab))
    for s in SPECIALS:
        vocab[s] = QWEN_SPECIAL_IDS[s] if qwen_ids else len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(PIECE), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(list(SPECIALS))
    return tok, max(vocab.values()) + 1


def tiny_config_for(tokenizer, vocab_size: int):
    from flashrt_activevln.config import tiny

    ids = {s: tokenizer.token_to_id(s) for s in SPECIALS}
    return tiny(
        vocab_size=vocab_size,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        eos_token_ids=(ids["<|im_end|>"], ids["<|endoftext|>"]),
    )
