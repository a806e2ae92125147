"""nanochat checkpoints through the engine, held to nanochat itself and to its formulas.

* nanochat's own numbers (tests/assets/nanochat: a checkpoint, tokenizer and outputs written by nanochat's
  code on a CPU in float32): the tokenizer's ids and decoded texts equal tiktoken's, the logits equal
  nanochat's within 1e-4 with the same argmax at every position, and greedy generation (with the key/value
  cache and without) gives the 12 tokens of nanochat's Engine;
* a slow reference written here from the formulas (model/nanochat.py's docstring) in float64: attention
  rows of every layer (windows shorter than the prompt: 129 and 65 keys for 134 tokens) and logits, on the
  fixture and on a checkpoint of another shape (4 layers, one key/value head, windows "SL");
* the key/value cache: one-token steps and chunks after a prefill equal the full forward (the smear reads
  the cached embedding of the token before), and a cache without those embeddings is refused;
* every engine tool: head ablation against the reference with the head zeroed, the logit lens (its last
  row is the logits: the backout is part of the last stream), head scores, patching (the skip of unchanged
  blocks is off for a model whose blocks read the embedding again), and Inside one cell, which refuses by
  name (it rebuilds a layer from the residual stream alone; nanochat's blocks also read x0).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from model.attention import LayerCache
from model.generate import Decoder, Sampling
from model.heads import head_scores
from model.inside import inside_cell, inside_head, layer_inputs, run_forward
from model.interventions import Intervention
from model.nanochat import load_nanochat, windows
from model.patching import Patch, PatchSite
from model.transformer import KVCache, logit_lens
from tests.support.nanochat_files import (
    BOS, CHECKPOINT, FIXTURE_CONFIG, VOCAB, expected, fixture_state, random_state, write_checkpoint,
)

EPS = 2.0**-23
ATTN_TOL = 2e-6  # float32 engine against the float64 reference
LOGIT_TOL = 1e-4
# another shape: an even number of layers (value embeddings on 1 and 3, backout after block 2), one key/value
# head for two query heads, windows S L S L of 129 and 257 keys
OTHER_CONFIG = {"sequence_len": 256, "vocab_size": VOCAB, "n_layer": 4, "n_head": 2, "n_kv_head": 1, "n_embd": 48,
                "window_pattern": "SL"}


@pytest.fixture(scope="module")
def run():
    return load_nanochat(CHECKPOINT)


@pytest.fixture(scope="module")
def cases():
    return expected()


@pytest.fixture(scope="module")
def other(tmp_path_factory):
    """A checkpoint of OTHER_CONFIG in nanochat's file format, its state, and the model read from it."""
    state = random_state(OTHER_CONFIG, seed=11)
    folder = write_checkpoint(tmp_path_factory.mktemp("other") / "d4", state, OTHER_CONFIG)
    return load_nanochat(folder), {k: v.float() for k, v in state.items()}


# ------------------------------------------------------------------------------ the formulas, in float64


def rms(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + EPS)


