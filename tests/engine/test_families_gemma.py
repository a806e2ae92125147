"""Gemma 2 and Gemma 3 text folders held to transformers' Gemma2ForCausalLM / Gemma3ForCausalLM (eager
attention) on random small models: RMSNorm times (1 + w), the embedding scaled by sqrt(d), four norms per
layer, heads wider or narrower than d / heads, the query_pre_attn_scalar score scale, local layers whose
window is shorter than the prompts, soft-capped scores and logits (Gemma 2), per-head q/k norms and a
rotary base per layer type with linear scaling on the global layers (Gemma 3), GeGLU, BOS first.
Both config.json forms (transformers 5's and the older keys), Gemma 3's nested text_config, and the
command lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from model.checkpoint import load_checkpoint
from model.families import open_folder
from tests.support.families import PROMPTS, check_against_reference, hf_tokenizer, save_reference, sharpen

import transformers  # noqa: F401 - the reference: a missing package fails collection, never skips

ROOT = Path(__file__).resolve().parents[2]
VOCAB = 300
COMMON = dict(vocab_size=VOCAB, max_position_embeddings=64, bos_token_id=1, eos_token_id=0, pad_token_id=0,
              attn_implementation="eager")
CASES = {
    # one key/value head, heads 10 wide (d / heads = 6), scores scaled by 1/sqrt(24), every other layer
    # local with a window of 3 keys, scores capped at 5 and logits at 8
    "gemma2_mqa_capped": dict(hidden_size=24, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1,
                              head_dim=10, intermediate_size=40, query_pre_attn_scalar=24, sliding_window=3,
                              attn_logit_softcapping=5.0, final_logit_softcapping=8.0),
    # biases on q, k, v and the output, an untied head, the exact GELU, layer types given one by one,
    # heads narrower than d / heads, no logit cap, theta 1,000
    "gemma2_bias_untied": dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                               head_dim=6, intermediate_size=48, query_pre_attn_scalar=12, sliding_window=4,
                               attention_bias=True, tie_word_embeddings=False, hidden_activation="gelu",
                               layer_types=["full_attention", "sliding_attention", "sliding_attention"],
                               final_logit_softcapping=None, rope_parameters={"rope_type": "default",
                                                                              "rope_theta": 1000.0}),
    # local layers with a base of 100, global ones with 50,000 slowed 4 times (linear), a window of 3,
    # one global layer in two, GQA 2:1, logits capped at 4
    "gemma3_scaled": dict(hidden_size=24, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=10, intermediate_size=40, query_pre_attn_scalar=24, sliding_window=3,
                          sliding_window_pattern=2, final_logit_softcapping=4.0,
                          rope_parameters={
                              "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 50000.0},
                              "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}}),
    # one key/value head, heads 16 wide (d / heads = 8), an untied head, the global layer in the middle
    "gemma3_mqa_untied": dict(hidden_size=16, num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1,
                              head_dim=16, intermediate_size=32, query_pre_attn_scalar=20, sliding_window=4,
                              tie_word_embeddings=False,
                              layer_types=["sliding_attention", "full_attention", "sliding_attention"]),
}


def reference_classes(name: str):
    from transformers import Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig

    return (Gemma2Config, Gemma2ForCausalLM) if name.startswith("gemma2") else (Gemma3TextConfig, Gemma3ForCausalLM)


def gemma_sharpen(ref: torch.nn.Module, seed: int) -> None:
    """`sharpen`, then the norms' stored weights around 0 (Gemma multiplies by 1 + w: a scale around 1),
    and the embedding's rows around 1/sqrt(d) (Gemma multiplies them by sqrt(d)), so every layer's
    output counts in the residual stream beside the embedding."""
    sharpen(ref, seed=seed)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if p.dim() == 1 and "norm" in name:
                p.sub_(1.0)
            elif "embed_tokens" in name:
                p.mul_(ref.config.hidden_size ** -0.5)


def build(name: str, folder: Path):
    config_class, model_class = reference_classes(name)
    torch.manual_seed(0)
    ref = model_class(config_class(**COMMON, **CASES[name])).eval()
    gemma_sharpen(ref, seed=len(name))
    return ref, save_reference(ref, folder / name, VOCAB, bos=True)


@pytest.mark.parametrize("name", list(CASES))
def test_gemma_matches_transformers(name, tmp_path):
    ref, folder = build(name, tmp_path)
    check_against_reference(ref, folder)


def test_config_json_becomes_the_engines_options(tmp_path):
    ref, folder = build("gemma3_scaled", tmp_path)
    model, tok = open_folder(folder)
    cfg = model.cfg
    assert (cfg.head_dim, cfg.attn_dim, cfg.d_model, cfg.kv_heads) == (10, 40, 24, 2)
    assert cfg.attn_window == (3, 0, 3, 0) and cfg.query_scale_dim == 24
    assert (cfg.pe_base, cfg.rope_scaling, cfg.local_rope_base) == (50000.0, ("linear", 4.0), 100.0)
    assert (cfg.norm, cfg.norm_offset, cfg.qk_norm, cfg.activation, cfg.gelu_approximate) == \
        ("sandwich", 1.0, "head", "geglu", "tanh")
    assert cfg.attn_softcap is None and cfg.logit_softcap == 4.0 and cfg.tie_weights
    # the embedding's scale is transformers' own number, rounded to the weights' dtype as it rounds it
    assert torch.tensor(cfg.embed_scale, dtype=torch.float32) == ref.model.embed_tokens.embed_scale.float()
    assert tok.add_bos and tok.encode("Once")[0] == tok.bos_id == 1
    # local layers turn with their own base, global ones with the scaled one: both tables are transformers'
    rotary = ref.model.rotary_emb
    positions = torch.arange(64)[None]
    half = cfg.rope_dim // 2
    for kind, cos_table in (("full_attention", model.rope_cos), ("sliding_attention", model.rope_local_cos)):
        cos, _ = rotary(torch.zeros(1), positions, kind)
        assert torch.equal(cos_table, cos[0, :, :half]), kind
    _, folder = build("gemma2_mqa_capped", tmp_path)
    cfg = open_folder(folder)[0].cfg
    assert cfg.attn_window == (3, 0, 3) and (cfg.attn_softcap, cfg.logit_softcap) == (5.0, 8.0)
    assert cfg.qk_norm == "none" and cfg.local_rope_base is None and cfg.kv_heads == 1 and cfg.attn_dim == 40


@pytest.mark.parametrize("name", ["gemma2_mqa_capped", "gemma3_scaled"])
def test_a_local_layer_sees_its_last_window_keys(name, tmp_path):
    """sliding_window w: a query of a local layer reads the last w keys, its own included (as transformers'
    mask does, here on a text four times longer than the window); a global layer reads every earlier key."""
    ref, folder = build(name, tmp_path)
    model, tok = open_folder(folder)
    ids = tok.encode(PROMPTS[-1])
    assert len(ids) >= 4 * 3
    with torch.no_grad():
        ours = model(torch.tensor([ids]), return_attention=True).attentions
        theirs = ref(torch.tensor([ids]), output_attentions=True).attentions
    for layer, (a, b) in enumerate(zip(ours, theirs)):
        seen = (a[0] > 0).sum(-1)  # (H, T): keys each query read
        w = model.cfg.window(layer) or len(ids)
        assert torch.equal(seen, (b[0] > 0).sum(-1))
        assert seen.tolist() == [[min(t + 1, w) for t in range(len(ids))]] * model.cfg.n_heads, layer
        assert (a - b).abs().max() <= 1e-6


# config.json files shaped like the published ones (written by transformers 4.4x-4.5x: the older rope keys,
# Gemma 3 270M's layer_types beside them), read without weights
PUBLISHED = {
    "gemma-2-2b": dict(model_type="gemma2", attn_logit_softcapping=50.0, cache_implementation="hybrid",
                       final_logit_softcapping=30.0, head_dim=256, hidden_act="gelu_pytorch_tanh",
                       hidden_activation="gelu_pytorch_tanh", hidden_size=2304, intermediate_size=9216,
                       max_position_embeddings=8192, num_attention_heads=8, num_hidden_layers=26,
                       num_key_value_heads=4, query_pre_attn_scalar=256, rms_norm_eps=1e-06, rope_theta=10000.0,
                       sliding_window=4096, vocab_size=256000),
    "gemma-3-270m": dict(model_type="gemma3_text", _sliding_window_pattern=6, attn_logit_softcapping=None,
                         final_logit_softcapping=None, head_dim=256, hidden_activation="gelu_pytorch_tanh",
                         hidden_size=640, intermediate_size=2048,
                         layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 3,
                         max_position_embeddings=32768, num_attention_heads=4, num_hidden_layers=18,
                         num_key_value_heads=1, query_pre_attn_scalar=256, rms_norm_eps=1e-06,
                         rope_local_base_freq=10000.0, rope_scaling=None, rope_theta=1000000.0, sliding_window=512,
                         use_bidirectional_attention=False, vocab_size=262144),
    "gemma-3-4b-text": dict(model_type="gemma3_text", head_dim=256, hidden_size=2560, intermediate_size=10240,
                            max_position_embeddings=131072, num_attention_heads=8, num_hidden_layers=34,
                            num_key_value_heads=4, query_pre_attn_scalar=256, rope_local_base_freq=10000.0,
                            rope_scaling={"factor": 8.0, "rope_type": "linear"}, rope_theta=1000000.0,
                            sliding_window=1024, sliding_window_pattern=6, vocab_size=262208),
}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_published_config_json_files_read_as_transformers_reads_them(name):
    """Each layer's window and rotary (base, scaling) as transformers' own config class makes them."""
    from transformers import AutoConfig

    from model.families import family_of

    hf = PUBLISHED[name]
    theirs = AutoConfig.for_model(**hf)
    cfg = family_of(hf).model_config(hf)
    assert cfg.attn_window == tuple(theirs.sliding_window if kind == "sliding_attention" else 0
                                    for kind in theirs.layer_types)
    assert (cfg.head_dim, cfg.query_scale_dim, cfg.kv_heads) == (theirs.head_dim, theirs.query_pre_attn_scalar,
                                                                  theirs.num_key_value_heads)
    assert (cfg.attn_softcap, cfg.logit_softcap) == (theirs.attn_logit_softcapping, theirs.final_logit_softcapping)
    rope = theirs.rope_parameters
    if name.startswith("gemma-2"):
        assert (cfg.pe_base, cfg.rope_scaling, cfg.local_rope_base) == (rope["rope_theta"], (), None)
        return
    full, local = rope["full_attention"], rope["sliding_attention"]
    scaling = ("linear", full["factor"]) if full["rope_type"] == "linear" else ()
    assert (cfg.pe_base, cfg.rope_scaling, cfg.local_rope_base) == (full["rope_theta"], scaling, local["rope_theta"])
    assert local["rope_type"] == "default"


def rewrite_config(folder: Path, change) -> dict:
    path = folder / "config.json"
    hf = json.loads(path.read_text())
    change(hf)
    path.write_text(json.dumps(hf))
    return hf


def test_the_older_config_json_forms(tmp_path):
    """Files written before transformers 5: Gemma 3's rope_theta, rope_scaling, rope_local_base_freq and
    sliding_window_pattern, Gemma 2's top-level rope_theta and no layer_types. transformers reads the
    rewritten files (the reference is what it makes of them) and the engine follows it."""
    from transformers import AutoModelForCausalLM

    def older_gemma3(hf):
        for key in ("rope_parameters", "layer_types"):
            hf.pop(key)
        hf.update(rope_theta=50000.0, rope_scaling={"rope_type": "linear", "factor": 4.0}, rope_local_base_freq=100.0,
                  sliding_window_pattern=2)

    def older_gemma2(hf):
        for key in ("rope_parameters", "layer_types"):
            hf.pop(key)
        hf.update(rope_theta=2000.0)

    for name, change, window in (("gemma3_scaled", older_gemma3, (3, 0, 3, 0)),
                                 ("gemma2_mqa_capped", older_gemma2, (3, 0, 3))):
        _, folder = build(name, tmp_path)
        rewrite_config(folder, change)
        ref = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
        model, _ = open_folder(folder)
        assert model.cfg.attn_window == window
        if name.startswith("gemma3"):
            cfg = model.cfg
            assert (cfg.pe_base, cfg.rope_scaling, cfg.local_rope_base) == (50000.0, ("linear", 4.0), 100.0)
        else:
            assert model.cfg.pe_base == 2000.0
        check_against_reference(ref, folder, prompts=PROMPTS[-1:], new_tokens=3)


def test_a_nested_gemma3_config_with_the_text_model_alone(tmp_path):
    """model_type "gemma3" with the text model's config in text_config and its weights under
    language_model.model. (the multimodal layout's names, without a vision tower): the same model."""
    ref, folder = build("gemma3_mqa_untied", tmp_path)

    def nest(hf):
        text = {k: v for k, v in hf.items() if k not in ("architectures", "transformers_version")}
        hf.clear()
        hf.update(model_type="gemma3", architectures=["Gemma3ForConditionalGeneration"], text_config=text,
                  tie_word_embeddings=False)

    rewrite_config(folder, nest)
    tensors = load_file(folder / "model.safetensors")
    renamed = {("language_model.lm_head.weight" if k == "lm_head.weight" else "language_model." + k): v
               for k, v in tensors.items()}
    assert all(k.startswith("language_model.model.") for k in renamed if "lm_head" not in k)
    save_file(renamed, folder / "model.safetensors")
    model, tok = open_folder(folder)
    assert model.cfg.qk_norm == "head" and not model.cfg.tie_weights
    for prompt in PROMPTS:
        x = torch.tensor([tok.encode(prompt)])
        with torch.no_grad():
            got, want = model(x, return_attention=True), ref(x, output_attentions=True)
        assert (got.logits - want.logits).abs().max() <= 1e-5
        assert max((a - b).abs().max() for a, b in zip(got.attentions, want.attentions)) <= 1e-6


def run(module: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=600)


def test_the_command_lines(tmp_path):
    """`python -m model.generate --checkpoint FOLDER --json` continues greedily as transformers does (with
    the probabilities it gives), and `python -m model.convert` writes a file the app's loader opens with
    the same numbers bit for bit."""
    ref, folder = build("gemma2_mqa_capped", tmp_path)
    prompt, new = PROMPTS[0], 4
    done = run("model.generate", "--checkpoint", str(folder), "--prompt", prompt, "--max-new-tokens", str(new),
               "--temperature", "0", "--json")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    ids = hf_tokenizer(folder)(prompt)["input_ids"]
    with torch.no_grad():
        for line in lines:
            logits = ref(torch.tensor([ids])).logits[0, -1]
            token = int(logits.argmax())
            assert line["token_id"] == token
            assert abs(line["prob"] - float(torch.softmax(logits, -1)[token])) < 1e-5
            ids.append(token)
    assert len(lines) == new
    out = tmp_path / "gemma2.safetensors"
    done = run("model.convert", str(folder), "--out", str(out))
    assert done.returncode == 0, done.stderr
    model, tok = open_folder(folder)
    reopened = load_checkpoint(out)
    assert reopened.model.cfg == model.cfg and reopened.tokenizer == tok
    x = torch.tensor([tok.encode(PROMPTS[-1])])
    with torch.no_grad():
        a, b = model(x, return_attention=True), reopened.model(x, return_attention=True)
    assert torch.equal(a.logits, b.logits)
    assert all(torch.equal(p, q) for p, q in zip(a.attentions, b.attentions))
