"""The API's contract holds: what `view_api()` documents is accepted, anything else is refused by name.

Every named endpoint is called with the example values `view_api()` itself gives; then every
argument of /step and /generate in turn gets values of the wrong kind, and the refusal must name
that argument, carry no internal detail, and leave the session exactly as it was.
"""

from __future__ import annotations

import json
import re

import httpx
import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

GRAMMAR = "grammar (built-in)"
SORT = "sort digits (built-in)"
P = "anna found the key . she gave it to tom because he"
GREEDY = dict(model_name=GRAMMAR, prompt=P, temperature=0.0, top_k=0, top_p=1.0, seed=0, layer=0, head="all",
              view="weights")
LEAKS = re.compile(r"Traceback|File \"|/tmp|/work|/etc|site-packages|<class|type:|Error\b|Exception|"
                   r"Something went wrong|upstream Gradio")
# what a refusal calls each argument
NAMES = {"model_name": "model", "prompt": "prompt", "temperature": "temperature", "top_k": "top-k",
         "top_p": "top-p", "seed": "seed", "layer": "layer", "head": "head", "view": "view",
         "max_new": "max new tokens"}
NEEDS_TEXT = {"/head_roles", "/logit_lens", "/ablate", "/edit_attention", "/regenerate", "/clear_changes",
              "/export_numbers", "/export_page", "/inside", "/dla", "/circuits"}
JUNK = [None, [1], {"a": 1}, {"path": "/etc/passwd", "meta": {"_type": "gradio.FileData"}}, 10**400, -1, "zzz"]
# The named endpoints in the order the API page lists them, each with the number (fn_index) gradio gives it.
# Both follow the order in which the page binds its events; a client that calls by number relies on them,
# so moving an event in the code must not move these. /positional is bound after the page's events (app.py);
# endpoints added since come after it.
ENDPOINTS = [("step", 4), ("generate", 5), ("undo", 7), ("reset", 9), ("select_model", 19), ("export_session", 29),
             ("import_session", 30), ("link", 31), ("export_page", 33), ("export_numbers", 34), ("ablate", 52),
             ("edit_attention", 53), ("clear_changes", 59), ("regenerate", 62), ("head_roles", 63),
             ("logit_lens", 64), ("compare", 65), ("train", 74), ("stop", 75), ("upload_model", 76), ("film", 78),
             ("export_film_page", 90), ("positional", 93),
             ("inside", 94), ("patch", 95), ("tool_models", 96), ("tool_generate", 97), ("tool_attention", 98),
             ("tool_head_roles", 99), ("tool_logit_lens", 100), ("tool_ablate", 101), ("tool_inside_cell", 102),
             ("tool_patch", 103), ("dla", 104), ("composition", 105), ("circuits", 106), ("atp", 107),
             ("tool_dla", 108), ("tool_composition", 109), ("tool_head_circuits", 110), ("tool_atp", 111)]


@pytest.fixture(scope="module")
def api(app_server):
    return Client(app_server.url, verbose=False).view_api(return_format="dict", print_info=False)


def call(client: Client, api_name: str, **kwargs):
    return client.predict(*kwargs.values(), api_name=api_name)


def refusal(client: Client, api_name: str, args: list) -> str:
    """The refusal's message: an AppError's, or the body of a 4xx the app's HTTP guard answered."""
    with pytest.raises((AppError, httpx.HTTPStatusError)) as info:
        client.predict(*args, api_name=api_name)
    if isinstance(info.value, httpx.HTTPStatusError):
        assert 400 <= info.value.response.status_code < 500
        msg = info.value.response.json()["error"]
    else:
        msg = str(info.value)
    assert not LEAKS.search(msg), f"{api_name}{args!r}: {msg!r}"
    return msg


def test_the_endpoints_keep_their_order_and_numbers(app_server, api):
    deps = httpx.get(app_server.url + "config", timeout=30).json()["dependencies"]
    assert [(d["api_name"], d["id"]) for d in deps if d["api_visibility"] == "public"] == ENDPOINTS
    assert all(deps[i]["api_name"] == name for name, i in ENDPOINTS)  # each one's number is its place in the page
    assert list(api["named_endpoints"]) == [f"/{name}" for name, _ in ENDPOINTS]