def reference(sd: dict, mc: dict, ids: list[int], zero_head: tuple[int, int] | None = None):
    """nanochat's forward in float64 written out: (logits (T, V), attention per layer (H, T, T), the
    stream after each block, the last after the backout). Rotary angles in float32, as nanochat makes them."""
    f = {k: v.double() for k, v in sd.items()}
    L, C, H, KV, V = mc["n_layer"], mc["n_embd"], mc["n_head"], mc["n_kv_head"], mc["vocab_size"]
    D, T = C // H, len(ids)
    half = D // 2
    inv = 1.0 / (100000 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    angles = torch.outer(torch.arange(T, dtype=torch.float32), inv)
    cos, sin = angles.cos().double()[:, None, :], angles.sin().double()[:, None, :]  # (T, 1, D/2)

    def rotate(t):  # nanochat's halves, turned by -θ
        a, b = t[..., :half], t[..., half:]
        return torch.cat([a * cos + b * sin, -a * sin + b * cos], dim=-1)

    idx = torch.tensor(ids)
    x = rms(f["transformer.wte.weight"][idx])
    gate = f["smear_lambda"] * torch.sigmoid(x[:, :24] @ f["smear_gate.weight"].T)  # (T, 1)
    x = torch.cat([x[:1], x[1:] + gate[1:] * x[:-1]])
    x0, keys = x, [w - 1 for w in windows({**mc, "window_pattern": mc["window_pattern"].upper()})]
    attention, streams, kept = [], [], None
    for i in range(L):
        p = f"transformer.h.{i}."
        x = f["resid_lambdas"][i] * x + f["x0_lambdas"][i] * x0
        h = rms(x)
        q = (h @ f[p + "attn.c_q.weight"].T).view(T, H, D)
        k = (h @ f[p + "attn.c_k.weight"].T).view(T, KV, D)
        v = (h @ f[p + "attn.c_v.weight"].T).view(T, KV, D)
        if p + "attn.ve_gate.weight" in f:
            g = 3 * torch.sigmoid(h[:, :12] @ f[p + "attn.ve_gate.weight"].T)  # (T, KV)
            v = v + g[..., None] * f[f"value_embeds.{i}.weight"][idx].view(T, KV, D)
        q, k = rms(rotate(q)) * 1.2, rms(rotate(k)) * 1.2
        A = torch.zeros(H, T, T, dtype=torch.float64)
        y = torch.zeros(T, H, D, dtype=torch.float64)
        for head in range(H):
            kv = head // (H // KV)
            for row in range(T):  # query `row` reads keys row - w .. row
                cols = [j for j in range(T) if j <= row and row - j <= keys[i]]
                s = torch.stack([q[row, head] @ k[j, kv] for j in cols]) / math.sqrt(D)
                A[head, row, cols] = torch.softmax(s, dim=0)
            y[:, head] = A[head] @ v[:, kv]
            if zero_head == (i, head):
                y[:, head] = 0
        x = x + y.reshape(T, C) @ f[p + "attn.c_proj.weight"].T
        x = x + torch.relu(rms(x) @ f[p + "mlp.c_fc.weight"].T).square() @ f[p + "mlp.c_proj.weight"].T
        if i == L // 2:
            kept = x
        if i == L - 1:
            x = x - f["backout_lambda"] * kept
        attention.append(A)
        streams.append(x)
    logits = rms(x) @ f["lm_head.weight"][:V].T
    return 15 * torch.tanh(logits / 15), attention, streams


# --------------------------------------------------------------------------- nanochat's own numbers


def test_tokenizer_gives_tiktokens_ids_and_texts(run, cases):
    prompts, encodings = cases
    tok = run.tokenizer
    assert tok.vocab_size == VOCAB and tok.bos_id == BOS and tok.add_bos and tok.eos_id == BOS
    for case in prompts:  # nanochat's prompts: <|bos|> first
        assert tok.encode(case["text"]) == case["ids"].tolist()
    assert len(encodings) >= 11
    for e in encodings:  # "<|bos|> typed by hand" stays text, as in encode_ordinary
        ids = tok.encode(e["text"], add_special_tokens=False)
        assert ids == e["ids"], e["text"]
        assert tok.decode(ids) == e["decoded"]
    assert tok.piece(BOS) == "<|bos|>" and tok.decode([BOS, 295]) == "<|bos|><|assistant_end|>"


def test_logits_are_nanochats(run, cases):
    for case in cases[0]:
        with torch.inference_mode():
            out = run.model(case["ids"][None]).logits[0]  # (T, 320): 20 padded rows after the vocabulary
        assert out.shape == (len(case["ids"]), 320)
        torch.testing.assert_close(out[case["rows"], :VOCAB], case["logits"], atol=LOGIT_TOL, rtol=0)
        assert torch.equal(out[:, :VOCAB].argmax(-1), case["argmax"])
    assert len(cases[0][3]["ids"]) == 134 > max(run.model.cfg.attn_window)  # past every window


@pytest.mark.parametrize("cached", [True, False])
def test_greedy_tokens_are_nanochat_engines(run, cases, cached):
    for case in cases[0]:
        d = Decoder(run.model, case["ids"].tolist(), Sampling(temperature=0.0), use_cache=cached,
                    capture_attention=cached, eos_id=run.tokenizer.eos_id)
        assert [d.step().token_id for _ in range(12)] == case["greedy"].tolist()


def test_the_config_is_nanochats(run):
    cfg = run.model.cfg
    assert cfg.attn_window == (129, 129, 65)  # nanochat's (128, 0), (128, 0), (64, 0): w keys before, plus its own
    assert cfg.block_size == 640 and cfg.vocab_size == 320 and cfg.vocab_used == VOCAB
    assert cfg.value_embed_layers == (0, 2) and cfg.backout_layer == 1
    assert cfg.norm_eps == torch.finfo(torch.float32).eps
    assert not any(n.endswith("norm.weight") or "norm1" in n or "norm2" in n for n, _ in run.model.named_parameters())
    assert run.model.n_params() == cfg.n_params() == sum(v.numel() for v in fixture_state().values())


# ------------------------------------------------------------------------------- against the formulas


def _check_against_reference(model, sd, mc, ids):
    with torch.inference_mode():
        out = model(torch.tensor([ids]), return_attention=True)
        fused = model(torch.tensor([ids])).logits[0, :, :VOCAB]
    want, attention, _ = reference(sd, mc, ids)
    for layer, (got, ref) in enumerate(zip(out.attentions, attention)):
        torch.testing.assert_close(got[0].double(), ref, atol=ATTN_TOL, rtol=0, msg=f"layer {layer}")
    torch.testing.assert_close(out.logits[0, :, :VOCAB].double(), want, atol=LOGIT_TOL, rtol=0)
    torch.testing.assert_close(fused, out.logits[0, :, :VOCAB], atol=3e-5, rtol=0)  # the fused kernel's path
    return out


def test_attention_rows_follow_the_formulas_with_windows_shorter_than_the_prompt(run, cases):
    ids = cases[0][3]["ids"].tolist()  # 134 tokens
    out = _check_against_reference(run.model, fixture_state(), FIXTURE_CONFIG, ids)
    last = [int((a[0, :, -1] > 0).sum(-1).max()) for a in out.attentions]
    assert last == [129, 129, 65]  # the last query reads its window's keys and no others


def test_another_shape_follows_the_formulas(other):
    run, sd = other
    assert run.model.cfg.attn_window == (129, 257, 129, 257) and run.model.cfg.value_embed_layers == (1, 3)
    ids = [BOS] + [(7 * i * i + 3 * i) % 291 for i in range(1, 140)]
    _check_against_reference(run.model, sd, OTHER_CONFIG, ids)


# ------------------------------------------------------------------------------------------ the cache


def test_cached_steps_equal_the_full_forward(run, cases):
    ids = cases[0][3]["ids"][None]  # (1, 134)
    with torch.inference_mode():
        full = run.model(ids).logits[0]
        cache, got = KVCache([]), []
        out = run.model(ids[:, :60], cache=cache)  # a prefill, then one token at a time
        got.append(out.logits[0])
        cache = out.cache
        for t in range(60, 100):
            out = run.model(ids[:, t : t + 1], cache=cache)
            cache = out.cache
            got.append(out.logits[0])
        for a, b in ((100, 117), (117, 134)):  # chunks after a cache: their first token is smeared too
            out = run.model(ids[:, a:b], cache=cache)
            cache = out.cache
            got.append(out.logits[0])
        assert cache.length == 134 and cache.embeds.shape == (1, 134, 32)
        torch.testing.assert_close(torch.cat(got), full, atol=1e-5, rtol=0)
        # the cache cut before a position, as the logit lens of an earlier token runs it
        step = run.model(ids[:, 80:81], cache=cache.upto(80)).logits[0, 0]
        torch.testing.assert_close(step, full[80], atol=1e-5, rtol=0)
        bare = KVCache([LayerCache(c.k[:, :, :80], c.v[:, :, :80]) for c in cache.layers])
        with pytest.raises(ValueError, match="smear"):
            run.model(ids[:, 80:81], cache=bare)


def test_a_one_token_text_is_its_own_embedding(run):
    with torch.inference_mode():
        one = run.model(torch.tensor([[BOS]])).logits[0, 0]
        two = run.model(torch.tensor([[BOS, 100]])).logits[0, 0]
    torch.testing.assert_close(one, two, atol=1e-5, rtol=0)  # the first token is never smeared


# ---------------------------------------------------------------------------------------- every tool


def test_head_ablation_is_the_formulas_with_the_head_zeroed(run, cases):
    ids = cases[0][1]["ids"].tolist()
    with torch.inference_mode():
        got = run.model(torch.tensor([ids]), intervention=Intervention(heads=[(1, 2)])).logits[0, :, :VOCAB]
    want, _, _ = reference(fixture_state(), FIXTURE_CONFIG, ids, zero_head=(1, 2))
    plain, _, _ = reference(fixture_state(), FIXTURE_CONFIG, ids)
    torch.testing.assert_close(got.double(), want, atol=LOGIT_TOL, rtol=0)
    assert (want - plain).abs().max() > 0.1  # the head matters
    d = Decoder(run.model, ids, Sampling(temperature=0.0), intervention=Intervention(heads=[(1, 2)]))
    assert np.allclose(torch.softmax(want[-1], -1).numpy(), d.step().probs[:VOCAB], atol=1e-5)


def test_logit_lens_reads_each_stream_and_ends_at_the_logits(run, cases):
    ids = cases[0][2]["ids"].tolist()
    with torch.inference_mode():
        out = run.model(torch.tensor([ids]), return_residuals=True)
        lens = logit_lens(run.model, out.residuals)
    assert torch.equal(lens[-1], out.logits)  # the last stream is after the backout: what the final norm reads
    _, _, streams = reference(fixture_state(), FIXTURE_CONFIG, ids)
    for layer, stream in enumerate(streams):
        torch.testing.assert_close(out.residuals[layer + 1][0].double(), stream, atol=1e-4, rtol=1e-5)


def test_head_scores_are_the_formulas(run, cases):
    ids = cases[0][1]["ids"].tolist()
    with torch.inference_mode():
        out = run.model(torch.tensor([ids]), return_attention=True)
    got = head_scores([a[0].numpy() for a in out.attentions], ids)
    want = head_scores([a.numpy() for a in reference(fixture_state(), FIXTURE_CONFIG, ids)[1]], ids)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], atol=1e-5, err_msg=name)


