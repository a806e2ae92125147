"""Phi-3 / Phi-4-mini folders held to transformers' Phi3ForCausalLM on random small models: the fused
qkv_proj and gate_up_proj re-laid into the engine's projections, rotary on part of each head (0.75 and
0.5), grouped-query and multi-query attention, an attention wider than d_model, a tied head, and
config.json's sliding_window, which transformers applies to every layer (each query reads the last
sliding_window keys, its own included), on prompts longer than the window; both config.json forms; the
command lines.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from model.families import open_folder
from model.families.common import pairs_from_halves
from model.transformer import DecoderLM
from tests.support.families import PROMPTS, TEXT, check_against_reference
from tests.support.olmo_phi import check_cli_generate, check_convert_and_reopen, phi3_reference

import transformers  # noqa: F401 - the reference: a missing package fails collection, never skips

WINDOW = 4
CASES = {
    # GQA 2:1, heads of 8 of which the first 6 turn (Phi-4-mini's 0.75), a window of 4 keys on both layers
    "partial_gqa_window": dict(partial_rotary_factor=0.75, sliding_window=WINDOW),
    # one key/value head; 4 heads of 8 (32 wide for d_model 16); half of each head turns; a tied head
    # (Phi-4-mini ties its head); another theta
    "mqa_wide_tied": dict(hidden_size=16, num_key_value_heads=1, head_dim=8, partial_rotary_factor=0.5,
                          tie_word_embeddings=True, rope_theta=250000.0),
}
LONG = TEXT[:90]  # some 40 tokens (ten times the window), leaving room for 6 more in the 64 positions


def build(name: str, root, **changes):
    # seed 18: random weights whose float32 rounding stays well inside the tolerances on these prompts
    return phi3_reference(root / name, seed=18, **{**CASES[name], **changes})


@pytest.mark.parametrize("name", list(CASES))
def test_phi3_matches_transformers(name, tmp_path):
    ref, folder = build(name, tmp_path)
    check_against_reference(ref, folder, prompts=[*PROMPTS, LONG])


def test_the_window_is_transformers_sliding_window_on_every_layer(tmp_path):
    """On a text ten times the window, transformers' attention gives nothing to keys more than the window
    back, the engine's is the same map, and the window is what makes the logits (without it they differ)."""
    ref, folder = build("partial_gqa_window", tmp_path)
    model, tok = open_folder(folder)
    assert model.cfg.attn_window == (WINDOW, WINDOW)
    ids = tok.encode(LONG)
    assert len(ids) > 5 * WINDOW
    x = torch.tensor([ids])
    with torch.no_grad():
        want, got = ref(x, output_attentions=True), model(x, return_attention=True)
    T = len(ids)
    too_old = torch.arange(T)[None, :] <= torch.arange(T)[:, None] - WINDOW  # key k, query q: k <= q - window
    for a, b in zip(got.attentions, want.attentions):
        assert torch.all(b[0][:, too_old] == 0) and torch.all(b[0][:, ~too_old & (torch.arange(T)[None, :] <=
                                                                                  torch.arange(T)[:, None])] > 0)
        assert (a - b).abs().max() <= 1e-6
    unwindowed = DecoderLM(model.cfg.replace(attn_window=())).eval()
    unwindowed.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert (unwindowed(x).logits - want.logits).abs().max() > 1e-2
    assert torch.allclose(got.logits, want.logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("window, engine", [(64, ()), (1000, ()), (63, (63, 63)), (1, (1, 1))])
def test_a_window_as_long_as_the_context_leaves_no_key_out(window, engine, tmp_path):
    """A window of at least max_position_embeddings keys (Phi-4-mini: 262,144 for 131,072 positions) never
    leaves a key out: the engine attends globally; a shorter one is kept, down to a query's own key alone."""
    ref, folder = build("partial_gqa_window", tmp_path, sliding_window=window)
    model, tok = open_folder(folder)
    assert model.cfg.attn_window == engine
    x = torch.tensor([tok.encode(LONG)])
    with torch.no_grad():
        want, got = ref(x, output_attentions=True), model(x, return_attention=True)
    assert torch.allclose(got.logits, want.logits, atol=1e-5, rtol=0)
    assert max((a - b).abs().max() for a, b in zip(got.attentions, want.attentions)) <= 1e-6


def test_fused_projections_are_re_laid_into_the_engines(tmp_path):
    ref, folder = build("partial_gqa_window", tmp_path)
    model, _ = open_folder(folder)
    cfg = model.cfg
    assert (cfg.n_heads, cfg.kv_heads, cfg.head_dim, cfg.rope_dim, cfg.rope_fraction) == (4, 2, 8, 6, 0.75)
    assert (cfg.norm, cfg.norm_kind, cfg.activation, cfg.bias, cfg.tie_weights) == ("pre", "rmsnorm", "swiglu", False,
                                                                                  False)
    for block, layer in zip(model.blocks, ref.model.layers):
        fused = layer.self_attn.qkv_proj.weight
        q, k, v = fused.split((32, 16, 16))
        ours = block.attn.qkv.weight
        assert torch.equal(ours, torch.cat([pairs_from_halves(q, 4, 8, 6), pairs_from_halves(k, 2, 8, 6), v]))
        # the 2 dimensions past the rotated 6 of each head stay where they were
        assert torch.equal(ours[:32].view(4, 8, -1)[:, 6:], q.view(4, 8, -1)[:, 6:])
        # gate rows then up rows: transformers' chunk(2) order, which is the engine's
        assert torch.equal(block.ffn.up.weight, layer.mlp.gate_up_proj.weight)
        assert torch.equal(block.norm1.weight, layer.input_layernorm.weight)
        assert torch.equal(block.norm2.weight, layer.post_attention_layernorm.weight)
    assert cfg.n_params() == sum(p.numel() for p in ref.parameters())
    ref, folder = build("mqa_wide_tied", tmp_path)
    model, _ = open_folder(folder)
    assert (model.cfg.attn_dim, model.cfg.d_model, model.cfg.kv_heads, model.cfg.rope_dim) == (32, 16, 1, 4)
    assert model.cfg.tie_weights and model.head.weight is model.tok_emb.weight


def test_the_older_config_json_form_opens_the_same_model(tmp_path):
    """Microsoft's published files hold rope_theta, rope_scaling: null and partial_rotary_factor at the top
    level (transformers 4's form), not transformers 5's rope_parameters: the same model, the same numbers."""
    ref, folder = build("mqa_wide_tied", tmp_path)
    new, _ = open_folder(folder)
    hf = json.loads((folder / "config.json").read_text())
    del hf["rope_parameters"]
    hf.update(rope_theta=250000.0, rope_scaling=None, partial_rotary_factor=0.5)
    (folder / "config.json").write_text(json.dumps(hf))
    old, tok = open_folder(folder)
    assert old.cfg == new.cfg
    x = torch.tensor([tok.encode(LONG)])
    with torch.no_grad():
        assert torch.equal(old(x).logits, new(x).logits)
        assert torch.allclose(old(x).logits, ref(x).logits, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_the_command_lines_read_phi3_folders(tmp_path):
    ref, folder = build("partial_gqa_window", tmp_path)
    prompt = "Once upon a time there was a little fox."  # longer than the window
    check_cli_generate(ref, folder, prompt)
    check_convert_and_reopen(folder, tmp_path / "phi3.safetensors", [*PROMPTS, LONG])


def test_longrope_opens_with_its_original_context_exactly(tmp_path):
    """LongRoPE (Phi-3-128k, Phi-3.5, Phi-4-mini) within original_max_position_embeddings: each rotated pair
    slowed by its short factor, cos and sin lengthened by the attention factor sqrt(1 + ln(s) / ln(n0)),
    s = max_position_embeddings / n0; the context is n0, where those are the reference's angles."""
    longrope = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
                "short_factor": [1.0, 1.3, 2.1], "long_factor": [2.0, 3.0, 5.0]}
    ref, folder = phi3_reference(tmp_path / "longrope", rope_parameters=longrope, max_position_embeddings=128,
                                 original_max_position_embeddings=32)
    model, _ = open_folder(folder)
    gain = math.sqrt(1 + math.log(128 / 32) / math.log(32))
    assert model.cfg.block_size == 32 and model.cfg.rope_scaling == ("longrope", pytest.approx(gain), 1.0, 1.3, 2.1)
    check_against_reference(ref, folder)
    plain, _ = open_folder(phi3_reference(tmp_path / "plain", rope_parameters={
        "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.75}, max_position_embeddings=32)[1])
    ids = torch.tensor([list(range(3, 20))])
    assert not torch.allclose(model(ids).logits, plain(ids).logits, atol=1e-3)  # the factors change the numbers
