"""Session files and links reopen the Circuits tab, through the running app (a real server): the file saved
after the person used the tab carries it, and opening it in another client draws the same figures in the event
chained after /import_session (whose outputs stay Explore's); a hostile one is refused in a sentence and draws
nothing; the app's link carries the tab, and a page loaded from it gets the tab drawn in the event chained after
the load. The chained and page-only events are called by number, as the page calls them
(tests/support/page_calls.py)."""

from __future__ import annotations

import json
from urllib.parse import parse_qsl, urlsplit

import pytest
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError

from lab.session import Session
from tests.support.api import assert_clean_error
from tests.support.page_calls import Call, answers, config
from tests.support.shares_server import Listener, function, join
from tests.support.share_api import value
from ui.circuits_reopen import NOT_CACHED

G = "grammar (built-in)"
P = "anna found the key . she gave it to tom because he"
FORM = (G, P, 0.0, 0, 1.0, 0, 1, 0, "weights")
PAGE = ["linear", False, "1280x720", 0, "all", "weights"]  # what the page sends on load (after the session)
HERE = "127.0.0.1"


def component(cfg: dict, elem_id: str | None = None, tab: str | None = None) -> int:
    """A component's number: by its elem_id, or a tab by its id."""
    return next(c["id"] for c in cfg["components"]
                if (tab is None and c["props"].get("elem_id") == elem_id)
                or (tab is not None and c["type"] == "tabitem" and c["props"].get("id") == tab))


def on(cfg: dict, target: int, event: str) -> dict:
    """The page's function that `event` of component `target` runs (the first bound)."""
    return next(d for d in cfg["dependencies"] if d["backend_fn"] and [target, event] in map(list, d["targets"]))


def chained(cfg: dict, after: int) -> dict:
    return next(d for d in cfg["dependencies"] if d["backend_fn"] and d["trigger_after"] == after)


def shown(v):
    """A component's value as an answer sets it: its value, the tab an update selects, or None (left as it was)."""
    if isinstance(v, dict) and v.get("__type__") == "update":
        return v["value"] if "value" in v else v.get("selected")
    return v


def named(cfg: dict, fn: dict, output: list) -> dict:
    """A function's outputs by their components' elem_id, each as `shown`."""
    ids = {c["id"]: c["props"].get("elem_id") for c in cfg["components"]}
    return {ids[i]: shown(v) for i, v in zip(fn["outputs"], output)}


def call(url: str, session_hash: str, *calls: Call) -> list:
    got = answers(url, list(calls), session_hash)
    assert all(a.kind == "ok" for a in got), [(a.kind, a.message) for a in got]
    return [a.output for a in got]


def used_tab(app_server, cfg: dict) -> tuple[Client, dict]:
    """A client whose Circuits tab was used as a person uses it: opened, DLA and one head drawn, then back to
    Explore (where Save session and Link to this view are). Returns its page's figures."""
    url = app_server.url
    a = Client(url, verbose=False)
    a.predict(*FORM, api_name="/step")
    a.predict(*FORM, api_name="/step")
    dla = on(cfg, component(cfg, "circuits_dla_run"), "click")
    head = on(cfg, component(cfg, "circuits_head_run"), "click")
    shown = call(url, a.session_hash, Call(on(cfg, component(cfg, tab="circuits"), "select"), [None, None]),
                 Call(dla, [None, " tom", " anna"]), Call(head, [None, 1, 2]))
    return a, named(cfg, dla, shown[1]) | named(cfg, head, shown[2])


def test_a_saved_session_reopens_the_circuits_tab_in_another_client(app_server):
    url, cfg = app_server.url, config(app_server.url)
    a, page = used_tab(app_server, cfg)
    path, _ = a.predict(*FORM, api_name="/export_session")
    doc = json.loads(open(path, encoding="utf-8").read())
    assert doc["circuits"] == {"tab": "circuits", "dla": {"answer": "tom", "other": "anna"}, "kind": None,
                               "head": {"layer": 1, "head": 2}, "atp": None}
    b = Client(url, verbose=False)
    out = b.predict(handle_file(path), api_name="/import_session")
    assert len(out) == 18 and value(out[0]) == G  # /import_session answers Explore's state, as before
    importing = next(d for d in cfg["dependencies"] if d["api_name"] == "import_session")
    reopen = chained(cfg, importing["id"])
    got, again = (named(cfg, reopen, out) for out in call(url, b.session_hash, Call(reopen, [None]),
                                                          Call(reopen, [None])))
    assert got["tabs"] == "circuits"
    assert set(again.values()) == {None}  # taken once: a second answer changes nothing
    assert (got["circuits_dla_answer"], got["circuits_dla_other"]) == ("tom", "anna")
    assert (got["circuits_layer"], got["circuits_head"]) == (1, 2)
    for figure in ("circuits_dla", "circuits_ov", "circuits_spectrum", "circuits_qk"):
        assert got[figure]["plot"] == page[figure]["plot"], figure  # the same numbers, drawn the same
    assert got["circuits_dla_note"] == page["circuits_dla_note"] and "L1H2" in got["circuits_head_note"]
    assert got["circuits_composition"] is None and got["circuits_prompt_a"] is None  # what the file left out
    # B's own link now carries it too
    link = b.predict(*FORM, api_name="/link")
    assert "tab=circuits&amp;answer=tom&amp;other=anna&amp;circuit_layer=1&amp;circuit_head=2" in link


