"""The Circuits view's stateless tools through the running app (gradio_client against a real server,
/tool_dla, /tool_composition, /tool_head_circuits, /tool_atp): each answers with the numbers the page's own
Circuits endpoints (/dla, /composition, /circuits, /atp) give for the same model and prompt
(tests/support/circuit_numbers.py does what a person does on the page), holds no session of the caller's, is
documented with its arguments' types and an example, and refuses in one sentence. The worked call in
docs/api.md prints what the docs say it prints.
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

from tests.support.api import assert_clean_error
from tests.support.circuit_numbers import CIRCUIT_CALLS
from tests.support.page_numbers import A, B, GRAMMAR, P

CIRCUIT_TOOLS = ["dla", "composition", "head_circuits", "atp"]


@pytest.mark.parametrize("name", CIRCUIT_TOOLS)
def test_each_circuits_tool_gives_the_pages_numbers(app_server, name):
    kwargs, check = CIRCUIT_CALLS[name]
    got = Client(app_server.url, verbose=False).predict(**kwargs, api_name=f"/tool_{name}")
    check(Client(app_server.url, verbose=False), got)


def test_the_whole_composition_matrix_and_a_tool_keeps_no_text(app_server):
    c = Client(app_server.url, verbose=False)
    whole = c.predict(GRAMMAR, "q", 0, api_name="/tool_composition")
    assert whole["pairs"] == [] and whole["scores"] == c.predict(GRAMMAR, api_name="/composition")["q"]
    first = c.predict(GRAMMAR, P, 2, 0, api_name="/tool_head_circuits")
    c.predict(GRAMMAR, "tom met lisa at the park . he", None, None, None, api_name="/tool_dla")
    assert c.predict(GRAMMAR, P, 2, 0, api_name="/tool_head_circuits") == first  # the same call, the same answer
    with pytest.raises(AppError) as info:  # the client's own session on the page has no text: the tools made none
        c.predict(None, None, None, api_name="/dla")
    assert_clean_error(info.value, "^Press Step first")


def test_the_tools_are_documented_after_the_others(app_server):
    api = Client(app_server.url, verbose=False).view_api(return_format="dict", print_info=False)
    names = list(api["named_endpoints"])
    assert names.index("/tool_patch") < names.index("/tool_dla")
    assert [n for n in names if n.startswith("/tool_")][-4:] == [f"/tool_{t}" for t in CIRCUIT_TOOLS]
    atp = api["named_endpoints"]["/tool_atp"]["parameters"]
    assert [p["parameter_name"] for p in atp] == ["model", "prompt_a", "prompt_b", "answer", "other", "kind",
                                                  "direction", "k", "metric"]
    assert [p["parameter_has_default"] for p in atp] == [False] * 4 + [True] * 5
    dla = {p["parameter_name"]: p for p in api["named_endpoints"]["/tool_dla"]["parameters"]}
    assert dla["answer"]["example_input"] == " tom" and dla["position"]["parameter_default"] is None


# `one`: the refusal is a single sentence; the lab's refusals of an unknown model and of prompts of different
# lengths (the page's /composition and /patch say the same) add a second, the hint of what to do instead
@pytest.mark.parametrize("name,args,pattern,one", [
    ("dla", (GRAMMAR, P, 12, None, None), r"^token position must be a whole number between 0 and 11; got 12$", True),
    ("dla", (GRAMMAR, P, None, " tom", " tom"), r"^The two answer tokens are the same token", True),
    ("composition", (GRAMMAR, "x", 10), r"^kind must be one of q, k, v; got 'x'$", True),
    ("composition", ("no such model", "k", 10), r"^Unknown model 'no such model'\. Pick one from the list\.$", False),
    ("head_circuits", (GRAMMAR, P, 7, 0), r"^layer must be a whole number between 0 and 2; got 7$", True),
    ("head_circuits", (GRAMMAR, [P], 0, 0), r"^The prompt must be text\.$", True),
    ("atp", (GRAMMAR, A, "tom", " she", " he", "heads", "denoising", 5, "logit_diff"), r"same number of tokens",
     False),
    ("atp", (GRAMMAR, A, B, " she", " he", "heads", "denoising", 999, "logit_diff"), r"cells to re-run exactly", True),
])
def test_refusals_are_one_sentence(app_server, name, args, pattern, one):
    with pytest.raises(AppError) as info:
        Client(app_server.url, verbose=False).predict(*args, api_name=f"/tool_{name}")
    assert_clean_error(info.value, pattern)
    said = str(info.value)
    assert "\n" not in said
    if one:
        assert not re.search(r"[.!?] +[A-Z]", said), f"more than one sentence: {said}"


def test_the_worked_dla_call_in_the_docs_prints_what_they_say(app_server):
    docs = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text(encoding="utf-8")
    [code] = [b for b in re.findall(r"```python\n(.*?)```", docs, re.S) if "/tool_dla" in b]
    code = code.replace('"http://127.0.0.1:7860/"', repr(app_server.url))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "docs/api.md", "exec"), {"__name__": "docs"})
    last = printed.getvalue().strip().splitlines()[-1]  # after gradio_client's own "Loaded as API" line
    assert f"It prints `{last}`" in docs
