"""The app's event handlers called directly (no server): what they return, what they refuse.

Attention figures are decoded back to numbers with `viz.attention_panels` from the JSON the
browser would receive, and compared with a fresh full forward pass of the model on the same
window: the attention drawn is the attention the model used.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import html
import json
import math
import re

import gradio as gr
import numpy as np
import plotly.graph_objects as go
import pytest
import torch

import app
import viz
from lab.catalogue.models import BUILTINS, DEFAULT_MODEL, counted
from lab.limits import MAX_NEW_TOKENS
from lab.session import Session
from ui import explore_tab

GRAMMAR = "grammar (built-in)"
SORT = "sort digits (built-in)"
COPY = "copy / induction (built-in)"
TOY = "article toy (built-in)"
P = BUILTINS.get(GRAMMAR).examples[0]  # 12 word tokens
P_LEN = 12
QUANT = 0.0005 + 1e-9  # figures carry integer milli-units: at most half a unit off


def panels(plot) -> np.ndarray:
    """(panels, T, T) values of an attention figure as sent to the browser, NaN where masked."""
    text = plot.plot if hasattr(plot, "plot") else plot["plot"]
    spec = json.loads(text)
    assert spec["layout"]["meta"]["viz"] == "attention", spec["layout"].get("meta")
    return viz.attention_panels(go.Figure(spec))


def fresh_forward(entry, window: list[int]):
    """Attention weights and scores of a full (uncached) forward pass, per layer (H, T, T)."""
    with torch.inference_mode():
        out = entry.model(torch.tensor([window]), return_attention=True)
    return [a[0].numpy() for a in out.attentions], [s[0].numpy() for s in out.scores]


def state_hash(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def do_step(ws, model=GRAMMAR, prompt=P, temperature=1.0, top_k=0, top_p=1.0, seed=3, layer=0, head="all",
            view="weights"):
    return app.step(ws, model, prompt, temperature, top_k, top_p, seed, layer, head, view)


def run_generate(ws, model=GRAMMAR, prompt=P, temperature=1.0, top_k=0, top_p=1.0, seed=3, max_new=5, layer=0,
                 head="all", view="weights"):
    return list(app.generate(ws, model, prompt, temperature, top_k, top_p, seed, max_new, layer, head, view))


def generated(tokens) -> list[str]:
    return [t for t, kind in tokens if kind == "generated"]


@contextlib.contextmanager
def raises_user_error(pattern: str):
    """A gr.Error whose message (what the person sees) matches `pattern`, with no traceback or paths."""
    with pytest.raises(gr.Error) as info:
        yield info
    msg = info.value.message
    assert re.search(pattern, msg), f"{msg!r} does not match {pattern!r}"
    assert "Traceback" not in msg and "Something went wrong" not in msg and "File \"" not in msg


def assert_causal_nan(p: np.ndarray) -> None:
    t = p.shape[-1]
    above = np.triu(np.ones((t, t), dtype=bool), 1)
    for k in range(p.shape[0]):
        np.testing.assert_array_equal(np.isnan(p[k]), above, err_msg=f"panel {k}: NaN exactly above the diagonal")


# ------------------------------------------------------------------------------- build


def test_build_demo_builds_without_launching():
    demo = app.build_demo()
    assert isinstance(demo, gr.Blocks)
    assert not getattr(demo, "is_running", False) and getattr(demo, "local_url", None) is None
    public = {f.api_name for f in demo.fns.values() if getattr(f, "api_visibility", "public") == "public"}
    assert public == {"step", "generate", "undo", "reset", "select_model", "positional", "train", "stop",
                      "upload_model", "film", "head_roles", "logit_lens", "ablate", "edit_attention", "regenerate",
                      "clear_changes", "compare", "export_session", "import_session", "link", "export_numbers",
                      "export_page", "export_film_page", "inside", "patch", "tool_models", "tool_generate",
                      "tool_attention", "tool_head_roles", "tool_logit_lens", "tool_ablate", "tool_inside_cell",
                      "tool_patch", "dla", "composition", "circuits", "atp", "tool_dla", "tool_composition",
                      "tool_head_circuits", "tool_atp"}



def test_the_page_state_holds_only_a_key_which_the_handler_trades_for_the_servers_session():
    """One home for a person's session: the server's store. The page's gr.State holds a key; the handler
    finds the session by the call's session hash and hands the key, never the session, back to the state."""
    from starlette.datastructures import Headers

    from lab.server.sessionstore import SessionKey
    from lab.session import SESSIONS

    key = copy.deepcopy(SessionKey(SESSIONS))  # what gr.State hands a new visitor
    request = gr.Request(session_hash="handlers-test-key", client=None, headers=Headers({}))
    try:
        out = app.step(key, GRAMMAR, P, 0.0, 0, 1.0, 0, 0, "all", "weights", request)
        session = SESSIONS.get("handlers-test-key")
        assert isinstance(session, Session) and key.session_hash == "handlers-test-key"
        assert out[0] is key and out[1] == session.tokens() and len(out[1]) == P_LEN + 1
        out = app.step(key, GRAMMAR, P, 0.0, 0, 1.0, 0, 0, "all", "weights", request)
        assert SESSIONS.get("handlers-test-key") is session and len(session.tokens()) == P_LEN + 2
        assert app.probs_figure(session).plot == explore_tab.probs_after_step(key, request).plot
    finally:
        key.close()  # what gradio does when it deletes the tab's state
    assert session.closed and SESSIONS.get("handlers-test-key") is None


