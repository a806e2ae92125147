"""OLMo 2 folders held to transformers' Olmo2ForCausalLM on random small models: the norms after each
branch (post_attention_layernorm, post_feedforward_layernorm) and none before, RMSNorm of queries and
keys over the whole projection before the rotary step, an attention wider than d_model, grouped-query
and multi-query attention, attention biases, SwiGLU; both config.json forms; the command lines; and
OLMo 2's published checkpoint series (stage1-step1000-tokens5B revisions in the hub cache) made into a
film as Pythia's is.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from model.checkpoint import DEFAULT_LIMITS, load_checkpoint
from model.families import open_folder
from model.families.common import pairs_from_halves
from tests.support.families import PROMPTS, check_against_reference
from tests.support.olmo_phi import VOCAB, check_cli_generate, check_convert_and_reopen, olmo2_reference, run
from tests.support.series import PROBE, fake_hub_series

import transformers  # noqa: F401 - the reference: a missing package fails collection, never skips

CASES = {
    # GQA 2:1; each head 10 wide, so the attention is 4 x 10 = 40 wide for d_model 24 (q_norm 40, k_norm 20);
    # biases on q, k, v and the output projection; OLMo 2's theta 500,000; an untied head
    "gqa_wide_bias": dict(head_dim=10, attention_bias=True, rope_theta=500000.0),
    # one key/value head for all four query heads (k_norm 4 wide), a tied head, OLMo-2-0425-1B's epsilon
    "mqa_tied": dict(hidden_size=16, num_key_value_heads=1, intermediate_size=24, tie_word_embeddings=True,
                     rms_norm_eps=1e-6),
}


def build(name: str, root, seed: int = 0):
    return olmo2_reference(root / name, seed=seed + len(name), **CASES[name])


@pytest.mark.parametrize("name", list(CASES))
def test_olmo2_matches_transformers(name, tmp_path):
    ref, folder = build(name, tmp_path)
    check_against_reference(ref, folder)


def test_norms_sit_after_each_branch_and_qk_norms_span_every_head(tmp_path):
    ref, folder = build("gqa_wide_bias", tmp_path)
    model, _ = open_folder(folder)
    cfg = model.cfg
    assert (cfg.norm, cfg.qk_norm, cfg.norm_kind, cfg.activation) == ("post_branch", "whole", "rmsnorm", "swiglu")
    assert (cfg.n_heads, cfg.kv_heads, cfg.head_dim, cfg.attn_dim, cfg.d_model) == (4, 2, 10, 40, 24)
    assert cfg.pe_base == 500000.0 and cfg.rope_dim == 10 and not cfg.tie_weights
    assert (cfg.part_bias("qkv"), cfg.part_bias("attn_out"), cfg.part_bias("mlp")) == (True, True, False)
    for block, layer in zip(model.blocks, ref.model.layers):
        # nothing normalises what a branch reads: the stream itself goes in
        assert isinstance(block.norm1, torch.nn.Identity) and isinstance(block.norm2, torch.nn.Identity)
        assert torch.equal(block.post_norm1.weight, layer.post_attention_layernorm.weight)
        assert torch.equal(block.post_norm2.weight, layer.post_feedforward_layernorm.weight)
        attn = layer.self_attn
        # one weight per dimension of the whole projection, re-laid with its dimension
        assert block.attn.q_norm.weight.shape == (40,) and block.attn.k_norm.weight.shape == (20,)
        assert torch.equal(block.attn.q_norm.weight, pairs_from_halves(attn.q_norm.weight, 4, 10, 10))
        assert torch.equal(block.attn.k_norm.weight, pairs_from_halves(attn.k_norm.weight, 2, 10, 10))
        assert block.attn.proj.weight.shape == (24, 40)
    assert model.cfg.n_params() == sum(p.numel() for p in ref.parameters())


def test_the_older_config_json_form_opens_the_same_model(tmp_path):
    """allenai's published config.json files hold rope_theta and rope_scaling: null at the top level
    (transformers 4's form), not transformers 5's rope_parameters: the same model, the same numbers."""
    ref, folder = build("gqa_wide_bias", tmp_path)
    new, _ = open_folder(folder)
    hf = json.loads((folder / "config.json").read_text())
    del hf["rope_parameters"]
    hf.update(rope_theta=500000, rope_scaling=None)  # a whole number and a null, as in allenai/OLMo-2-0425-1B's
    (folder / "config.json").write_text(json.dumps(hf))
    old, tok = open_folder(folder)
    assert old.cfg == new.cfg
    x = torch.tensor([tok.encode(PROMPTS[2])])
    with torch.no_grad():
        assert torch.equal(old(x).logits, new(x).logits)
        assert torch.allclose(old(x).logits, ref(x).logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("rope", [
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 16, "rope_theta": 500000.0},
    {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
])
def test_the_rotary_scalings_transformers_applies_to_olmo2_are_the_engines(rope, tmp_path):
    """transformers' OLMo 2 turns by whichever rotary rope_parameters name; the two the engine computes exactly
    are taken (every other is refused by name: tests/engine/test_families_hostile_olmo_phi.py)."""
    ref, folder = olmo2_reference(tmp_path / rope["rope_type"], seed=5, rope_parameters=rope)
    model, tok = open_folder(folder)
    assert model.cfg.rope_scaling[0] == rope["rope_type"] and model.cfg.pe_base == rope["rope_theta"]
    x = torch.tensor([tok.encode(" ".join(PROMPTS) * 2)])
    assert x.shape[1] > 16  # past llama3's original context, where its long wavelengths are slowed
    with torch.no_grad():
        want, got = ref(x, output_attentions=True), model(x, return_attention=True)
    assert torch.allclose(got.logits, want.logits, atol=1e-5, rtol=0)
    assert max((a - b).abs().max() for a, b in zip(got.attentions, want.attentions)) <= 1e-6
    plain = olmo2_reference(tmp_path / "plain", seed=5, rope_parameters={"rope_type": "default",
                                                                          "rope_theta": rope["rope_theta"]})[0]
    with torch.no_grad():
        assert (plain(x).logits - want.logits).abs().max() > 1e-3  # the scaling changes the numbers


@pytest.mark.slow
def test_the_command_lines_read_olmo2_folders(tmp_path):
    ref, folder = build("mqa_tied", tmp_path)
    check_cli_generate(ref, folder, "Once upon a time")
    check_convert_and_reopen(folder, tmp_path / "olmo2.safetensors", PROMPTS)


# ---------------------------------------------------------------- OLMo 2's checkpoint series

STAGE1 = ("stage1-step0-tokens0B", "stage1-step1000-tokens5B", "stage1-step140000-tokens588B")
STAGE2 = ("stage2-ingredient1-step1000-tokens5B", "stage2-ingredient1-step2000-tokens10B")


def olmo2_series(root, names):
    """One random OLMo 2 of the gqa_wide_bias shape per revision (another seed each); name -> folder."""
    return {name: build("gqa_wide_bias", root / name, seed=i)[1] for i, name in enumerate(names)}


def film_of(folders: dict, tmp_path, out_name: str):
    """`python -m model.film allenai/OLMo-2-0425-1B --revisions …` on a hub cache holding `folders` under
    OLMo 2's name, as `hf download … --revision stage1-step1000-tokens5B` leaves them."""
    cache = tmp_path / f"hub-{out_name}"
    fake_hub_series(cache, "allenai/OLMo-2-0425-1B", folders)
    out = tmp_path / f"{out_name}.safetensors"
    done = run("model.film", "allenai/OLMo-2-0425-1B", "--revisions", ",".join(folders), "--probe", PROBE,
               "--out", str(out), env={"HF_HUB_CACHE": str(cache)})
    return done, out


@pytest.mark.slow
def test_olmo2_stage_revisions_in_the_hub_cache_make_a_film_as_transformers_computes(tmp_path):
    """Each frame is the step its revision names (stage1-step1000-tokens5B is step 1000, not the 5 of 5B),
    its attention and probe loss transformers' own for that revision; the file keeps the last revision."""
    from transformers import AutoTokenizer, Olmo2ForCausalLM

    folders = olmo2_series(tmp_path, STAGE1)
    done, out = film_of(folders, tmp_path, "stage1")
    assert done.returncode == 0, done.stderr
    assert f"wrote {out}: 3 frames (steps 0 … 140000)" in done.stdout
    ck = load_checkpoint(out, DEFAULT_LIMITS)
    film = ck.film
    assert [f.step for f in film.frames] == [0, 1000, 140000] and film.total_steps == 140000
    assert ck.meta["revisions"] == list(STAGE1) and ck.model.cfg.qk_norm == "whole"
    ids = film.probe_ids
    assert ids == AutoTokenizer.from_pretrained(folders[STAGE1[0]])(PROBE)["input_ids"]
    for frame, folder in zip(film.frames, folders.values()):
        ref = Olmo2ForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
        with torch.no_grad():
            res = ref(torch.tensor([ids]), output_attentions=True)
        assert len(frame.attention) == 2
        for a, b in zip(frame.attention, res.attentions):
            assert np.abs(a - b[0].numpy()).max() <= 1e-6
        loss = float(torch.nn.functional.cross_entropy(res.logits[0, :-1, :VOCAB].double(), torch.tensor(ids[1:])))
        assert abs(frame.train_loss - loss) <= 1e-5
    # the weights are the last revision's
    last = Olmo2ForCausalLM.from_pretrained(folders[STAGE1[-1]]).eval()
    with torch.no_grad():
        torch.testing.assert_close(ck.model(torch.tensor([ids])).logits, last(torch.tensor([ids])).logits,
                                   atol=1e-5, rtol=0)


@pytest.mark.slow
def test_a_series_into_the_second_stage_is_numbered_by_place_and_mixed_runs_are_refused(tmp_path):
    """OLMo 2's stage 2 counts its steps from 0 again: stage 1 then stage 2 is a film in training order whose
    frames are numbered by their place; two of stage 2's runs (ingredients trained side by side) are
    refused in one sentence, and nothing is written."""
    names = (STAGE1[-1], *STAGE2)
    done, out = film_of(olmo2_series(tmp_path, names), tmp_path, "stages")
    assert done.returncode == 0, done.stderr
    film = load_checkpoint(out, DEFAULT_LIMITS).film
    assert [f.step for f in film.frames] == [0, 1, 2] and film.total_steps == 2
    mixed = ("stage2-ingredient1-step1000-tokens5B", "stage2-ingredient2-step2000-tokens10B")
    done, out = film_of(olmo2_series(tmp_path / "mixed", mixed), tmp_path, "mixed")
    assert done.returncode == 2 and "Traceback" not in done.stderr and not out.exists()
    assert "is of another run (stage2-ingredient2) of the same stage" in done.stderr


def test_a_revisions_step_is_the_number_after_step_else_the_number_it_ends_with():
    from model.film_series import revision_steps

    assert revision_steps(list(STAGE1)) == [0, 1000, 140000]
    assert revision_steps(["step0", "step1000", "step143000"]) == [0, 1000, 143000]  # Pythia's, as before
    assert revision_steps(["checkpoint-500", "checkpoint-1000"]) == [500, 1000]
    assert revision_steps([STAGE1[1], "main"]) == [0, 1]  # a name without a step: places
    assert revision_steps([STAGE1[2], *STAGE2]) == [0, 1, 2]
    for bad, message in (
        ([STAGE1[2], STAGE1[1]], "revision stage1-step1000-tokens5B is step 1000, not after step 140000"),
        ([STAGE2[0], STAGE1[1]], "is of stage 1, after a revision of stage 2: give the revisions in training order"),
        ([STAGE2[1], STAGE2[0]], "is step 1000, not after step 2000"),
        ([STAGE2[0], "stage2-ingredient3-step3000-tokens15B"], "another run \\(stage2-ingredient3\\) of the same"),
    ):
        with pytest.raises(ValueError, match=message):
            revision_steps(bad)
