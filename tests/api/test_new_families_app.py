"""Every tool of the running app on every family of issue 39 (gradio_client against one real server started
with `--model` for each folder): Llama 3 (its llama3 rotary table), Qwen2 (biases on q, k, v; GQA 7:1),
Qwen3 (heads wider than d / heads, per-head q/k norms), Gemma 3 (a local window of 3 keys, shorter than the
prompt, with its own rotary base; four norms per layer), OLMo 2 (norms after each branch, q/k norms over the
whole projection), SmolLM3 (a layer without rotary) and Phi-3 (partial rotary, a window of 4), each a tiny
random model built with transformers' own classes (tests/support/family_folders.py).

What the API answers is held to transformers (eager attention) on the same weights: attention to 1e-6
through the unrounded numbers download, greedy tokens, Generate and Undo, head roles, the logit lens,
ablation (the effect's KL against transformers with the head's output zeroed by a hook), an edited row,
Compare's KL, a patching sweep (every cell against transformers with that head's output taken from the
other prompt by a hook), one Inside cell (its weight is the attention map's entry and transformers'), a
session file opened in another client, and a link opened by a page load. Each family's answers are its
own: clients of different families step in turns and each still reads its own model.
"""

from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from gradio_client import Client, handle_file

from model.families import open_folder
from model.heads import head_scores
from tests.support.api import QUANT, panels
from tests.support.families import hf_tokenizer
from tests.support.family_folders import build_family
from tests.support.server import AppServer
from tests.support.share_api import value
from tests.support.shares_server import Listener, function, join

import transformers  # noqa: F401 - the reference: a missing package fails collection, never skips

ATTN_TOL = 1e-6
GREEDY = (0.0, 0, 1.0, 0)  # temperature, top-k, top-p, seed
PROMPT = "Once upon a time the fox met a bear"  # 10 to 11 tokens: longer than every window below
A, B = "the fox met a bear", "the bear met a fox"  # a minimal pair: the same number of tokens
PAGE = ["linear", False, "1280x720", 0, "all", "weights"]  # what the page sends on load (after the session)
# folder name -> (options over tests/support/family_folders' shape, the family the summary names, what the
# Inside cell's model facts must say of layer 0 and layer 1: its own features)
CASES = {
    "llama3": ({}, "Llama", ({"rope_scaling": ["llama3", 8.0, 1.0, 4.0, 256], "rope_base": 500000.0},) * 2),
    "qwen2": ({}, "Qwen2", ({"qkv_bias": True, "out_bias": False, "kv_heads": 1, "n_heads": 7},) * 2),
    "qwen3": ({}, "Qwen3", ({"qk_norm": "head", "head_dim": 8, "attn_dim": 32, "d_model": 16},) * 2),
    "gemma3": ({"num_hidden_layers": 2}, "Gemma 3", ({"window": 3, "rope_base": 100.0, "rope_local": True,
                                                       "norm": "sandwich", "norm_offset": 1.0},
                                                      {"window": 0, "rope_base": 50000.0,
                                                       "rope_scaling": ["linear", 4.0]})),
    "olmo2": ({}, "OLMo 2", ({"qk_norm": "whole", "norm": "post_branch", "head_dim": 10},) * 2),
    "smollm3": ({}, "SmolLM3", ({"rotary": True, "rope_off": False}, {"rotary": False, "rope_off": True})),
    "phi3": ({}, "Phi-3", ({"rotary_dims": 6, "head_dim": 8, "window": 4},) * 2),
}


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("new_families")
    refs = {}
    for family, (changes, _, _) in CASES.items():
        ref, folder = build_family(family, tmp, **changes)
        # tok: transformers' own tokenizer (the ids); pieces: the folder's as the app reads it (what it shows)
        refs[family] = SimpleNamespace(model=ref, folder=folder, tok=hf_tokenizer(folder),
                                       pieces=open_folder(folder)[1], L=ref.config.num_hidden_layers,
                                       H=ref.config.num_attention_heads, Hkv=ref.config.num_key_value_heads)
    args = [a for r in refs.values() for a in ("--model", str(r.folder))]
    env = {"DECODER_LAB_MODEL_HASHES": str(tmp / "hashes.json"), "DECODER_LAB_BUSY_WAIT_S": "600"}
    server = AppServer(env, tmp, args=args).start()
    yield SimpleNamespace(server=server, refs=refs)
    server.stop()


def name_of(family: str) -> str:
    return f"{family} (folder)"


def client(app) -> Client:
    return Client(app.server.url, verbose=False)


# ------------------------------------------------------------------------------ transformers, by hand