def test_a_hostile_file_is_refused_and_the_tab_is_left_as_it_was(app_server, tmp_path):
    url, cfg = app_server.url, config(app_server.url)
    a, _ = used_tab(app_server, cfg)
    path, _ = a.predict(*FORM, api_name="/export_session")
    doc = json.loads(open(path, encoding="utf-8").read())
    doc["circuits"]["head"] = {"layer": 1, "head": "<b>2</b>"}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(AppError) as info:
        a.predict(handle_file(str(bad)), api_name="/import_session")
    assert_clean_error(info.value, "circuits settings do not fit")
    importing = next(d for d in cfg["dependencies"] if d["api_name"] == "import_session")
    reopen = chained(cfg, importing["id"])
    assert reopen["trigger_only_on_success"]  # the page does not call it after a refusal; called, it draws nothing
    assert set(named(cfg, reopen, call(url, a.session_hash, Call(reopen, [None]))[0]).values()) == {None}
    assert a.predict(1, 2, api_name="/circuits")["head_label"] == "L1H2"  # the session goes on as it was


def test_the_app_s_link_reopens_the_circuits_tab_on_load(app_server):
    url, cfg = app_server.url, config(app_server.url)
    a, _ = used_tab(app_server, cfg)
    a.predict(G, api_name="/composition")  # the scores now cached: a link's kind draws the map
    page = a.predict(*FORM, api_name="/link")
    assert "and what the Circuits tab shows" in page
    href = page.split('href="', 1)[1].split('"', 1)[0].replace("&amp;", "&")
    params = dict(parse_qsl(urlsplit(href).query, keep_blank_values=True))
    assert {k: params[k] for k in ("tab", "answer", "other", "kind", "circuit_layer", "circuit_head")} == {
        "tab": "circuits", "answer": "tom", "other": "anna", "kind": "k", "circuit_layer": "1", "circuit_head": "2"}
    session_hash = "circuits-link-load"
    load = function(app_server, event="load")
    assert join(app_server, load, [None, *PAGE], session_hash, HERE, href).status_code == 200
    listener = Listener(app_server, session_hash, HERE)  # open while the page's next calls are made, as a page's is
    try:
        done = listener.wait("process_completed")
        assert done["success"], str(done)[:300]
        assert "Opened from a link." in json.dumps(done["output"]["data"][-1])
        # after the load the page presses the reopening's hidden button, for an address with a Circuits parameter
        # only (a page event in the browser, no server call: tests/browser/test_browser_circuits_link.py)
        after_load = next(d for d in cfg["dependencies"] if d["trigger_after"] == load)
        assert not after_load["backend_fn"] and "#circuits_reopen" in after_load["js"] and "answer" in after_load["js"]
        reopen = on(cfg, component(cfg, "circuits_reopen"), "click")
        got = named(cfg, reopen, call(url, session_hash, Call(reopen, [None]))[0])
        # the DLA drawn is at the link's last token, after its Steps: the same numbers as the first client's
        b = Client(url, verbose=False)
        b.session_hash = session_hash
        assert b.predict(" tom", " anna", None, api_name="/dla")["heads"] == a.predict(" tom", " anna", None,
                                                                                      api_name="/dla")["heads"]
    finally:
        listener.close()
    assert got["tabs"] == "circuits"
    assert (got["circuits_dla_answer"], got["circuits_dla_other"], got["circuits_kind"]) == ("tom", "anna", "k")
    assert "logit(tom) − logit(anna)" in got["circuits_dla_note"]
    assert "read from the server's cache" in got["circuits_composition_note"]
    assert json.loads(got["circuits_composition"]["plot"])["data"] and "L1H2" in got["circuits_head_note"]


def test_a_link_never_starts_the_composition_job(monkeypatch):
    """Where the scores are not cached, the section says to press Compute and nothing is computed."""
    from lab.circuits_records import CompositionCache
    from lab.links import CircuitsView
    from ui import circuits_reopen

    monkeypatch.setattr(circuits_reopen, "COMPOSITION", CompositionCache())
    s = Session()
    circuits_reopen.reopened(s, G, CircuitsView(kind="q"))
    out = dict(zip(("tabs", *circuits_reopen.FIELDS), circuits_reopen.reopen_circuits(s)))
    assert out["composition_note"] == NOT_CACHED and out["kind"] == "q"
    assert "composition" not in s.circuits.last and not s.circuits.running
    assert circuits_reopen.reopen_circuits(s)[6] == {"__type__": "update"}  # taken: the next answer changes nothing


def test_what_a_link_left_out_is_said_on_the_circuits_tab_too():
    """The notice above Explore's figures is out of sight when the link opens Circuits: the DLA note says it."""
    from lab import links
    from ui import circuits_reopen

    s = Session()
    link = links.read_link(s, {"model": G, "prompt": P, "steps": "1", "tab": "circuits", "answer": "zebra crossing"})
    links.open_link(s, link)
    circuits_reopen.reopened(s, G, link.circuits, link.notes)
    out = dict(zip(("tabs", *circuits_reopen.FIELDS), circuits_reopen.reopen_circuits(s)))
    assert out["dla_note"].startswith("⚠ Ignored the link's answer='zebra crossing' (not one token")
    assert "logit(" in out["dla_note"] and out["dla_answer"] == ""  # drawn for the model's own prediction