def test_patching_runs_every_block_and_patches_the_stream(run, cases):
    a, b = cases[0][1]["ids"][None][:, :40], cases[0][2]["ids"][None][:, :40]
    with torch.inference_mode():
        src, base = run.model(b, record=True), run.model(a, record=True)
        for site in (PatchSite("resid", 2), PatchSite("head", 1, head=3), PatchSite("mlp", 2, positions=(5, 9))):
            plain = run.model(a, patch=Patch(src.activations, (site,))).logits
            based = run.model(a, patch=Patch(src.activations, (site,), base=base.activations)).logits
            assert torch.equal(plain, based), site  # with a base: the same numbers (every block still runs)
            assert not torch.equal(plain, base.logits)
        last = run.model(a, patch=Patch(src.activations, (PatchSite("resid", 3),))).logits
    assert torch.equal(last, src.logits)  # the last stream is all the read-out reads
    assert all(torch.equal(r, s) for r, s in zip(base.activations.residuals,
                                                 run.model(a, return_residuals=True).residuals))


def test_inside_one_cell_refuses_by_name(run, cases):
    ids = cases[0][0]["ids"].tolist()
    forward = run_forward(run.model, ids)
    for call in (lambda: inside_cell(run.model, ids, 1, 0, 4, 2, forward=forward),
                 lambda: inside_head(run.model, ids, 0, 1, forward=forward)):
        with pytest.raises(ValueError, match="x0_lambda"):
            call()
    with torch.inference_mode():
        cache = run.model(torch.tensor([ids]), cache=KVCache([])).cache
    with pytest.raises(ValueError, match="x0_lambda|smear"):
        layer_inputs(run.model, ids, 2, cache)
    with pytest.raises(ValueError, match="smear"):
        run.model.embed(torch.tensor([ids]), torch.arange(len(ids)))
    with pytest.raises(ValueError, match="value embedding"):  # a layer's values without their embeddings
        run.model.blocks[0].attn.split_heads(torch.zeros(1, 3, 32))