# ------------------------------------------------------------------------------- step


def test_step_grows_one_row_per_call_and_draws_the_models_attention():
    ws = Session()
    entry = BUILTINS.get(GRAMMAR)
    L, H = entry.model.cfg.n_layers, entry.model.cfg.n_heads
    prev = None
    for k in range(1, 4):
        _, tokens, status, probs, attn = do_step(ws)
        T = P_LEN + k
        assert len(tokens) == T and len(generated(tokens)) == k
        assert [kind for _, kind in tokens[:P_LEN]] == ["prompt"] * P_LEN
        assert " ".join(t for t, _ in tokens[:P_LEN]) == P
        assert f"{T} tokens in view ({k} generated)" in status
        p = panels(attn)
        assert p.shape == (H, T, T)
        assert_causal_nan(p)
        if prev is not None:  # earlier rows unchanged, bit for bit
            np.testing.assert_array_equal(p[:, : T - 1, : T - 1], prev)
        prev = p
        # the drawn attention is the attention of a fresh forward pass on the window
        weights, scores = fresh_forward(entry, ws.decoder.window)
        for layer in range(L):
            np.testing.assert_allclose(ws.decoder.attention[layer], weights[layer], atol=2e-5)
            drawn = p if layer == 0 else panels(app.redraw(ws, layer, "all", "weights"))
            keep = ~np.isnan(drawn)
            assert np.abs(drawn[keep] - weights[layer][keep]).max() <= QUANT
            np.testing.assert_allclose(np.nansum(drawn, axis=-1), 1.0, atol=T * QUANT)
        # one head enlarged, every layer at once, and the pre-softmax scores
        one = panels(app.redraw(ws, L - 1, 2, "weights"))
        assert one.shape == (1, T, T)
        assert np.nanmax(np.abs(one[0] - weights[L - 1][2])) <= QUANT
        overview = panels(app.redraw(ws, 0, "all", "all layers"))
        assert overview.shape == (L * H, T, T)
        assert np.nanmax(np.abs(overview - np.stack(weights).reshape(L * H, T, T))) <= QUANT
        assert_causal_nan(overview)
        sc = panels(app.redraw(ws, 1, "all", "scores"))
        assert_causal_nan(sc)
        assert np.nanmax(np.abs(sc - scores[1])) <= QUANT + 1e-5
    # the probabilities shown are those of the last step
    assert json.loads(probs.plot)["data"], "probability figure has data"


def test_status_names_last_token_and_model():
    ws = Session()
    _, tokens, status, _, _ = do_step(ws, seed=11)
    last = generated(tokens)[-1]
    assert f"Last token: {last!r}" in status
    assert BUILTINS.get(GRAMMAR).summary in status
    assert ws.generated_text().strip() == last


def test_same_seed_same_text_different_seed_different_text():
    texts = {}
    for seed in (1, 1, 2):
        ws = Session()
        for _ in range(6):
            do_step(ws, seed=seed)
        texts.setdefault(seed, []).append(ws.generated_text())
    assert texts[1][0] == texts[1][1]
    assert texts[1][0] != texts[2][0]


