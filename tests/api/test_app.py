"""The launched app through its public API (gradio_client) and raw HTTP, on 127.0.0.1.

Every client is its own session: text, sampling state and trained models must not leak between
them. Attention figures are decoded from the JSON the server sent (`viz.attention_panels`).
"""

from __future__ import annotations

import functools
import html
import json
import pickle
import re
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError

import viz
from lab.catalogue.models import BUILTIN_MODELS
from tests.support.api import QUANT, assert_clean_error, panels, words

GRAMMAR = "grammar (built-in)"
SORT = "sort digits (built-in)"
P = "anna found the key . she gave it to tom because he"
P_LEN = 12
ROOT = Path(__file__).resolve().parents[2]


def generated(tokens: list[dict]) -> list[str]:
    return [t["token"] for t in tokens if t["class_or_confidence"] == "generated"]


def step(c: Client, model=GRAMMAR, prompt=P, temperature=1.0, top_k=0, top_p=1.0, seed=3, layer=0, head="all",
         view="weights"):
    return c.predict(model, prompt, temperature, top_k, top_p, seed, layer, head, view, api_name="/step")


def train_args(steps=30, layers=1, heads=2, d_model=32, d_ff=64, corpus="sort"):
    return (corpus, "", None, "char", layers, heads, d_model, d_ff, "learned", "pre", "gelu", 0.0, steps, 0.003, 0)


@functools.lru_cache(maxsize=1)
def grammar_checkpoint():
    """The shipped grammar model, loaded in this process (without importing the app)."""
    from model.checkpoint import load_checkpoint

    return load_checkpoint(ROOT / "assets" / "grammar.safetensors")


def reference_tokens(prompt: str, seed: int, n: int) -> list[str]:
    """The text one session alone gets from `n` Steps (temperature 1, no top-k/top-p)."""
    from model.generate import Decoder, Sampling

    ck = grammar_checkpoint()
    dec = Decoder(ck.model, ck.tokenizer.encode(prompt), Sampling(1.0, 0, 1.0, seed), eos_id=ck.tokenizer.eos_id)
    for _ in range(n):
        dec.step()
    return [ck.tokenizer.piece(i) for i in dec.window]


@pytest.fixture
def client(app_server):
    return Client(app_server.url, verbose=False)


# ---------------------------------------------------------------------------- explore


def test_step_three_times_rows_grow_and_match_the_model(client):
    prev = None
    for k in range(1, 4):
        tokens, status, probs, attn = step(client, seed=5)
        T = P_LEN + k
        assert " ".join(words(tokens[:P_LEN])) == P and len(generated(tokens)) == k and len(tokens) == T
        assert f"{T} tokens in view ({k} generated)" in status
        p = panels(attn)
        assert p.shape == (4, T, T)
        np.testing.assert_array_equal(np.isnan(p[0]), np.triu(np.ones((T, T), dtype=bool), 1))
        if prev is not None:
            np.testing.assert_array_equal(p[:, : T - 1, : T - 1], prev)
        prev = p
    # the server drew the attention a full forward pass of the same model computes on that text
    ck = grammar_checkpoint()
    ids = ck.tokenizer.encode(P) + [ck.tokenizer.encode(w)[0] for w in generated(tokens)]
    with torch.inference_mode():
        out = ck.model(torch.tensor([ids]), return_attention=True)
    assert np.nanmax(np.abs(prev - out.attentions[0][0].numpy())) <= QUANT
    # undo removes exactly one token; the same seed then gives the same token back
    u_tokens, u_status, _, u_attn = client.predict(0, "all", "weights", api_name="/undo")
    assert u_tokens == tokens[:-1] and "14 tokens in view (2 generated)" in u_status
    np.testing.assert_allclose(panels(u_attn), prev[:, :14, :14], atol=2 * QUANT)
    again = step(client, seed=5)
    assert again[0] == tokens
    np.testing.assert_allclose(panels(again[3]), prev, atol=2 * QUANT)
    # reset starts over (the prompt box keeps what the person typed: /reset does not touch it)
    r_tokens, r_status, _, _ = client.predict(GRAMMAR, api_name="/reset")
    assert r_tokens == [] and r_status == ""
    assert len(step(client, seed=5)[0]) == P_LEN + 1


def test_generate_is_reproducible_by_seed(client):
    def gen(seed):
        client.predict(GRAMMAR, api_name="/reset")  # Generate goes on with a text: start each from the prompt
        tokens, status, _, attn = client.predict(GRAMMAR, P, 1.0, 0, 1.0, seed, 20, 0, "all", "weights",
                                                 api_name="/generate")
        assert len(generated(tokens)) == 20 and "32 tokens in view (20 generated)" in status
        assert panels(attn).shape == (4, 32, 32)
        return " ".join(generated(tokens))

    a, b, c = gen(1), gen(1), gen(2)
    assert a == b
    assert a != c


