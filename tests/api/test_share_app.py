"""Save & share through the running app's API (gradio_client against a real server):
/export_session and /import_session reproduce a session in another client value for value,
hostile session files are refused with nothing changed, /link writes a working link, and
/export_numbers gives CSV and JSON whose values are the model's."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
import torch
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError

from lab.catalogue.models import BUILTINS
from tests.support.api import assert_clean_error
from tests.support.share_api import value

G = "grammar (built-in)"
P = "anna found the key . she gave it to tom because he"
FORM = (G, P, 1.0, 0, 1.0, 3, 1, 0, "weights")


@pytest.fixture
def made(app_server):
    """A client whose text was made by Steps, a Generate and an Undo."""
    c = Client(app_server.url, verbose=False)
    c.predict(*FORM, api_name="/step")
    c.predict(G, P, 1.2, 0, 0.9, 3, 5, 1, 0, "weights", api_name="/generate")
    c.predict(1, 0, "weights", api_name="/undo")
    last = c.predict(*FORM, api_name="/step")
    return c, last


def test_a_saved_session_opens_in_another_client_value_for_value(app_server, made):
    c, last = made
    path, msg = c.predict(*FORM, api_name="/export_session")
    assert path.endswith(".json") and "KB" in msg
    doc = json.loads(open(path, encoding="utf-8").read())
    assert [a["do"] for a in doc["actions"]] == ["step", "generate", "undo", "step"]
    other = Client(app_server.url, verbose=False)
    out = other.predict(handle_file(path), api_name="/import_session")
    model, prompt, _, _, tokens, status, probs, attention, layer, head, view = [value(x) for x in out[:11]]
    assert model == G and prompt == P and (layer, head, view) == (1, 0, "weights")
    assert tokens == last[0]  # the same tokens
    assert attention["plot"] == last[3]["plot"] and probs["plot"] == last[2]["plot"]  # the same figure data
    # and both texts go on alike
    a, b = c.predict(*FORM, api_name="/step"), other.predict(*FORM, api_name="/step")
    assert a[0] == b[0] and a[3]["plot"] == b[3]["plot"]


def test_a_hostile_session_file_is_refused_and_changes_nothing(app_server, made, tmp_path):
    c, last = made
    for content, pattern in [(b"<html>", "not JSON"), (b'{"format": "decoder-lab-session", "version": 1}', "model"),
                             (json.dumps({"format": "decoder-lab-session", "version": 1, "model": {"builtin": G,
                                          "sha256": "f" * 64}, "prompt": P, "seed": 0, "actions": []}).encode(),
                              "another version")]:
        bad = tmp_path / "bad.json"
        bad.write_bytes(content)
        with pytest.raises(AppError) as info:
            c.predict(handle_file(str(bad)), api_name="/import_session")
        assert_clean_error(info.value, pattern)
    after = c.predict(*FORM, api_name="/step")
    assert after[0][: len(last[0])] == last[0] and len(after[0]) == len(last[0]) + 1


def test_the_link_names_the_view(made):
    c, _ = made
    page = c.predict(*FORM, api_name="/link")
    assert 'href="?model=grammar+%28built-in%29&amp;prompt=anna+found' in page
    assert "steps=6" in page and "layer=1&amp;head=0" in page
    assert "Save session" in page  # made with Generate and Undo: the link says it may differ


def _model_attention(tokens: list[dict]):
    entry = BUILTINS.get(G)
    ids = entry.tokenizer.encode(" ".join(t["token"] for t in tokens))
    with torch.inference_mode():
        out = entry.model(torch.tensor([ids]), return_attention=True)
    return entry, ids, out


def test_numbers_as_csv_and_json_are_the_models(made):
    c, last = made
    entry, ids, out = _model_attention(last[0])
    path = c.predict("weights", "csv", G, 1, 0, api_name="/export_numbers")
    rows = list(csv.DictReader(io.StringIO(open(path, encoding="utf-8-sig").read())))
    want = out.attentions[1][0, 0].numpy()
    for r in rows:
        q, k = int(r["query_position"]), int(r["key_position"])
        if k > q:
            assert r["value"] == ""
        else:
            assert float(r["value"]) == pytest.approx(float(want[q, k]), abs=1e-6)
    assert len(rows) == len(ids) ** 2
    path = c.predict("probabilities", "json", G, 1, 0, api_name="/export_numbers")
    doc = json.loads(open(path, encoding="utf-8").read())
    assert doc["what"] == "probabilities"
    probs = torch.softmax(entry.model(torch.tensor([ids[:-1]])).logits[0, -1].double(), -1).detach().numpy()
    cols = doc["columns"]
    got = {row[cols.index("token_id")]: row[cols.index("probability")] for row in doc["rows"]}
    assert len(got) == entry.tokenizer.vocab_size
    for tid, p in got.items():
        assert p == pytest.approx(float(probs[tid]), abs=1e-6)
    path = c.predict("loss_history", "csv", G, 1, 0, api_name="/export_numbers")
    assert open(path, encoding="utf-8-sig").readline().strip().startswith("step,train_loss,val_loss")
    for args, pattern in [(("everything", "csv", G, 1, 0), "Choose what"), (("weights", "xlsx", G, 1, 0), "csv or json"),
                          (("weights", "csv", G, 9, 0), "layer")]:
        with pytest.raises(AppError) as info:
            c.predict(*args, api_name="/export_numbers")
        assert_clean_error(info.value, pattern)
    assert np.isfinite(want).all()