def test_changing_prompt_or_seed_restarts_but_temperature_continues():
    ws = Session()
    do_step(ws, seed=5)
    do_step(ws, seed=5, temperature=0.5)  # continues the same text
    assert len(ws.decoder.ids) == P_LEN + 2
    do_step(ws, seed=6)  # new seed: new text
    assert len(ws.decoder.ids) == P_LEN + 1
    do_step(ws, prompt="anna found the key .", seed=6)
    assert len(ws.decoder.ids) == 5 + 1


def test_context_full_drops_oldest_token_with_notice():
    ws = Session()
    prompt = "111222333444555="  # sort model: context 16; its 15-digit answer runs past the window
    for _ in range(3):
        _, tokens, status, _, attn = do_step(ws, model=SORT, prompt=prompt, temperature=0.0)
    assert len(tokens) == 16
    assert "The context is full: the oldest token was dropped to keep 16." in status
    p = panels(attn)
    assert p.shape == (4, 16, 16)
    weights, _ = fresh_forward(BUILTINS.get(SORT), ws.decoder.window)
    assert np.nanmax(np.abs(p - weights[0])) <= QUANT
    assert_causal_nan(p)


def test_step_limit_of_generated_tokens():
    ws = Session()
    do_step(ws, model=TOY, prompt="how is living in amsterdam <EOS>", temperature=1.0, seed=1)
    ws.decoder.eos_id = None  # this test is about the length limit: an <EOS> on the way must not end the text
    for _ in range(MAX_NEW_TOKENS - 2):  # fast-forward without drawing figures
        ws.text.keep(ws.decoder.step())
    out = do_step(ws, model=TOY, prompt="how is living in amsterdam <EOS>", temperature=1.0, seed=1)
    assert len(out[1]) == 20 and f"20 tokens in view ({MAX_NEW_TOKENS} generated)" in out[2]
    assert len(ws.decoder.ids) - ws.decoder.prompt_len == MAX_NEW_TOKENS
    with raises_user_error(f"already has {MAX_NEW_TOKENS} generated tokens; Reset"):
        do_step(ws, model=TOY, prompt="how is living in amsterdam <EOS>", temperature=1.0, seed=1)


# --------------------------------------------------------------------------- generate


def test_generate_streams_and_stops_at_max_new():
    ws = Session()
    outs = run_generate(ws, seed=4, max_new=7)
    assert len(outs) >= 1
    final = outs[-1]
    assert len(generated(final[1])) == 7 and len(ws.decoder.ids) == P_LEN + 7
    assert "19 tokens in view (7 generated)" in final[2]
    assert panels(final[4]).shape == (4, 19, 19)
    for partial in outs[:-1]:  # intermediate updates carry text only, figures skipped
        assert partial[3] == gr.skip() and partial[4] == gr.skip()
    # generating is the same as stepping with the same seed
    ws2 = Session()
    for _ in range(7):
        do_step(ws2, seed=4)
    assert ws2.decoder.ids == ws.decoder.ids


def test_generate_stops_at_eos():
    ws = Session()
    outs = run_generate(ws, model=TOY, prompt="how is living in amsterdam <EOS>", temperature=0.0, max_new=10)
    final = outs[-1]
    assert generated(final[1]) == ["exciting", "<EOS>"]
    assert "The model produced <EOS>: end of sequence." in final[2]
    assert ws.last_step.eos


def test_generate_goes_on_with_the_text_and_a_new_seed_starts_again():
    ws = Session()
    do_step(ws, seed=4)
    do_step(ws, seed=4)
    ids = list(ws.decoder.ids)
    run_generate(ws, seed=4, max_new=3)
    assert len(ws.decoder.ids) == P_LEN + 5 and ws.decoder.ids[: P_LEN + 2] == ids
    run_generate(ws, seed=5, max_new=3)
    assert len(ws.decoder.ids) == P_LEN + 3


# ------------------------------------------------------------------------------ undo, reset, select


def test_undo_removes_one_token_and_step_reproduces_it():
    ws = Session()
    for _ in range(3):
        out = do_step(ws, seed=21)
    ids3, tokens3, attn3 = list(ws.decoder.ids), out[1], panels(out[4])
    _, tokens, status, probs, attn = app.undo(ws, 0, "all", "weights")
    assert tokens == tokens3[:-1]
    assert ws.decoder.ids == ids3[:-1]
    # the status and the chart are back at the previous token: what it was drawn from
    assert "14 tokens in view (2 generated)" in status and f"Last token: {tokens3[-2][0]!r}" in status
    p = panels(attn)
    assert p.shape == (4, 14, 14)
    np.testing.assert_allclose(p, attn3[:, :14, :14], atol=2 * QUANT)
    assert "(position 13) was drawn from this" in probs.plot
    out = do_step(ws, seed=21)
    assert ws.decoder.ids == ids3 and out[1] == tokens3
    np.testing.assert_allclose(panels(out[4]), attn3, atol=2 * QUANT)