# ------------------------------------------------------------------------------ the engine's options


def test_the_options_are_off_by_default_and_count_their_parameters():
    from model.config import ModelConfig
    from model.transformer import DecoderLM

    plain = DecoderLM(ModelConfig(vocab_size=50, pos_encoding="rope", norm_kind="rmsnorm"))
    assert not any(w in n for n, _ in plain.named_parameters() for w in ("lambda", "smear", "value_embeds", "ve_gate"))
    base = dict(vocab_size=50, n_layers=3, d_model=32, n_heads=4, n_kv_heads=2, pos_encoding="rope",
                norm_kind="rmsnorm", bias=False)
    for options in ({"norm_weight": False, "qk_norm": "head"}, {"embed_norm": True}, {"smear_width": 8},
                    {"x0_mix": True, "backout_layer": 2}, {"value_embed_layers": [0, 2], "value_gate_width": 5},
                    {"norm_weight": False, "embed_norm": True, "qk_norm": "whole", "qk_gain": 1.5}):
        cfg = ModelConfig(**base, **options)
        assert DecoderLM(cfg).n_params() == cfg.n_params(), options
        assert ModelConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg  # as a checkpoint stores it


@pytest.mark.parametrize("options, field", [
    ({"norm_weight": 0}, "norm_weight"), ({"norm_weight": False, "norm_kind": "layernorm"}, "norm_weight"),
    ({"embed_norm": "yes"}, "embed_norm"), ({"smear_width": -1}, "smear_width"), ({"smear_width": 33}, "smear_width"),
    ({"x0_mix": 1}, "x0_mix"), ({"value_embed_layers": [3]}, "value_embed_layers"),
    ({"value_embed_layers": [1, 1], "value_gate_width": 4}, "value_embed_layers"),
    ({"value_embed_layers": [1]}, "value_gate_width"), ({"value_gate_scale": float("nan")}, "value_gate_scale"),
    ({"backout_layer": 3}, "backout_layer"), ({"backout_layer": True}, "backout_layer"), ({"qk_gain": 0}, "qk_gain"),
    ({"qk_gain": "1.2"}, "qk_gain"),
])
def test_hostile_option_values_are_refused_by_name(options, field):
    from model.config import ModelConfig

    with pytest.raises(ValueError, match=field):
        ModelConfig(**{"vocab_size": 50, "n_layers": 3, "d_model": 32, "norm_kind": "rmsnorm", **options})


def test_inside_one_cell_refuses_nanochat_by_name():
    """Inside one cell rebuilds a layer from its residual input alone; nanochat's blocks also read the
    embedding (x0 lambdas), its value embeddings and its smear, so the view says so in one sentence."""
    from model.config import ModelConfig
    from model.inside import rebuild_refusal

    assert rebuild_refusal(ModelConfig(vocab_size=16)) is None
    why = rebuild_refusal(ModelConfig(vocab_size=64, n_layers=2, n_heads=2, d_model=32, x0_mix=True,
                                      value_embed_layers=(1,), value_gate_width=12, smear_width=24,
                                      pos_encoding="rope", norm_kind="rmsnorm", norm_weight=False, norm_bias=False))
    assert why and "x0 lambdas" in why and "value embeddings" in why and "smear" in why and "\n" not in why
