"""Weights kept as stored (`open_folder(..., stored=True)`, the app's DECODER_LAB_WEIGHTS=stored, the command
line's --weights stored): a folder of bfloat16 weights stays bfloat16, half of float32's memory, and the
forward computes as transformers computes in bfloat16 (norms and the softmax in float32, rounded back;
rotary tables rounded to the weights' dtype). Two bfloat16 computations of the same model round at
different places, so they are held to each other within bfloat16's own rounding: our difference from
transformers' bfloat16 run is at most twice transformers' own bfloat16 rounding (its bfloat16 run against
its float32 run on the same weights), and the greedy continuation is the same. What readers get back
(logits, attention, scores) is float32, so every tool reads it as before.
"""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch

from model.families import open_folder
from model.generate import Decoder, Sampling, generate
from model.heads import head_scores
from model.inside import inside_cell
from model.interventions import Intervention
from model.transformer import logit_lens
from tests.support.families import PROMPTS, save_reference, sharpen

import transformers  # noqa: F401 - the reference: a missing package fails collection, never skips

VOCAB = 300
CASES = {  # config class, model class, options: GQA, an attention wider than d, a local window, q/k norms
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                      num_key_value_heads=2, intermediate_size=48)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                      num_key_value_heads=2, head_dim=16, intermediate_size=48)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1, head_dim=16,
        intermediate_size=48, sliding_window=4, query_pre_attn_scalar=16,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"])),
}
TEXT = PROMPTS[2] + " and the fox ran"


def bf16_folder(name: str, folder):
    config_class, model_class, options = CASES[name]
    cfg = getattr(transformers, config_class)(vocab_size=VOCAB, max_position_embeddings=64, bos_token_id=1,
                                              eos_token_id=0, attn_implementation="eager", **options)
    torch.manual_seed(0)
    ref = getattr(transformers, model_class)(cfg).eval()
    sharpen(ref, seed=1, gain=1.5)
    ref = ref.to(torch.bfloat16)
    save_reference(ref, folder / name, VOCAB)
    return ref, folder / name


@pytest.mark.parametrize("name", list(CASES))
def test_bfloat16_weights_stay_bfloat16_and_compute_as_transformers(name, tmp_path):
    ref, folder = bf16_folder(name, tmp_path)
    model, tok = open_folder(folder, stored=True)
    exact, _ = open_folder(folder)  # the same weights in float32
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in exact.parameters()} == {torch.float32}
    half = sum(p.numel() * p.element_size() for p in model.parameters())
    assert 2 * half == sum(p.numel() * p.element_size() for p in exact.parameters())
    ids = tok.encode(TEXT)
    x = torch.tensor([ids])
    with torch.no_grad():
        want = ref(x, output_attentions=True)
        want32 = copy.deepcopy(ref).float()(x, output_attentions=True)
        got = model(x, return_attention=True, return_residuals=True)
    assert got.logits.dtype == torch.float32 and all(a.dtype == torch.float32 for a in got.attentions)
    rounding = (want.logits.float() - want32.logits).abs().max()  # transformers' own bfloat16 rounding
    assert rounding > 0
    assert (got.logits - want.logits.float()).abs().max() <= 2 * rounding
    att_rounding = max((a.float() - b).abs().max() for a, b in zip(want.attentions, want32.attentions))
    for a, b in zip(got.attentions, want.attentions):
        assert (a - b.float()).abs().max() <= 2 * att_rounding + 2**-8
    with torch.no_grad():
        theirs = ref.generate(x, max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=None)
    dec = Decoder(model, ids, Sampling(temperature=0.0), eos_id=None, piece=tok.piece)
    assert [s.token_id for s in generate(dec, 6)] == theirs[0, len(ids):].tolist()
    # the tools read float32 numbers, whatever the weights
    lens = logit_lens(model, got.residuals[1:])
    assert lens.dtype == torch.float32 and torch.equal(lens[-1], got.logits)
    scores = head_scores([a[0].numpy() for a in got.attentions], ids)
    assert all(len(table) == model.cfg.n_layers for table in scores.values())
    with torch.no_grad():
        ablated = model(x, intervention=Intervention(heads=[(0, 0)], mode="zero")).logits
    assert ablated.dtype == torch.float32 and not torch.equal(ablated, got.logits)
    L = model.cfg.n_layers - 1
    cell = inside_cell(model, ids, L, 1, len(ids) - 1, 2)  # rebuilt in bfloat16: the forward's own weight
    assert cell.weight == float(got.attentions[L][0, 1, len(ids) - 1, 2])


def test_a_float32_folder_and_the_default_stay_float32(tmp_path):
    ref, folder = bf16_folder("llama", tmp_path)
    assert {p.dtype for p in open_folder(folder)[0].parameters()} == {torch.float32}
    ref.float().save_pretrained(tmp_path / "f32")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / "f32" / name).write_bytes((folder / name).read_bytes())
    assert {p.dtype for p in open_folder(tmp_path / "f32", stored=True)[0].parameters()} == {torch.float32}


def test_the_command_line_keeps_stored_weights_on_request(tmp_path):
    ref, folder = bf16_folder("qwen3", tmp_path)
    _, tok = open_folder(folder)
    ids = tok.encode(TEXT)
    with torch.no_grad():
        theirs = ref.generate(torch.tensor([ids]), max_new_tokens=4, do_sample=False, pad_token_id=0,
                              eos_token_id=None)[0, len(ids):].tolist()
    done = subprocess.run([sys.executable, "-m", "model.generate", "--checkpoint", str(folder), "--prompt", TEXT,
                           "--max-new-tokens", "4", "--temperature", "0", "--weights", "stored", "--json"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    import json
    assert [json.loads(line)["token_id"] for line in done.stdout.splitlines()] == theirs
    bad = subprocess.run([sys.executable, "-m", "model.generate", "--checkpoint", str(folder), "--prompt", TEXT,
                          "--weights", "int8"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "--weights" in bad.stderr


def test_kept_as_stored_a_16_bit_folder_may_hold_twice_float32s_parameters(tmp_path):
    """The size limit is 8 GB of weights: max_params in float32, twice that in a 16-bit dtype kept as stored
    (checked from config.json and the headers before any tensor is read)."""
    ref, folder = bf16_folder("llama", tmp_path)
    n = open_folder(folder)[0].n_params()
    limit = n * 3 // 4  # between n / 2 and n: too many for float32, few enough for bfloat16
    with pytest.raises(ValueError, match="parameters; the limit is"):
        open_folder(folder, max_params=limit)
    model, _ = open_folder(folder, max_params=limit, stored=True)
    assert model.tok_emb.weight.dtype == torch.bfloat16
    ref.float().save_pretrained(tmp_path / "f32")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / "f32" / name).write_bytes((folder / name).read_bytes())
    with pytest.raises(ValueError, match="in float32 the limit is .* kept as stored may have up to"):
        open_folder(tmp_path / "f32", max_params=limit, stored=True)
    with pytest.raises(ValueError, match="parameters; the limit is"):
        open_folder(folder, max_params=n // 3, stored=True)