def test_undo_never_removes_the_prompt_and_is_harmless_without_text():
    ws = Session()
    out = app.undo(ws, 0, "all", "weights")  # nothing started yet
    assert out[1] == [] and out[2] == ""
    do_step(ws)
    for _ in range(3):
        _, tokens, _, _, _ = app.undo(ws, 0, "all", "weights")
    assert len(tokens) == P_LEN and generated(tokens) == []


def test_reset_clears_text_and_leaves_the_prompt_alone():
    ws = Session()
    do_step(ws)
    do_step(ws)
    out = app.reset(ws, SORT)
    assert len(out) == 5, "no prompt among the outputs: Reset keeps what the person typed"
    _, tokens, status, _, attn = out
    assert tokens == [] and status == ""
    assert ws.decoder is None
    assert "Press Step" in json.dumps(json.loads(attn.plot))
    out = do_step(ws)
    assert len(out[1]) == P_LEN + 1


@pytest.mark.parametrize("name", list(BUILTINS.names))
def test_select_model_each_builtin(name):
    ws = Session()
    do_step(ws)
    entry = BUILTINS.get(name)
    cfg = entry.model.cfg
    _, tokens, summary, _, _, layer_u, head_u, view_u, caption, examples_u, prompt_u = app.select_model(ws, name)
    assert tokens == [] and ws.decoder is None
    assert summary == entry.summary and f"{counted(cfg.n_layers, 'layer')} × {counted(cfg.n_heads, 'head')}" in summary
    assert [c[1] for c in layer_u["choices"]] == list(range(cfg.n_layers))
    assert [c[1] for c in head_u["choices"]] == ["all"] + list(range(cfg.n_heads))
    fv = entry.first_view  # every built-in opens on the head worth seeing, with its caption
    assert (layer_u["value"], head_u["value"], view_u["value"]) == (fv.layer, fv.head, fv.view)
    assert html.unescape(caption) == fv.caption
    assert [value for _, value in examples_u["choices"]] == list(entry.examples) and len(entry.examples) >= 2
    for shown, value in examples_u["choices"]:  # the menu shows each prompt on one line, and sends it whole
        assert "\n" not in shown and shown.replace(" ⏎ ", "\n") == value
    assert prompt_u["value"] == BUILTINS.get(name).examples[0]
    # the example prompt works with that model
    out = do_step(ws, model=name, prompt=BUILTINS.get(name).examples[0], temperature=0.0)
    assert panels(out[4]).shape[0] == cfg.n_heads


def test_select_unknown_model():
    with raises_user_error("Unknown model 'nope'. Pick one from the list."):
        app.select_model(Session(), "nope")


@pytest.mark.parametrize("name", list(BUILTINS.names))
def test_positional_each_builtin(name):
    entry = BUILTINS.get(name)
    kind, table = entry.model.positional_table()
    pe_table, pe_sim, info = app.positional(Session(), name)
    assert f"**{name}**" in info
    if table is None:
        assert "no positional encoding" in info
        return
    assert f"**{kind}** positions: table of {table.shape[0]} positions × {table.shape[1]}" in info
    for fig in (pe_table, pe_sim):
        spec = json.loads(fig.plot)
        assert spec["data"], "figure has traces"
    expected = {GRAMMAR: "learned", SORT: "learned", COPY: "learned", TOY: "sinusoidal",
                "shakespeare (built-in)": "learned"}[name]
    assert kind == expected


# ---------------------------------------------------------------------------- bad input