def run(r, ids, hook=None, layer: int | None = None):
    """transformers' logits (T, V) float64 and attention (one (H, T, T) per layer) on `ids`; hook: a forward
    pre-hook put on layer `layer`'s output projection, which reads the heads' outputs side by side."""
    handle = None if hook is None else r.model.model.layers[layer].self_attn.o_proj.register_forward_pre_hook(hook)
    try:
        with torch.no_grad():
            out = r.model(torch.tensor([list(ids)]), output_attentions=True)
    finally:
        if handle is not None:
            handle.remove()
    return out.logits[0].double(), [a[0].double().numpy() for a in out.attentions]


def head_slice(r, head: int) -> slice:
    hs = r.model.model.layers[0].self_attn.o_proj.in_features // r.H
    return slice(head * hs, (head + 1) * hs)


def greedy(r, ids, n: int) -> list[int]:
    ids = list(ids)
    for _ in range(n):
        ids.append(int(run(r, ids)[0][-1].argmax()))
    return ids


def probs(logits_row: torch.Tensor) -> np.ndarray:
    return torch.softmax(logits_row, -1).numpy()


def kl_bits(p: np.ndarray, q: np.ndarray) -> float:
    return float(np.sum(p * (np.log(p) - np.log(q))) / math.log(2))


# ------------------------------------------------------------------------------ the app's answers


def exported(c: Client, family: str, layer: int, what: str = "weights") -> dict:
    path = c.predict(what, "json", name_of(family), layer, "all", api_name="/export_numbers")
    return json.loads(Path(path).read_text(encoding="utf-8"))


def as_array(values) -> np.ndarray:
    """The download's attention with null (a key after its query) as NaN."""
    return np.array(values, dtype=object).astype(float)


def check_attention(c: Client, r, family: str, ids: list[int]) -> list[np.ndarray]:
    """Every layer's attention in the download is transformers' on `ids` (1e-6); the masked entries (null, or
    0 outside a window) are transformers' zeros. Returns transformers' attention."""
    _, want = run(r, ids)
    for layer in range(r.L):
        data = exported(c, family, layer)
        assert data["token_ids"] == ids and data["heads"] == list(range(r.H))
        got = as_array(data["values"])
        assert got.shape == want[layer].shape
        assert np.all(want[layer][np.isnan(got)] == 0.0), "a key shown as masked has weight in transformers"
        assert np.nanmax(np.abs(got - want[layer])) <= ATTN_TOL, (family, layer)  # every row, the last included
    return want


def step(c: Client, family: str, layer: int = 0):
    return c.predict(name_of(family), PROMPT, *GREEDY, layer, "all", "weights", api_name="/step")


# ------------------------------------------------------------------------------ the tests


@pytest.mark.parametrize("family", list(CASES))
def test_step_generate_undo_are_transformers_tokens_and_attention(app, family):
    r, c = app.refs[family], client(app)
    summary = value(c.predict(name_of(family), api_name="/select_model")[1])
    assert f"{CASES[family][1]}," in summary and f"2 layers × {r.H} heads" in summary, summary
    prompt_ids = r.tok(PROMPT)["input_ids"]
    want = greedy(r, prompt_ids, 3)
    tokens, status, _, attn = step(c, family)
    assert len(tokens) == len(prompt_ids) + 1 and "(1 generated)" in status, status
    attention = check_attention(c, r, family, want[: len(prompt_ids) + 1])
    # the figure's panels: the same numbers, rounded for the page (Qwen2's 7 heads: a page of the first 6)
    shown = panels(attn)
    assert shown.shape[0] == min(r.H, 6)
    assert np.nanmax(np.abs(shown - attention[0][: shown.shape[0]])) <= QUANT + ATTN_TOL
    c.predict(name_of(family), PROMPT, *GREEDY, 2, 0, "all", "weights", api_name="/generate")
    tokens, status, _, attn = c.predict(0, "all", "weights", api_name="/undo")
    n = len(prompt_ids) + 2
    assert len(tokens) == n and f"{n} tokens in view (2 generated)" in status, status
    check_attention(c, r, family, want[:n])
    assert window_masked(attention) == (family in ("gemma3", "phi3"))


def window_masked(attention) -> bool:
    """Whether some key before its query is hidden (a local window shorter than the text), as transformers has it."""
    T = attention[0].shape[-1]
    below = np.tril(np.ones((T, T), dtype=bool))
    return any(bool((a[:, below] == 0.0).any()) for a in attention)


