"""Llama folders (SmolLM2, TinyLlama) held to transformers' LlamaForCausalLM on random small models:
RMSNorm, rotate-half rotary re-laid, grouped-query attention, SwiGLU, BOS per the tokenizer."""

from __future__ import annotations

import pytest
import torch

from tests.support.families import check_against_reference, save_reference, sharpen
from model.families import open_folder
from model.heads import first_token

import transformers  # noqa: F401 - the reference: a missing package fails collection, never skips

VOCAB = 300
CASES = {
    # GQA 3:1, theta 100,000 (SmolLM2's), untied head, a tokenizer that prepends <s>
    "gqa": dict(hidden_size=24, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2,
                intermediate_size=40, rope_theta=100000.0),
    # one key/value head for all (multi-query), head size 4, tied head, biases on, no BOS
    "mqa_bias_tied": dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
                          intermediate_size=24, attention_bias=True, mlp_bias=True, tie_word_embeddings=True),
}
BOS = {"gqa": True, "mqa_bias_tied": False}


def build(name: str, folder):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=VOCAB, max_position_embeddings=40, bos_token_id=1, eos_token_id=0,
                      attn_implementation="eager", **CASES[name])
    torch.manual_seed(0)
    ref = LlamaForCausalLM(cfg).eval()
    sharpen(ref, seed=len(name))
    return ref, save_reference(ref, folder / name, VOCAB, bos=BOS[name])


@pytest.mark.parametrize("name", list(CASES))
def test_llama_matches_transformers(name, tmp_path):
    ref, folder = build(name, tmp_path)
    check_against_reference(ref, folder)


def test_bos_follows_the_tokenizer_and_groups_stay_grouped(tmp_path):
    _, folder = build("gqa", tmp_path)
    model, tok = open_folder(folder)
    assert tok.add_bos and tok.bos_id == 1 and tok.encode("Once")[0] == 1
    assert tok.piece(tok.bos_id) == "<s>"
    assert (model.cfg.n_heads, model.cfg.kv_heads, model.cfg.norm_kind) == (6, 2, "rmsnorm")
    # the projection holds 2 key/value heads, not 6; attention is still one map per query head
    assert model.blocks[0].attn.qkv.weight.shape == ((6 + 2 * 2) * 4, 24)
    ids = tok.encode(" the fox met the bear")
    att = model(torch.tensor([ids]), return_attention=True).attentions
    assert att[0].shape == (1, 6, len(ids), len(ids))
    assert first_token(att[0][0].detach().numpy()).shape == (6,)
    _, folder = build("mqa_bias_tied", tmp_path)
    _, tok = open_folder(folder)
    assert not tok.add_bos and tok.encode("Once")[0] != tok.bos_id


def test_rotary_angles_are_the_references_own(tmp_path):
    """Imported models turn queries and keys by exactly transformers' float32 angles (cos and sin
    equal bit for bit at every position), and stay within the bounds over a long text."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=VOCAB, max_position_embeddings=1024, bos_token_id=1, eos_token_id=0,
                      attn_implementation="eager", **CASES["gqa"])
    torch.manual_seed(0)
    ref = LlamaForCausalLM(cfg).eval()
    sharpen(ref, seed=7)
    model, _ = open_folder(save_reference(ref, tmp_path / "long", VOCAB, bos=True))
    positions = torch.arange(1024)[None]
    cos, sin = ref.model.rotary_emb(torch.zeros(1, dtype=torch.float32), positions)
    half = model.cfg.rope_dim // 2
    assert torch.equal(model.rope_cos, cos[0, :, :half]) and torch.equal(model.rope_sin, sin[0, :, :half])
    ids = torch.randint(2, VOCAB, (1, 1000), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, got = ref(ids, output_attentions=True), model(ids, return_attention=True)
    # float32 over 1,000 positions: a few dozen ulps of the largest logit (1.1e-5 of 9.4 on an AMD EPYC,
    # whose kernels sum in another order than the Xeons'), i.e. 3e-6 relative
    assert (got.logits - want.logits).abs().max() <= 3e-6 * want.logits.abs().max()
    assert max((a - b).abs().max() for a, b in zip(got.attentions, want.attentions)) <= 1e-6


def test_sentencepiece_style_tokenizer_json(tmp_path):
    """TinyLlama-style tokenizer.json (Metaspace ▁, byte fallback, a BOS post-processor): the same ids
    and text as transformers' tokenizer, pieces with ▁ shown as a space and bytes as text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from model.hf_tokenizer import HFFileTokenizer

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    for c in "▁abcdefghijklmnopqrstuvwxyzOT.":
        vocab.setdefault(c, len(vocab))
    merges = [("▁", "t"), ("▁t", "h"), ("▁th", "e"), ("o", "n")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>").save_pretrained(tmp_path)
    mine, ref = HFFileTokenizer.from_folder(tmp_path, family_adds_bos=True), AutoTokenizer.from_pretrained(tmp_path)
    for text in ["on the note", "Once é\nthe"]:
        ids = mine.encode(text)
        assert ids == ref(text)["input_ids"] and mine.decode(ids) == ref.decode(ids)
    assert mine.add_bos and mine.eos_id == 2
    assert [mine.piece(i) for i in mine.encode("the é")] == ["<s>", "␣the", "␣", "�", "�"]  # é is two bytes
    assert mine.text_of(vocab["<0x0A>"]) == "\n" and mine.piece(vocab["▁the"]) == "␣the"