BAD_STEP_INPUTS = [
    (dict(prompt=""), r"^The prompt is empty: type a few words or characters first\.$"),
    (dict(prompt="   \n\t "), r"^The prompt is empty"),
    (dict(prompt="a" * 2001), r"^The prompt has 2,001 characters; the limit is 2,000\.$"),
    (dict(prompt="anna found the zebra and qqq"), r"does not know these words: 'zebra', 'qqq'\. Its vocabulary has 97"),
    (dict(model=SORT, prompt="12a4=é"), r"^This model does not know these characters: 'a', 'é'\. Its vocabulary has 13"),
    (dict(temperature=math.nan), r"^temperature must be a number between 0\.0 and 2\.0; got nan$"),
    (dict(temperature=-1), r"^temperature must be a number between 0\.0 and 2\.0; got -1$"),
    (dict(temperature=3), r"^temperature must be a number between 0\.0 and 2\.0; got 3$"),
    (dict(temperature="hot"), r"^temperature must be a number"),
    (dict(top_k=51), r"^top-k must be a whole number between 0 and 50; got 51$"),
    (dict(top_k=-1), r"^top-k must be a whole number between 0 and 50; got -1$"),
    (dict(top_k=2.5), r"^top-k must be a whole number between 0 and 50; got 2\.5$"),
    (dict(top_p=0), r"^top-p must be a number between 0\.05 and 1\.0; got 0$"),
    (dict(top_p=1.5), r"^top-p must be a number between 0\.05 and 1\.0"),
    (dict(seed=-1), r"^seed must be a whole number between 0 and 2147483647; got -1$"),
    (dict(seed=2**31), r"^seed must be a whole number between 0 and 2147483647"),
    (dict(seed=None), r"^seed must be a whole number"),
    (dict(layer=99), r"^layer must be a whole number between 0 and 2; got 99$"),
    (dict(head="x"), r"^head must be a whole number between 0 and 3; got 'x'$"),
    (dict(head=4), r"^head must be a whole number between 0 and 3; got 4$"),
    (dict(model="nope"), r"^Unknown model 'nope'\. Pick one from the list\.$"),
]


@pytest.mark.parametrize("kwargs,message", BAD_STEP_INPUTS, ids=[m[:28] for _, m in BAD_STEP_INPUTS])
def test_step_rejects_bad_input_with_clear_error(kwargs, message):
    with raises_user_error(message) as info:
        do_step(Session(), **kwargs)
    assert "/" not in info.value.message


@pytest.mark.parametrize("max_new", [0, -3, 10**6, 2.5, "many"])
def test_generate_rejects_max_new(max_new):
    with raises_user_error(r"^max new tokens must be a whole number between 1 and 256"):
        next(app.generate(Session(), GRAMMAR, P, 1.0, 0, 1.0, 0, max_new, 0, "all", "weights"))


@pytest.mark.parametrize("kwargs,message", BAD_STEP_INPUTS[:6] + BAD_STEP_INPUTS[-1:], ids=lambda v: str(v)[:20])
def test_generate_rejects_bad_input(kwargs, message):
    args = dict(model=GRAMMAR, prompt=P, temperature=1.0, top_k=0, top_p=1.0, seed=0)
    args.update(kwargs)
    with raises_user_error(message):
        next(app.generate(Session(), args["model"], args["prompt"], args["temperature"], args["top_k"],
                          args["top_p"], args["seed"], 5, 0, "all", "weights"))


def test_bad_view_input_does_not_advance_the_text():
    ws = Session()
    do_step(ws)
    with pytest.raises(gr.Error):
        do_step(ws, layer=99)
    assert len(ws.decoder.ids) == P_LEN + 1


def test_error_keeps_the_workspace_usable():
    ws = Session()
    do_step(ws)
    with pytest.raises(gr.Error):
        do_step(ws, prompt="")
    out = do_step(ws)  # same prompt and seed: continues the text
    assert len(generated(out[1])) == 2


def test_prompt_longer_than_context_keeps_last_tokens_with_notice():
    ws = Session()
    prompt = "0123456789" * 3  # 30 character tokens; the sort model's context is 16
    _, tokens, status, _, attn = do_step(ws, model=SORT, prompt=prompt, temperature=0.0)
    assert "The prompt has 30 tokens but the model's context is 16; it keeps the last 16." in status
    assert ws.decoder.ids[:16] == BUILTINS.get(SORT).tokenizer.encode(prompt[-16:])
    # after one new token the window is the prompt's last 15 characters and the new one
    assert "".join(t for t, _ in tokens[:15]) == prompt[-15:] and len(tokens) == 16
    assert panels(attn).shape == (4, 16, 16)
    # the longest allowed prompt (2,000 characters) is accepted and cropped the same way
    _, tokens, status, _, _ = do_step(ws, prompt=("he " * 667)[:2000], temperature=0.0)
    context = BUILTINS.get(DEFAULT_MODEL).model.cfg.block_size
    assert f"keeps the last {context}" in status and len(tokens) == context