@pytest.mark.parametrize("family", list(CASES))
def test_head_tools_are_transformers_numbers(app, family):
    r, c = app.refs[family], client(app)
    step(c, family)
    ids = greedy(r, r.tok(PROMPT)["input_ids"], 1)
    T, L, H = len(ids), r.L, r.H
    logits, attention = run(r, ids)
    p = probs(logits[-1])
    # head roles: one row per query head (every head of a group reads the same key/value head)
    table = c.predict(api_name="/head_roles")
    assert table["columns"][:2] == ["layer", "head"] and table["columns"][-1] == "role"
    rows = {(row[0], row[1]): dict(zip(table["columns"], row)) for row in table["data"]}
    assert sorted(rows) == [(layer, head) for layer in range(L) for head in range(H)]
    scores = head_scores(attention, ids)
    for (layer, head), row in rows.items():
        for key in ("previous_token", "first_token", "induction"):
            want = float(scores[key][layer, head])
            assert (row[key] is None) if np.isnan(want) else row[key] == pytest.approx(want, abs=1e-4)
    # the logit lens's last stage is the model's own next-token distribution
    _, lens = c.predict(T - 1, api_name="/logit_lens")
    last = [row for row in lens["data"] if row[0] == f"after layer {L - 1}"]
    top = np.argsort(-p, kind="stable")[: len(last)]
    assert last and [row[2] for row in last] == [piece(r, int(i)) for i in top]
    assert [row[3] for row in last] == pytest.approx([float(p[i]) for i in top], abs=1e-6)
    # ablation: the last layer's head 0 zeroed is transformers with that head's output zeroed
    _, summary, _, effect = c.predict([f"L{L - 1}H0"], "zero", False, L - 1, "all", api_name="/ablate")
    cut = head_slice(r, 0)

    def zero(module, inputs):
        x = inputs[0].clone()
        x[..., cut] = 0.0
        return (x,)
    q = probs(run(r, ids, zero, L - 1)[0][-1])
    assert effect["active"] and effect["index"] == T - 1 and "KL(before ‖ after)" in summary
    assert effect["kl_bits"] == pytest.approx(kl_bits(p, q), abs=1e-5)
    for move in effect["moves"]:  # the token whose probability it shows (pieces of partial bytes repeat)
        token = int(np.argmin(np.abs(p - move["before"])))
        assert move["before"] == pytest.approx(float(p[token]), abs=1e-6)
        assert move["after"] == pytest.approx(float(q[token]), abs=1e-6)
        assert move["piece"] == piece(r, token)
    # an edited row: the last token's row of layer 0's last head attends to every key it may see equally,
    # and the model's own row beside it is transformers'
    c.predict([], "zero", False, 0, "all", api_name="/ablate")
    _, _, data = c.predict(f"L0H{H - 1}", "uniform", api_name="/edit_attention")
    assert data["active"]
    drawn = exported(c, family, 0)
    row = as_array(drawn["values"])[H - 1, T - 1]
    allowed = attention[0][H - 1, T - 1] > 0
    assert drawn["drawn"] == "changed" and row == pytest.approx(np.where(allowed, 1 / allowed.sum(), 0.0), abs=1e-7)
    assert np.nanmax(np.abs(as_array(drawn["unchanged_values"]) - attention[0])) <= ATTN_TOL
    c.predict(0, "all", api_name="/clear_changes")
    assert exported(c, family, 0)["drawn"] == "unchanged"
    # Compare: KL(A ‖ B) of the next token, the pieces of B
    _, _, _, _, data = c.predict(name_of(family), A, B, 0, api_name="/compare")
    ids_a, ids_b = r.tok(A)["input_ids"], r.tok(B)["input_ids"]
    assert data["tokens_b"] == [piece(r, i) for i in ids_b]
    p_a, p_b = probs(run(r, ids_a)[0][-1]), probs(run(r, ids_b)[0][-1])
    assert data["kl_bits"] == pytest.approx(kl_bits(p_a, p_b), abs=1e-5) and data["kl_bits"] > 1e-3


def piece(r, token: int) -> str:
    """A token as the page shows it (the folder's tokenizer's piece: a space drawn as ␣)."""
    return r.pieces.piece(token)


