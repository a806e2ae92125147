"""Session files through the running app's API (gradio_client against a real server): a session
saved while all heads of a layer are shown, or with heads kept after Reset, opens in another client;
a file without a text whose prompt could not be typed is refused, and the client's page stays as it was."""

from __future__ import annotations

import json

import pytest
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError

from tests.support.api import assert_clean_error
from tests.support.share_api import value

SORT = "sort digits (built-in)"
FORM = (SORT, "503124=", 1.0, 0, 1.0, 3)


def test_all_heads_and_heads_kept_after_reset_open_in_another_client(app_server):
    c = Client(app_server.url, verbose=False)
    shown = c.predict(*FORM, 1, "all", "weights", api_name="/step")
    path, _ = c.predict(*FORM, 1, "all", "weights", api_name="/export_session")
    other = Client(app_server.url, verbose=False)
    out = [value(x) for x in other.predict(handle_file(path), api_name="/import_session")]
    assert (out[0], out[8], out[9]) == (SORT, 1, "all") and out[4] == shown[0]
    assert out[7]["plot"] == shown[3]["plot"]  # the same grid of heads
    # heads chosen after Reset: kept for the next text, and in the file
    c.predict(SORT, api_name="/reset")
    c.predict(["L1H2"], "mean", False, 1, "all", api_name="/ablate")
    path, _ = c.predict(*FORM, 1, "all", "weights", api_name="/export_session")
    assert json.loads(open(path, encoding="utf-8").read())["probe"]["heads"] == ["L1H2"]
    other.predict(handle_file(path), api_name="/import_session")
    other.predict(*FORM, 1, "all", "weights", api_name="/step")
    _, _, _, data = other.predict(["L1H2"], "mean", False, 1, "all", api_name="/ablate")
    assert data["what"] == "L1H2 mean-ablated"


def test_a_refused_file_without_a_text_leaves_the_page_as_it_was(app_server, tmp_path):
    c = Client(app_server.url, verbose=False)
    before = c.predict(*FORM, 0, 2, "weights", api_name="/step")
    path, _ = Client(app_server.url, verbose=False).predict(*FORM, 0, 2, "weights", api_name="/export_session")
    doc = json.loads(open(path, encoding="utf-8").read())
    assert doc["actions"] == []
    for prompt, pattern in [("1" * 2001, "2,001 characters"), ("503124=zebra", "does not know")]:
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps({**doc, "prompt": prompt}))
        with pytest.raises(AppError) as info:
            c.predict(handle_file(str(bad)), api_name="/import_session")
        assert_clean_error(info.value, pattern)
        assert prompt[:40] not in str(info.value)
    after = c.predict(*FORM, 0, 2, "weights", api_name="/step")  # the text goes on where it was
    assert after[0][: len(before[0])] == before[0] and len(after[0]) == len(before[0]) + 1