def test_generate_stops_at_eos(client):
    tokens, status, _, _ = client.predict("article toy (built-in)", "how is living in amsterdam <EOS>", 0.0, 0, 1.0,
                                          0, 30, 0, "all", "weights", api_name="/generate")
    assert generated(tokens) == ["exciting", "<EOS>"]
    assert "The model produced <EOS>" in status


def test_select_model_and_positional(client):
    tokens, summary, _, _, layer_u, head_u, view_u, caption, examples_u, prompt_u = client.predict(
        SORT, api_name="/select_model")
    assert tokens == [] and summary.startswith("sort digits (built-in): 2 layers × 4 heads, d_model 64, context 16")
    assert [c[1] for c in layer_u["choices"]] == [0, 1] and prompt_u["value"] == "503124="
    first = BUILTIN_MODELS[SORT].first_view  # the model opens on the view its caption talks about
    assert (layer_u["value"], head_u["value"], view_u["value"]) == (first.layer, first.head, first.view)
    assert html.unescape(caption) == first.caption  # Markdown: <EOS> arrives as &lt;EOS&gt;
    assert [c[1] for c in examples_u["choices"]] == list(BUILTIN_MODELS[SORT].examples)
    table, sim, info = client.predict(SORT, api_name="/positional")
    assert info.startswith("**sort digits (built-in)** uses **learned** positions: table of 16 positions × 64")
    assert json.loads(table["plot"])["data"] and json.loads(sim["plot"])["data"]
    _, _, info = client.predict("article toy (built-in)", api_name="/positional")
    assert "**sinusoidal**" in info


def test_the_readme_decodes_a_returned_attention_figure_as_written(client):
    readme = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    expr = re.search(r"`(viz\.attention_panels\(json\.loads\(.*?\)\))`", readme).group(1)
    tokens, _, _, attention = step(client, temperature=0.0)
    seen = eval(expr, {"viz": viz, "json": json, "attention": attention})  # noqa: S307 - our README's own line
    assert seen.shape == (4, P_LEN + 1, P_LEN + 1)
    np.testing.assert_array_equal(viz.attention_panels(attention), seen)  # the returned value itself works too
    ck = grammar_checkpoint()
    ids = ck.tokenizer.encode(P) + [ck.tokenizer.encode(w)[0] for w in generated(tokens)]
    with torch.inference_mode():
        out = ck.model(torch.tensor([ids]), return_attention=True)
    assert np.nanmax(np.abs(seen - out.attentions[0][0].numpy())) <= QUANT
    with pytest.raises(TypeError, match="figure's JSON"):
        viz.attention_panels({"tokens": tokens})


def test_a_model_without_norm_or_feed_forward_is_described_in_plain_words(client):
    _, summary, *_ = client.predict("article toy (built-in)", api_name="/select_model")
    assert summary.startswith("article toy (built-in): 1 layer × 1 head, d_model 4")
    assert "no norm" in summary and "no feed-forward layer" in summary
    assert "none-norm" not in summary and "gelu" not in summary and "layers" not in summary
    _, summary, *_ = client.predict(SORT, api_name="/select_model")
    assert "2 layers × 4 heads" in summary and "pre-norm, gelu feed-forward" in summary


def test_an_unknown_word_names_it_and_says_how_to_see_the_vocabulary(client):
    with pytest.raises(AppError) as info:  # a small vocabulary is listed whole
        step(client, model="article toy (built-in)", prompt="how is zebra")
    assert_clean_error(info.value, r"^This model does not know these words: 'zebra'\. Its vocabulary has 8 tokens: "
                                   r"how, is, living, in, amsterdam, exciting, (<|&lt;)EOS(>|&gt;)\.$")
    with pytest.raises(AppError) as info:  # a large one: where to see it
        step(client, prompt="anna found the zebra")
    assert_clean_error(info.value, r"^This model does not know these words: 'zebra'\. Its vocabulary has 97 tokens; "
                                   r"open “Vocabulary” \(under the text\) to see them all")


def test_prompt_longer_than_context_is_cropped_with_notice(client):
    tokens, status, _, attn = step(client, model=SORT, prompt="0123456789" * 3, temperature=0.0)
    assert "The prompt has 30 tokens but the model's context is 16; it keeps the last 16." in status
    assert "".join(words(tokens[:15])) == ("0123456789" * 3)[-15:]
    assert panels(attn).shape == (4, 16, 16)


