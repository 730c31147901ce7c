"""A tiny Llama with random weights and its own tokenizer, made here (nothing downloaded).

vLLM serves it on CPU like any Hugging Face model directory. ``initializer_range=0.2``
(ten times Llama's default) spreads the logits, so greedy output depends on the context and
differs between prompts: an engine that got wrong KV would say something else. Head size 64
is one the CPU attention backend supports.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

VOCAB = 2048
WORDS = 600


def corpus(seed: int = 0, lines: int = 2000) -> list[str]:
    """Sentences of made-up words: enough text for a BPE tokenizer of ``VOCAB`` tokens."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choices(letters, k=rng.randint(2, 8))) for _ in range(WORDS)]
    return [" ".join(rng.choices(words, k=rng.randint(5, 30))) + "." for _ in range(lines)]


def prompt_ids(tokens: int, seed: int) -> list[int]:
    """A prompt of exactly ``tokens`` token ids (none of the special ones), one per seed."""
    rng = random.Random(seed)
    return [rng.randrange(3, VOCAB) for _ in range(tokens)]


def build(directory: Path) -> Path:
    """Writes the model and tokenizer into ``directory`` (once: kept if already there)."""
    if (directory / "config.json").exists() and (directory / "tokenizer.json").exists():
        return directory
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<unk>", "<s>", "</s>"])
    tokenizer.train_from_iterator(corpus(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    fast.save_pretrained(directory)

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=4096,
        initializer_range=0.2,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(directory)
    (directory / "made_by.json").write_text(json.dumps({"by": "tests/vllm/e2e/tiny_model.py"}))
    return directory


if __name__ == "__main__":
    print(build(Path(sys.argv[1])))
