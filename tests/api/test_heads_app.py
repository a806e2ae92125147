"""The head tools through the running app's API (gradio_client against a real server):
/head_roles, /logit_lens, /ablate, /edit_attention, /regenerate, /compare and /clear_changes,
their numbers held against the model computed here, and their refusals (clear, nothing changed)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from gradio_client import Client
from gradio_client.exceptions import AppError

from lab.catalogue.models import BUILTINS
from lab.heads import Effect
from lab.headsettings import changed_attention
from lab.session import Session
from model.generate import Sampling
from tests.support.api import assert_clean_error

GRAMMAR, COPY = "grammar (built-in)", "copy / induction (built-in)"
P = "anna found the key . she gave it to tom because he"
GREEDY = (0.0, 0, 1.0, 0)


@pytest.fixture
def client(app_server):
    c = Client(app_server.url, verbose=False)
    c.predict(GRAMMAR, P, *GREEDY, 1, 0, "weights", api_name="/step")
    return c


def local(prompt=P, model=GRAMMAR, steps=1) -> Session:
    s = Session()
    for _ in range(steps):
        s.step(model, prompt, Sampling(temperature=0.0))
    return s


def assert_same_effect(data: dict, e: Effect) -> None:
    """The server's effect is the one computed here: the same candidates, probabilities to float
    rounding (the server runs one torch thread, this process several), KL to 2 %."""
    assert [m["piece"] for m in data["moves"]] == [m.piece for m in e.moves]
    for got, want in zip(data["moves"], e.moves):
        assert got["before"] == pytest.approx(want.before, abs=1e-5)
        assert got["after"] == pytest.approx(want.after, abs=1e-5)
        assert (got["rank_before"], got["rank_after"]) == (want.rank_before, want.rank_after)
    assert data["kl_bits"] == pytest.approx(e.kl_bits, rel=2e-2, abs=1e-6)


def test_head_roles_table(client):
    table = client.predict(api_name="/head_roles")
    cols = table["columns"]
    assert cols[:2] == ["layer", "head"] and cols[-1] == "role" and "match" in cols
    rows = {(r[0], r[1]): dict(zip(cols, r)) for r in table["data"]}
    assert len(rows) == 12
    assert rows[(1, 0)]["role"] == "pronoun → name"  # the head the README points to
    expect = local().heads.head_roles()
    for (layer, head), row in rows.items():
        for key in ("previous_token", "first_token", "self_attention", "entropy", "match"):
            assert row[key] == pytest.approx(float(expect.scores[key][layer, head]), abs=1e-4)
    assert table["thresholds"]["previous_token"] == 0.5 and "A[i, i−1]" in table["formulas"]["previous_token"]


def test_copy_model_labels_its_induction_head(app_server):
    c = Client(app_server.url, verbose=False)
    c.predict(COPY, "hcbpadlk|", *GREEDY, 6, 0, 1, "weights", api_name="/generate")
    rows = {(r[0], r[1]): r[-1] for r in c.predict(api_name="/head_roles")["data"]}
    assert rows[(0, 1)] in ("induction", "copy match")


def test_logit_lens_last_row_is_the_models_distribution(client):
    _, data = client.predict(11, api_name="/logit_lens")
    assert data["index"] == 11 and data["token"] == "he"
    stages = list(dict.fromkeys(r[0] for r in data["data"]))
    assert stages == ["embedding", "after layer 0", "after layer 1", "after layer 2"]
    entry = BUILTINS.get(GRAMMAR)
    ids = entry.tokenizer.encode(P + " asked")
    with torch.inference_mode():
        probs = torch.softmax(entry.model(torch.tensor([ids])).logits[0, 11].double(), -1).numpy()
    last = [r for r in data["data"] if r[0] == "after layer 2"]
    top = np.argsort(-probs)[: len(last)]
    assert [r[2] for r in last] == [entry.tokenizer.piece(int(i)) for i in top]
    assert [r[3] for r in last] == pytest.approx([float(probs[i]) for i in top], abs=1e-6)


def test_ablate_reports_the_effect_and_clear_undoes_it(client):
    _, summary, _, data = client.predict(["L2H3", "L1H1"], "zero", False, 1, 0, api_name="/ablate")
    assert data["active"] and "L1H1, L2H3 zeroed" in data["what"]
    s = local()
    s.heads.set_ablation(["L2H3", "L1H1"], "zero", False)
    assert_same_effect(data, s.heads.effect())
    assert "KL(before ‖ after)" in summary
    # the ablation stays while the text grows: the next Step's effect is for the new text
    client.predict(GRAMMAR, P, *GREEDY, 1, 0, "weights", api_name="/step")
    _, _, _, data = client.predict(["L2H3", "L1H1"], "zero", False, 1, 0, api_name="/ablate")
    assert data["token"] == "her" or data["index"] == 13
    client.predict(1, 0, api_name="/clear_changes")
    _, _, _, data = client.predict([], "zero", False, 1, 0, api_name="/ablate")
    assert data == {"active": False}


@pytest.mark.parametrize("args, pattern", [
    ((["L7H0"], "zero", False), "layers 0–2"),
    ((["L0H9"], "zero", False), "heads 0–3"),
    ((["nonsense"], "zero", False), "L<layer>H<head>"),
    (("L0H0", "explode", False), "ablation mode"),
    ((["L0H0"], "zero", "maybe"), "true or false"),
    (([], "zero", True), "at least one head"),
    ((123, "zero", False), "list"),
])
def test_ablate_refusals_change_nothing(client, args, pattern):
    client.predict(["L1H1"], "mean", False, 1, 0, api_name="/ablate")
    with pytest.raises(AppError) as info:
        client.predict(*args, 1, 0, api_name="/ablate")
    assert_clean_error(info.value, pattern)
    _, _, _, data = client.predict(["L1H1"], "mean", False, 1, 0, api_name="/ablate")
    assert data["what"] == "L1H1 mean-ablated"


def test_a_bad_layer_or_head_shown_refuses_before_the_settings_change(client):
    """/ablate and /clear_changes check the layer and head shown first: a refusal keeps the settings."""
    client.predict(["L1H1"], "mean", False, 1, 0, api_name="/ablate")
    for call, pattern in [(lambda: client.predict(["L1H1", "L2H2"], "mean", False, 3, 0, api_name="/ablate"), "layer"),
                          (lambda: client.predict(["L0H0"], "zero", False, 0, 99, api_name="/ablate"), "head"),
                          (lambda: client.predict(0, 99, api_name="/clear_changes"), "head"),
                          (lambda: client.predict(7, 0, api_name="/clear_changes"), "layer")]:
        with pytest.raises(AppError) as info:
            call()
        assert_clean_error(info.value, pattern)
    with pytest.raises(AppError) as info:
        client.predict("L0H0", "²", api_name="/edit_attention")
    assert_clean_error(info.value, "key position must be a whole number")
    _, data = client.predict(*GREEDY, 1, api_name="/regenerate")  # reads the settings without setting them
    assert data["what"] == "L1H1 mean-ablated"  # still the first setting: nothing above changed it


def test_edit_attention_and_its_refusals(client):
    client.predict(11, api_name="/logit_lens")  # selects "he" as the query
    _, summary, data = client.predict("L1H0", "0", api_name="/edit_attention")
    assert "row of “he” (11) in L1H0 attends to only “anna” (0)" in data["what"]
    s = local()
    s.select(11)
    s.heads.set_edit(1, 0, 11, 0)
    assert_same_effect(data, s.heads.effect())
    for args, pattern in [(("L1H0", "12"), "comes after the query"), (("all", "0"), "L<layer>H<head>"),
                          (("L9H0", "0"), "layers 0–2"), (("L1H0", "somewhere"), "key position"),
                          ((None, "0"), "Choose the head")]:
        with pytest.raises(AppError) as info:
            client.predict(*args, api_name="/edit_attention")
        assert_clean_error(info.value, pattern)
    _, _, data = client.predict("L1H0", "uniform", api_name="/edit_attention")
    assert "every allowed key equally" in data["what"]
    _, _, data = client.predict("L1H0", "off", api_name="/edit_attention")
    assert data == {"active": False}


def test_regenerate_side_by_side(client):
    client.predict(["L1H1", "L2H3"], "zero", False, 1, 0, api_name="/ablate")
    page, data = client.predict(*GREEDY, 10, api_name="/regenerate")
    s = local()
    s.heads.set_ablation(["L1H1", "L2H3"], "zero", False)
    r = s.heads.regenerate(Sampling(temperature=0.0), 10)
    assert data["normal"] == r.normal and data["changed"] == r.changed
    assert data["first_difference"] == r.first_difference
    assert "lab-first" in page if r.first_difference is not None else "the same" in page
    with pytest.raises(AppError) as info:
        client.predict(*GREEDY, 1000, api_name="/regenerate")
    assert_clean_error(info.value, "tokens to regenerate")


def test_compare(client):
    diff, changes, dist, notes, data = client.predict(GRAMMAR, "anna found the key . she", "tom found the old key . he",
                                                      2, api_name="/compare")
    assert data["common"] == 6 and "6 and 7 tokens" in notes
    assert data["tokens_b"][-1] == "he"
    c = Session().heads.compare(GRAMMAR, "anna found the key . she", "tom found the old key . he")
    assert data["kl_bits"] == pytest.approx(c.kl_bits(), rel=2e-2, abs=1e-6)
    np.testing.assert_allclose(np.array(data["data"], dtype=float), np.array(c.rows(), dtype=float), atol=2e-4)
    for args, pattern in [((GRAMMAR, "anna", "", 0), "empty"), ((GRAMMAR, "anna", "zebra", 0), "does not know"),
                          ((GRAMMAR, "anna", "tom", 7), "layer"), (("no such model", "anna", "tom", 0), "Unknown model")]:
        with pytest.raises(AppError) as info:
            client.predict(*args, api_name="/compare")
        assert_clean_error(info.value, pattern)


def test_tools_before_any_text_say_step_first(app_server):
    c = Client(app_server.url, verbose=False)
    for call in (lambda: c.predict(api_name="/head_roles"), lambda: c.predict(None, api_name="/logit_lens"),
                 lambda: c.predict(["L0H0"], "zero", False, 0, 0, api_name="/ablate"),
                 lambda: c.predict("L0H0", "0", api_name="/edit_attention"),
                 lambda: c.predict(*GREEDY, 5, api_name="/regenerate")):
        with pytest.raises(AppError) as info:
            call()
        assert_clean_error(info.value, "Step first")



def test_the_attention_drawn_under_a_change_is_the_changed_attention_and_says_so(client):
    """While heads are ablated or a row edited, the Explore figure draws the attention the model computes under
    that change (the weights that multiplied the values), names the change in its title, and goes back after
    Clear all changes."""
    from tests.support.api import QUANT, panels

    client.predict(["L0H1"], "uniform", False, 0, "all", api_name="/ablate")
    client.predict("L1H0", "0", api_name="/edit_attention")  # the last token's row in L1H0 looks only at "anna"
    s = local()
    s.heads.set_ablation(["L0H1"], "uniform", False)
    s.heads.edit_selected("L1H0", "0")
    mark = "L0H1 ablated (uniform) · L1H0 row 12 edited"
    for layer in (0, 1):  # each Step: the text grows as the model as trained continues it
        _, _, _, attn = client.predict(GRAMMAR, P, *GREEDY, layer, "all", "weights", api_name="/step")
        s.step(GRAMMAR, P, Sampling(temperature=0.0))
        spec = json.loads(attn["plot"])
        assert spec["layout"]["title"]["text"].startswith(mark + " · ") and spec["layout"]["meta"]["change"] == mark
        seen, want = panels(attn), changed_attention(s.text, s.heads.settings)[0][layer]
        assert np.nanmax(np.abs(seen - want)) <= QUANT
        T = seen.shape[-1]
        if layer == 0:  # L0H1 attends uniformly to every token up to each query
            uniform = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]
            np.testing.assert_allclose(np.nan_to_num(seen[1]), uniform, atol=QUANT)
        else:  # the edited row, and layer 1 differs from the model as trained (it reads layer 0's change)
            np.testing.assert_array_equal(seen[0, 12, :13], np.eye(13)[0])
            plain = s.attention().weights[1]
            assert np.nanmax(np.abs(seen[2:] - plain[2:])) > 0.01
    client.predict(1, 0, api_name="/clear_changes")
    _, _, _, attn = client.predict(GRAMMAR, P, *GREEDY, 1, "all", "weights", api_name="/step")
    s.step(GRAMMAR, P, Sampling(temperature=0.0))
    spec = json.loads(attn["plot"])
    assert spec["layout"]["meta"]["change"] == "" and "ablated" not in spec["layout"]["title"]["text"]
    assert np.nanmax(np.abs(panels(attn) - s.attention().weights[1])) <= QUANT