@pytest.mark.parametrize(
    "prompt,pattern",
    [
        ("", r"^The prompt is empty: type a few words or characters first\.$"),
        ("  \n ", r"^The prompt is empty"),
        ("a" * 2001, r"^The prompt has 2,001 characters; the limit is 2,000\.$"),
        ("anna found the zebra", r"^This model does not know these words: 'zebra'\."),
    ],
    ids=["empty", "blank", "2001-chars", "unknown-word"],
)
def test_bad_prompt_gives_clear_error_and_app_keeps_working(client, prompt, pattern):
    with pytest.raises(AppError) as info:
        step(client, prompt=prompt)
    assert_clean_error(info.value, pattern)
    with pytest.raises(AppError) as info:
        client.predict(GRAMMAR, prompt, 1.0, 0, 1.0, 0, 5, 0, "all", "weights", api_name="/generate")
    assert_clean_error(info.value, pattern)
    assert len(step(client)[0]) == P_LEN + 1


@pytest.mark.parametrize(
    "args,pattern",
    [
        (dict(temperature=3), r"greater than maximum value 2|temperature must be"),
        (dict(top_k=51), r"greater than maximum value 50|top-k must be"),
        (dict(top_k=2.5), r"^top-k must be a whole number between 0 and 50; got 2\.5$"),
        (dict(top_p=0), r"less than minimum value 0\.05|top-p must be"),
        (dict(seed=-1), r"less than minimum value 0|seed must be"),
        (dict(layer=99), r"99 is not in the list of choices|layer must be"),
        (dict(head="x"), r"x is not in the list of choices|head must be"),
        (dict(model="nope"), r"nope is not in the list of choices|Unknown model 'nope'"),
    ],
    ids=lambda v: str(v)[:24],
)
def test_out_of_range_api_values_are_refused(client, args, pattern):
    with pytest.raises(AppError) as info:
        step(client, **args)
    assert_clean_error(info.value, pattern)


def test_max_new_tokens_is_enforced(client):
    for bad in (0, 10**6):
        with pytest.raises(AppError) as info:
            client.predict(GRAMMAR, P, 1.0, 0, 1.0, 0, bad, 0, "all", "weights", api_name="/generate")
        assert_clean_error(info.value, r"(than (maximum|minimum) value)|max new tokens must be")


# ------------------------------------------------------------------------------ sessions


def test_two_clients_never_see_each_others_text(app_server):
    a, b = Client(app_server.url, verbose=False), Client(app_server.url, verbose=False)
    pa, pb = "emma met peter at the station .", "john found the lamp ."
    for k in range(1, 5):
        ta = step(a, prompt=pa, seed=11)[0]
        tb = step(b, prompt=pb, seed=12)[0]
        # each session sees exactly what it would see alone (same model, prompt and seed)
        assert words(ta) == reference_tokens(pa, 11, k) and words(tb) == reference_tokens(pb, 12, k)
        assert " ".join(words(ta)).startswith(pa) and " ".join(words(tb)).startswith(pb)
    assert generated(ta) != generated(tb)
    # undo in one session leaves the other alone
    a.predict(0, "all", "weights", api_name="/undo")
    assert words(step(b, prompt=pb, seed=12)[0])[:-1] == words(tb)


