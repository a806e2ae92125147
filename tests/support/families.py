"""Shared by tests/engine/test_families_*.py: small random models built with transformers' own classes,
saved with save_pretrained beside a byte-level BPE tokenizer.json trained here, and the checks
that hold model.families' import of them to transformers (the reference implementation).
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from model.families import open_folder
from model.generate import Decoder, Sampling, generate
from model.heads import head_scores
from model.interventions import AttentionEdit, Intervention
from model.transformer import KVCache, logit_lens

TEXT = ("Once upon a time there was a little fox. The fox liked to run in the green wood. "
        "One day the fox met a bear, and the bear said hello to the fox. They ran together.\n") * 4
PROMPTS = ["Once upon a time", " the fox met", "They ran together. The bear"]
LOGIT_TOL, ATTN_TOL = 1e-5, 1e-6


def write_tokenizer(folder: Path, vocab_size: int, bos: bool = False) -> None:
    """A byte-level BPE tokenizer.json (GPT-2's scheme) with <s> / </s>, and its tokenizer_config.json
    written by transformers (so transformers' own tokenizer reads the same files). bos=True puts a
    post-processor that prepends <s>, as Llama tokenizers do."""
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["</s>", "<s>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TEXT], trainer=trainer)
    if bos:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                           special_tokens=[("<s>", tok.token_to_id("<s>"))])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(folder)


def sharpen(model: torch.nn.Module, seed: int = 0, gain: float = 2.0, conv1d: bool = False) -> None:
    """Random weights large enough that attention and the next-token distribution are far from
    uniform: N(0, gain^2 / fan_in) matrices (gain 1 for queries and keys), N(0, 1) embeddings,
    norms' weights around 1."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if p.dim() == 1 and ("norm" in name or "ln" in name) and name.endswith("weight"):
                p.copy_(1.0 + 0.3 * noise)
            elif p.dim() == 1:
                p.copy_(0.2 * noise)
            elif "wte" in name or "wpe" in name or "embed" in name:
                p.copy_(noise)
            else:
                conv = conv1d and any(part in name for part in ("c_attn", "c_proj", "c_fc"))
                fan_in = p.shape[0] if conv else p.shape[1]  # GPT-2's Conv1D stores (in, out)
                # query/key projections at gain 1: scores stay near 10, where float32 still resolves
                # attention to 1e-6 (at scores near 20 its rounding alone moves weights by 1e-6)
                qk = any(part in name for part in ("c_attn", "q_proj", "k_proj", "query_key_value"))
                p.copy_(noise * (1.0 if qk else gain) / math.sqrt(fan_in))


def save_reference(model: torch.nn.Module, folder: Path, vocab_size: int, bos: bool = False, **save) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, **save)
    write_tokenizer(folder, vocab_size, bos)
    return folder


def hf_tokenizer(folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def check_against_reference(ref: torch.nn.Module, folder: Path, prompts=PROMPTS, new_tokens: int = 6) -> None:
    """Every check of the issue against transformers, on each prompt (see the module docstring)."""
    model, tok = open_folder(folder)
    ref_tok = hf_tokenizer(folder)
    ref.eval()
    for prompt in prompts:
        ids = tok.encode(prompt)
        assert ids == ref_tok(prompt)["input_ids"], "token ids differ from transformers' tokenizer"
        assert tok.decode(ids) == ref_tok.decode(ids), "decoded text differs from transformers' tokenizer"
        x = torch.tensor([ids])
        with torch.no_grad():
            want = ref(x, output_attentions=True)
            got = model(x, return_attention=True)
        # far from uniform: the reference's most likely next token has a clear lead
        p = torch.softmax(want.logits[0, -1], -1)
        assert p.max() > 5 / p.numel(), "the reference's distribution is too flat to test anything"
        V = model.cfg.vocab_size
        assert torch.allclose(got.logits, want.logits[..., :V], atol=LOGIT_TOL, rtol=0), \
            f"logits differ by {(got.logits - want.logits).abs().max():.2e}"
        assert len(got.attentions) == len(want.attentions)
        for layer, (a, b) in enumerate(zip(got.attentions, want.attentions)):
            assert a.shape == b.shape
            diff = (a - b).abs().max()
            assert diff <= ATTN_TOL, f"layer {layer} attention differs by {diff:.2e}"
        check_cache_and_tools(model, ids)
        # greedy continuation, token by token through the app's one generation loop
        dec = Decoder(model, ids, Sampling(temperature=0.0), eos_id=None, piece=tok.piece)
        ours = [s.token_id for s in generate(dec, new_tokens)]
        with torch.no_grad():
            # rows past the tokenizer (padding) are never sampled: the reference is told the same
            padded = list(range(tok.vocab_size, V))
            theirs = ref.generate(x, max_new_tokens=new_tokens, do_sample=False, pad_token_id=0, eos_token_id=None,
                                  suppress_tokens=padded or None)[0, len(ids):].tolist()
        assert ours == theirs, f"greedy continuation {ours} != transformers' {theirs}"
        # the same through the fused kernel and the cache, attention not captured
        dec = Decoder(model, ids, Sampling(temperature=0.0), eos_id=None, piece=tok.piece)
        assert [s.token_id for s in generate(dec, new_tokens, attention="none")] == theirs


def check_cache_and_tools(model, ids: list[int]) -> None:
    """KV-cached rows equal recomputing; interventions, logit lens and head scores run and mean
    what they say on this model's options."""
    x = torch.tensor([ids])
    # The cache is checked in float64, where a one-row step and the whole text (the same sums in
    # another order) agree far below any difference a wrong position, mask or cache would make.
    exact = copy.deepcopy(model).double()
    with torch.no_grad():
        full = exact(x, return_attention=True)
        cache, logits = KVCache([]), []
        for t in range(len(ids)):
            step = exact(x[:, t : t + 1], return_attention=True, cache=cache)
            cache = step.cache
            logits.append(step.logits[0, -1])
            for layer, a in enumerate(step.attentions):
                assert torch.allclose(a[0, :, 0], full.attentions[layer][0, :, t, : t + 1], atol=1e-12, rtol=0)
    assert torch.allclose(torch.stack(logits), full.logits[0], atol=1e-9, rtol=0)
    with torch.no_grad():  # torch's fused kernel (no weights to show) with the same mask and scale
        fused = exact(x)
        fused_step = exact(x[:, -1:], cache=exact(x[:, :-1], cache=KVCache([])).cache)
    assert torch.allclose(fused.logits, full.logits, atol=1e-9, rtol=0)
    assert torch.allclose(fused_step.logits[0, -1], full.logits[0, -1], atol=1e-9, rtol=0)
    with torch.no_grad():
        full = model(x, return_attention=True, return_residuals=True)
    # the logit lens's last row is the model's own logits, exactly
    lens = logit_lens(model, full.residuals[1:])
    assert torch.equal(lens[-1], full.logits)
    # zero-ablating a head changes the output; an edited row is the row the forward used
    L, H = model.cfg.n_layers, model.cfg.n_heads
    with torch.no_grad():
        ablated = model(x, intervention=Intervention(heads=[(L - 1, H - 1)], mode="zero")).logits
        q = len(ids) - 1
        edited = model(x, return_attention=True,
                       intervention=Intervention(edits=[AttentionEdit(0, 0, q, None)]))
    assert not torch.equal(ablated, full.logits)
    row = edited.attentions[0][0, 0, q]
    allowed = row > 0
    assert torch.allclose(row[allowed], torch.full_like(row[allowed], 1.0 / int(allowed.sum())))
    scores = head_scores([a[0].numpy() for a in full.attentions], ids)
    for name, table in scores.items():
        assert np.asarray(table).shape[:2] == (L, H), name


def save_random_gpt2(folder: Path, n_layer: int, n_head: int, n_embd: int) -> Path:
    """A sharpened random GPT-2 folder of this shape (300 tokens, 64 positions): a model of many heads for the
    browser tests (transformers' own class, saved with the byte-level tokenizer)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_positions=64, vocab_size=300, n_embd=n_embd, n_layer=n_layer, n_head=n_head, bos_token_id=1,
                     eos_token_id=0)
    torch.manual_seed(0)
    ref = GPT2LMHeadModel(cfg).eval()
    sharpen(ref, seed=3, conv1d=True)
    return save_reference(ref, folder, 300)
