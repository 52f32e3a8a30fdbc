"""Tiny Llama-, Qwen2- and GPT-2-like decoders, built from configs over the smoke words, offline.

For the proofs that need a decoder (test_models.py, test_fsdp.py) and for bench/model_families.py and
bench/lora_memory.py; no render ships them. Each family's tokenizer is shaped like the one it ships with:
Llama's with bos and eos but no pad token, padding on the left; GPT-2's byte-level, with one token for bos,
eos and unk, and no pad token; Qwen2's byte-level, padding with its eos token, which the model's config does
not name. `words` is the vocabulary to learn, the smoke module's WORDS.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerBase

DECODERS = ("llama", "qwen2", "gpt2")


def train_bpe(words: list[str], byte_level: bool,
              special_tokens: list[str]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """BPE vocabulary and merges learned from the words: every word becomes one token."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token=None if byte_level else special_tokens[0]))
    tokenizer.pre_tokenizer = (pre_tokenizers.ByteLevel(add_prefix_space=False) if byte_level
                               else pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always"))
    trainer = trainers.BpeTrainer(vocab_size=2048, special_tokens=special_tokens, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet() if byte_level else [])
    tokenizer.train_from_iterator([f"{word} {word}" for word in words], trainer)  # first in a text, and after one
    model = json.loads(tokenizer.to_str())["model"]
    return model["vocab"], [tuple(merge) for merge in model["merges"]]


def build_decoder_tokenizer(family: str, words: list[str]) -> PreTrainedTokenizerBase:
    from transformers import GPT2Tokenizer, LlamaTokenizer, Qwen2Tokenizer

    if family == "llama":
        vocab, merges = train_bpe(words, byte_level=False, special_tokens=["<unk>", "<s>", "</s>"])
        return LlamaTokenizer(vocab=vocab, merges=merges, add_bos_token=True, model_max_length=128)
    vocab, merges = train_bpe(words, byte_level=True, special_tokens=["<|endoftext|>"])
    tokenizer_class = {"gpt2": GPT2Tokenizer, "qwen2": Qwen2Tokenizer}[family]
    return tokenizer_class(vocab=vocab, merges=merges, model_max_length=128)


def make_tiny_decoder(family: str, folder: str | Path, words: list[str], seed: int = 0) -> Path:
    """Write tiny-<family>'s tokenizer and language model (2 layers of width 64) into folder, saved as its
    language model (the classifier head is new, as for a real checkpoint); the same arguments give the same
    files."""
    tokenizer = build_decoder_tokenizer(family, words)
    tokenizer.save_pretrained(folder)
    # GPT-2's config reads these names as its own n_embd, n_layer, n_head and n_positions.
    sizes = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=128)
    if family != "gpt2":
        sizes |= dict(intermediate_size=128, num_key_value_heads=1)
    config = AutoConfig.for_model(family, vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                                  eos_token_id=tokenizer.eos_token_id, **sizes)
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return Path(folder)