@pytest.mark.slow
def test_train_use_stop_and_isolation(app_server, tmp_path):
    a, b = Client(app_server.url, verbose=False), Client(app_server.url, verbose=False)
    # a small model: train, then step with it
    status, loss, dd, download, _ = a.predict(*train_args(steps=30), api_name="/train")
    name = dd["value"]
    assert name == "my sort model" and [name, name] in dd["choices"]
    assert status.startswith("Training finished after 30 steps") and f"'{name}' is now in the Explore" in status
    assert json.loads(loss["plot"])["data"]
    tokens, st, _, attn = step(a, model=name, prompt="503124=", temperature=0.0)
    assert "my sort model: 1 layer × 2 heads, d_model 32" in st and len(tokens) == 8
    assert panels(attn).shape == (2, 8, 8)
    assert panels(a.predict(0, "all", "all layers", api_name="/undo")[3]).shape == (2, 7, 7)
    # the other session cannot use it
    with pytest.raises(AppError) as info:
        step(b, model=name, prompt="503124=")
    assert_clean_error(info.value, r"Unknown model 'my sort model'|my sort model is not in the list of choices")
    # the downloaded checkpoint loads in the other session and behaves the same
    up_status, up_dd = b.predict(handle_file(download["value"]), api_name="/upload_model")
    assert up_status == "Loaded 'uploaded: my-sort-model'. It is now in the Explore model list."
    assert up_dd["value"] == "uploaded: my-sort-model"
    tokens_b, _, _, attn_b = step(b, model="uploaded: my-sort-model", prompt="503124=", temperature=0.0)
    assert tokens_b == tokens
    np.testing.assert_array_equal(panels(attn_b), panels(attn))

    # a long run: Stop ends it before its 2000 steps and keeps what was learned (the waits are
    # hang guards only; the status saying who stopped it, and when, is what is checked)
    job = a.submit(*train_args(steps=2000, layers=2, heads=4, d_model=64, d_ff=256), api_name="/train")
    deadline = time.time() + 300
    while not job.outputs() and time.time() < deadline:
        time.sleep(0.05)
    assert job.outputs() and job.outputs()[0][0].startswith("step "), job.status()
    stopped = a.predict(api_name="/stop")  # the status the run ended with: the same as the run's last update
    status, _, dd, _, _ = job.result(timeout=300)
    assert status.startswith("Training stopped by you after ") and dd["value"] == "my sort model (2)"
    assert stopped == status
    done_steps = int(status.split("after ")[1].split(" steps")[0])
    assert 1 <= done_steps < 2000
    tokens, st, _, attn = step(a, model="my sort model (2)", prompt="503124=", temperature=0.0)
    assert "2 layers × 4 heads" in st and panels(attn).shape == (4, 8, 8)


# ------------------------------------------------------------------------------- uploads


def test_corrupt_uploads_give_clear_errors(client, tmp_path):
    rng = np.random.default_rng(0)
    random_bytes = tmp_path / "random.safetensors"
    random_bytes.write_bytes(rng.bytes(4096))
    pickled = tmp_path / "pickled.safetensors"
    pickled.write_bytes(pickle.dumps({"weight": list(range(100))}))
    truncated = tmp_path / "short.safetensors"
    truncated.write_bytes(b"\x10\x00")
    for f in (random_bytes, pickled, truncated):
        with pytest.raises(AppError) as info:
            client.predict(handle_file(str(f)), api_name="/upload_model")
        assert_clean_error(info.value, r"safetensors")
    tokens = step(client)[0]
    assert len(tokens) == P_LEN + 1


def test_upload_over_20_mb_is_refused(app_server):
    import httpx

    url = app_server.url + "gradio_api/upload"
    big = b"\0" * (20 * 1024 * 1024 + 1)
    r = httpx.post(url, files={"files": ("big.safetensors", big, "application/octet-stream")}, timeout=60)
    assert r.status_code == 413, r.text[:200]
    assert "maximum allowed size of 20971520 bytes" in r.text
    ok = httpx.post(url, files={"files": ("small.safetensors", b"x" * 1000, "application/octet-stream")}, timeout=60)
    assert ok.status_code == 200 and ok.json()[0].endswith("small.safetensors")


@pytest.mark.parametrize(
    "path",
    ["app.py", "/work/main/app.py", "ROOT/app.py", "ROOT/assets/sort.safetensors", "/etc/passwd",
     "../../../../etc/passwd", "%2e%2e/%2e%2e/%2e%2e/etc/passwd", "..%2f..%2f..%2fetc%2fpasswd"],
)
def test_file_route_refuses_project_and_system_files(app_server, path):
    path = path.replace("ROOT", str(ROOT))
    try:
        with urllib.request.urlopen(app_server.url + "gradio_api/file=" + path, timeout=10) as r:
            status, body = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, body = e.code, e.read()
    assert status in (400, 403, 404), (status, body[:100])
    assert b"root:" not in body and b"import gradio" not in body and b"decoder-lab" not in body


def test_no_handler_hit_an_unexpected_error(app_server):
    """Refusals are deliberate messages, logged as one line each; nothing falls through to the generic error.

    It sends its own bad calls first, so it means something when run alone, and then reads the log of
    everything this server has seen (the other tests' calls included).
    """
    c = Client(app_server.url, verbose=False)
    bad_calls = [
        ((GRAMMAR, "", 1.0, 0, 1.0, 0, 0, "all", "weights"), "/step"),
        ((GRAMMAR, "zzz qqq", 1.0, 0, 1.0, 0, 0, "all", "weights"), "/step"),
    ]
    for args, api in bad_calls:
        with pytest.raises(AppError):
            c.predict(*args, api_name=api)
    log = app_server.output()
    refusals = [line for line in log.splitlines() if "refused step:" in line]
    assert len(refusals) >= len(bad_calls), log[-2000:]
    assert "unexpected error" not in log and "Something went wrong" not in log