@pytest.mark.parametrize("family", list(CASES))
def test_a_patching_sweep_is_transformers_with_each_head_swapped(app, family):
    r, c = app.refs[family], client(app)
    got = c.predict(name_of(family), A, B, "logit_diff", " fox", " bear", "heads", "denoising", api_name="/patch")
    fox, bear = (r.tok(w, add_special_tokens=False)["input_ids"] for w in (" fox", " bear"))
    assert len(fox) == len(bear) == 1
    ids_a, ids_b = r.tok(A)["input_ids"], r.tok(B)["input_ids"]

    def metric(logits):
        return float(logits[-1, fox[0]] - logits[-1, bear[0]])
    assert got["metric_a"] == pytest.approx(metric(run(r, ids_a)[0]), abs=1e-4)
    assert got["metric_b"] == pytest.approx(metric(run(r, ids_b)[0]), abs=1e-4)
    assert (got["rows"], got["columns"]) == ([f"L{i}" for i in range(r.L)], [f"H{h}" for h in range(r.H)])
    assert got["done"] == got["cells"] == r.L * r.H and not got["stopped"]
    want = np.zeros((r.L, r.H))
    for layer in range(r.L):
        kept = {}

        def record(module, inputs):
            kept["a"] = inputs[0].clone()
        run(r, ids_a, record, layer)  # A's heads' outputs entering this layer's output projection
        for head in range(r.H):
            cut = head_slice(r, head)

            def swap(module, inputs):
                x = inputs[0].clone()
                x[..., cut] = kept["a"][..., cut]
                return (x,)
            want[layer, head] = metric(run(r, ids_b, swap, layer)[0])
    np.testing.assert_allclose(np.array(got["metric_patched"], dtype=float), want, atol=1e-4, rtol=0)
    share = (want - got["metric_b"]) / (got["metric_a"] - got["metric_b"])
    np.testing.assert_allclose(np.array(got["values"], dtype=float), share, atol=1e-3, rtol=0)


@pytest.mark.parametrize("family", list(CASES))
def test_an_inside_cell_is_the_attention_maps_entry(app, family):
    r, c = app.refs[family], client(app)
    step(c, family)
    ids = greedy(r, r.tok(PROMPT)["input_ids"], 1)
    T = len(ids)
    _, attention = run(r, ids)
    head = r.H - 1
    for layer in range(r.L):
        key = int(np.argmax(attention[layer][head, T - 1]))
        cell = c.predict(layer, head, T - 1, key, api_name="/inside")
        entry = as_array(exported(c, family, layer)["values"])[head, T - 1, key]
        # the cell is rebuilt from the text's cache, the map kept from its Steps: float32 apart at most
        assert cell["weight"] == pytest.approx(entry, abs=ATTN_TOL)
        assert cell["weight"] == pytest.approx(float(attention[layer][head, T - 1, key]), abs=ATTN_TOL)
        assert not cell["masked"] and cell["kv_head"] == head // (r.H // r.Hkv)
        facts = cell["model_facts"]
        for name, want in CASES[family][2][layer].items():
            assert facts[name] == want, (family, layer, name, facts[name])
        window = facts["window"]
        if window:  # a key before the window: masked, weight 0, as transformers has it
            hidden = c.predict(layer, head, T - 1, T - 1 - window, api_name="/inside")
            assert hidden["masked"] and hidden["weight"] == 0.0 == attention[layer][head, T - 1, T - 1 - window]


@pytest.mark.parametrize("family", list(CASES))
def test_a_session_file_and_a_link_reopen_the_text(app, family):
    r, c = app.refs[family], client(app)
    step(c, family)
    tokens, _, _, attn = step(c, family)
    form = (name_of(family), PROMPT, *GREEDY, 0, "all", "weights")
    path, _ = c.predict(*form, api_name="/export_session")
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    assert doc["model"]["external"] == f"local folder {family}"
    out = [value(x) for x in client(app).predict(handle_file(path), api_name="/import_session")]
    assert out[0] == name_of(family) and out[4] == tokens and out[7]["plot"] == attn["plot"]
    page = c.predict(*form, api_name="/link")
    query = html.unescape(re.search(r'href="([^"]+)"', page).group(1))
    assert f"model={family}+%28folder%29" in query and "steps=2" in query
    # the link opened as a page load opens it: the same text
    session = f"link-{family}"
    assert join(app.server, function(app.server, event="load"), [None, *PAGE], session, "127.0.0.1",
                query).status_code == 200
    listener = Listener(app.server, session, "127.0.0.1")
    try:
        done = listener.wait("process_completed")
    finally:
        listener.close()
    assert done["success"], str(done)[:300]
    assert done["output"]["data"][5] == tokens


def test_each_family_answers_for_itself(app):
    """Clients of every family step in turns on one server; each then reads its own model's attention and
    cell facts, never another's."""
    clients = {family: client(app) for family in CASES}
    for family, c in clients.items():
        step(c, family)
    for family, c in clients.items():
        step(c, family, layer=1)  # a second token, after every other family's first
    for family, c in clients.items():
        r = app.refs[family]
        ids = greedy(r, r.tok(PROMPT)["input_ids"], 2)
        check_attention(c, r, family, ids)
        cell = c.predict(1, 0, None, None, api_name="/inside")
        assert cell["model"] == name_of(family) and cell["model_facts"]["n_heads"] == r.H