# --------------------------------------------------------------------------- training, isolation


def _train(ws, corpus="sort", layers=1, heads=2, d_model=32, d_ff=64, steps=20, pasted="", tok="char", lr=3e-3):
    return list(app.train_model(ws, corpus, pasted, None, tok, layers, heads, d_model, d_ff, "learned", "pre", "gelu",
                                0.0, steps, lr, 0))


def test_trained_model_is_private_and_builtins_stay_unchanged():
    before = {n: state_hash(BUILTINS.get(n).model) for n in BUILTINS.names}
    for n in BUILTINS.names:
        m = BUILTINS.get(n).model
        assert not m.training and not any(p.requires_grad for p in m.parameters())
    mine, other = Session(), Session()
    for _ in range(3):
        do_step(other, seed=2)
    outs = _train(mine)
    _, summary, _, dd, download, _ = outs[-1]
    name = dd["value"]
    assert name == "my sort model" and name in dd["choices"]
    assert summary.startswith("Training finished after 20 steps") and f"'{name}' is now in the Explore" in summary
    assert download["value"].endswith("my-sort-model.safetensors")
    out = do_step(mine, model=name, prompt="503124=", temperature=0.0)
    assert panels(out[4]).shape == (2, 8, 8)
    assert "my sort model: 1 layer × 2 heads, d_model 32" in out[2]
    with raises_user_error(r"^Unknown model 'my sort model'"):
        do_step(other, model=name, prompt="503124=")
    for _ in range(3):
        do_step(other, seed=2)
    after = {n: state_hash(BUILTINS.get(n).model) for n in BUILTINS.names}
    assert after == before
    mine.close()
    assert not mine.run_dir.exists()


@pytest.mark.parametrize(
    "override,message",
    [
        (dict(corpus="nope"), r"^Unknown corpus 'nope'"),
        (dict(layers=5), r"^layers must be a whole number between 1 and 4; got 5$"),
        (dict(heads=0), r"^heads must be a whole number between 1 and 4"),
        (dict(d_model=4096), r"^d_model must be a whole number between 8 and 128"),
        (dict(steps=0), r"^steps must be a whole number between 1 and 2000; got 0$"),
        (dict(steps=2001), r"^steps must be a whole number between 1 and 2000; got 2001$"),
        (dict(lr=1.0), r"^learning rate must be a number between"),
        (dict(corpus="text", pasted="too short"), r"the text is too short"),
        (dict(corpus="text", pasted="a" * 1_200_001), r"the text is too long: 1200001 characters; at most 1200000"),
    ],
)
def test_train_rejects_bad_settings(override, message):
    ws = Session()
    with raises_user_error(message):
        _train(ws, **override)
    assert ws.models == {} and ws.run is None


def test_an_own_model_offers_examples_from_its_corpus_and_opens_on_layer_0():
    ws = Session()
    name = _train(ws, steps=5)[-1][3]["value"]
    out = app.select_model(ws, name)
    examples, prompt = out[9], out[10]
    assert prompt["value"] == ws.models[name].examples[0] != ""
    assert [value for _, value in examples["choices"]] == list(ws.models[name].examples)
    assert (out[5]["value"], out[6]["value"]) == (0, "all") and "Your own model" in out[8]


def test_upload_model_corrupt_and_valid(tmp_path):
    ws = Session()
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x00\x01garbage" * 100)
    with raises_user_error("safetensors") as info:
        app.upload_model(ws, str(bad))
    assert "/" not in info.value.message
    assert bad.exists() and ws.models == {}  # gradio's cache sweep removes uploads, never the handler
    with raises_user_error(r"^Choose a \.safetensors file first\.$"):
        app.upload_model(ws, None)
    from model.checkpoint import save_checkpoint

    e = BUILTINS.get(SORT)
    good = save_checkpoint(tmp_path / "mine.safetensors", e.model, e.tokenizer, e.meta)
    _, msg, dd = app.upload_model(ws, str(good))
    assert msg == "Loaded 'uploaded: mine'. It is now in the Explore model list." and dd["value"] == "uploaded: mine"
    assert good.exists()  # left to gradio's cache sweep
    out = do_step(ws, model="uploaded: mine", prompt="503124=", temperature=0.0)
    ref = do_step(Session(), model=SORT, prompt="503124=", temperature=0.0)
    assert out[1] == ref[1]
    np.testing.assert_array_equal(panels(out[4]), panels(ref[4]))