def test_every_endpoint_takes_the_examples_view_api_documents(app_server, api):
    c = Client(app_server.url, verbose=False)
    for name, endpoint in api["named_endpoints"].items():
        args = [p["example_input"] for p in endpoint["parameters"]]
        if name == "/upload_model":  # its example is "no file": refused in words, nothing else
            assert "Choose a .safetensors file" in refusal(c, name, args)
            continue
        if name == "/import_session":
            assert "Choose a session file" in refusal(c, name, args)
            continue
        if name in NEEDS_TEXT:  # the head tools work on a text (and regenerate on a change to it)
            call(c, "/step", **GREEDY)
            if name == "/regenerate":
                c.predict(["L1H1"], "zero", False, 0, 0, api_name="/ablate")
        c.predict(*args, api_name=name)


def test_layer_and_head_are_accepted_as_documented_strings(app_server, api):
    step = api["named_endpoints"]["/step"]["parameters"]
    layer_type = next(p for p in step if p["parameter_name"] == "layer")["python_type"]["type"]
    assert "'2'" in layer_type
    c = Client(app_server.url, verbose=False)
    as_text = call(c, "/step", **{**GREEDY, "layer": "2", "head": "3"})
    as_int = call(Client(app_server.url, verbose=False), "/step", **{**GREEDY, "layer": 2, "head": 3})
    assert as_text[0] == as_int[0] and as_text[3]["plot"] == as_int[3]["plot"]


def test_view_settings_are_checked_against_the_model_asked_for_not_the_last_selected(app_server):
    c = Client(app_server.url, verbose=False)
    c.predict(SORT, api_name="/select_model")  # 2 layers: layer 2 is not one of them…
    refused = refusal(c, "/step", list({**GREEDY, "model_name": SORT, "layer": 2}.values()))
    assert refused == "layer must be a whole number between 0 and 1; got 2", refused
    tokens, status, probs, attention = call(c, "/step", **{**GREEDY, "layer": 2})  # …of the grammar model's 3 it is
    assert [(t["token"], t["class_or_confidence"]) for t in tokens[:-1]] == [(w, "prompt") for w in P.split()]
    assert tokens[-1]["class_or_confidence"] == "generated"
    said = f"{len(tokens)} tokens in view (1 generated). Model: {GRAMMAR}: 3 layers × 4 heads"
    assert status.startswith(said), status
    figure = json.loads(attention["plot"])
    assert figure["layout"]["title"]["text"] == "Layer 2 attention weights"  # the view asked for, of its 4 heads
    assert [a["text"].split("<br>")[0] for a in figure["layout"]["annotations"]] == [f"head {h}" for h in range(4)]
    # everything as a session that never selected the sort model gets it
    control = call(Client(app_server.url, verbose=False), "/step", **{**GREEDY, "layer": 2})
    assert [tokens, status, probs["plot"], attention["plot"]] == [control[0], control[1], control[2]["plot"],
                                                                  control[3]["plot"]]


@pytest.mark.parametrize("argument", list(GREEDY))
def test_a_wrong_value_is_refused_by_name_and_changes_nothing(app_server, argument):
    c = Client(app_server.url, verbose=False)
    control = Client(app_server.url, verbose=False)
    first = call(c, "/step", **GREEDY)
    call(control, "/step", **GREEDY)
    for junk in JUNK:
        step_args = {**GREEDY, argument: junk}
        msg = refusal(c, "/step", list(step_args.values()))
        assert NAMES[argument] in msg.lower(), msg
        generate_args = dict(list(step_args.items())[:6] + [("max_new", 3)] + list(step_args.items())[6:])
        msg = refusal(c, "/generate", list(generate_args.values()))
        assert NAMES[argument] in msg.lower(), msg
    # the refused calls left the text as it was: the next greedy Step matches an untouched session
    mine, theirs = call(c, "/step", **GREEDY), call(control, "/step", **GREEDY)
    assert mine[0] == theirs[0] and len(mine[0]) == len(first[0]) + 1
    assert mine[3]["plot"] == theirs[3]["plot"]


def test_refused_undo_and_reset_change_nothing(app_server):
    c = Client(app_server.url, verbose=False)
    control = Client(app_server.url, verbose=False)
    for client in (c, control):
        call(client, "/step", **GREEDY)
        call(client, "/step", **GREEDY)
    refusal(c, "/undo", [[1], "all", "weights"])
    refusal(c, "/undo", [0, "all", {"a": 1}])
    refusal(c, "/reset", [[]])
    refusal(c, "/select_model", [{"a": 1}])
    mine, theirs = call(c, "/step", **GREEDY), call(control, "/step", **GREEDY)
    assert mine[0] == theirs[0] and len(mine[0]) == 12 + 3
