"""A folder of GPT-2 small's shape with random weights, for the tests that look at what a learner sees on a
real model: 12 layers × 12 heads, 768 wide, 50,257 tokens, 1,024 positions, saved by transformers.

Its tokenizer is a byte-level BPE of GPT-2's size: the merges a short English text gives first (so words
come out as GPT-2's pieces do, "␣fox", "␣together"), then pairs of byte symbols until the vocabulary holds
50,256 pieces and <|endoftext|>. The weights are `sharpen`ed so the attention and the next-token
distribution are far from uniform, as a trained model's are.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.support.families import TEXT, sharpen

VOCAB = 50_257
LAYERS = HEADS = 12
WIDTH = 768
CONTEXT = 1_024
WORDS = ("Anna found the key under the mat. She gave it to Tom because he asked. When Mary and John went to the "
         "store, John gave a drink to Mary. Colourless green ideas sleep furiously; the quick brown fox jumps over "
         "the lazy dog. Attention heads look back at earlier tokens of the sentence.\n")


def write_tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=2_000, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    trained.train_from_iterator([TEXT, WORDS * 4], trainer=trainer)
    vocab = dict(trained.get_vocab())
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m)
              for m in json.loads(trained.to_str())["model"]["merges"]]
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    for a in alphabet:  # pairs of byte symbols fill the vocabulary to GPT-2's size
        for b in alphabet:
            if len(vocab) >= VOCAB - 1:
                break
            if a + b not in vocab:
                merges.append((a, b))
                vocab[a + b] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    assert len(vocab) == VOCAB
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    fast.save_pretrained(folder)


def build_gpt2_small(folder: Path) -> Path:
    """GPT-2 small's shape (random, sharpened weights) saved in the Hugging Face layout in `folder`."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=VOCAB, n_positions=CONTEXT, n_embd=WIDTH, n_layer=LAYERS, n_head=HEADS,
                     bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(cfg).eval()
    sharpen(model, seed=3, conv1d=True)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    write_tokenizer(folder)
    return folder
