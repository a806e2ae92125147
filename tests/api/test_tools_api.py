"""The stateless tools through the running app (gradio_client against a real server, /tool_<name>): each answers
with the numbers the page's own endpoints give for the same model, prompt and seed (tests/support/page_numbers.py
does what a person does on the page), holds no session of the caller's, and refuses in one sentence; the calls
go through the door like the page's (the rate of Generate is charged when the call joins the queue).
"""

from __future__ import annotations

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

from lab.catalogue.models import BUILTINS
from tests.support.api import assert_clean_error
from tests.support.page_numbers import CALLS, GRAMMAR, P
from tests.support.server import AppServer


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    app = AppServer(tmp=tmp_path_factory.mktemp("tools_api")).start()
    yield app
    app.stop()


@pytest.mark.parametrize("name", [n for n in CALLS if n != "models"])
def test_each_tool_gives_the_pages_numbers(server, name):
    kwargs, check = CALLS[name]
    got = Client(server.url, verbose=False).predict(**kwargs, api_name=f"/tool_{name}")
    check(Client(server.url, verbose=False), got)


def test_the_models_are_the_pages_list_and_a_tool_keeps_no_text(server):
    c = Client(server.url, verbose=False)
    assert c.predict(api_name="/tool_models") == {"models": BUILTINS.names, "default": GRAMMAR}
    first = c.predict(GRAMMAR, P, 1, 0, api_name="/tool_attention")
    c.predict(GRAMMAR, "tom met lisa at the park . he", 0, 1, api_name="/tool_attention")
    assert c.predict(GRAMMAR, P, 1, 0, api_name="/tool_attention") == first  # the same call, the same answer
    # the client's own session on the page has no text: the tools made none there
    with pytest.raises(AppError) as info:
        c.predict(api_name="/head_roles")
    assert_clean_error(info.value, "^Press Step first")


@pytest.mark.parametrize("name,args,pattern", [
    ("attention", ("no such model", P, 0, 0), r"^Unknown model 'no such model'\. Pick one from the list\.$"),
    ("attention", (GRAMMAR, P, 7, 0), r"^layer must be a whole number between 0 and 2; got 7$"),
    ("generate", (GRAMMAR, "a <b>", 3, 0.0, 0, 1.0, 0), r"^This model does not know these words: 'a', '<', 'b', '>'"),
    ("generate", (GRAMMAR, P, 3, 0.0, 0, 1.0, -1), r"^seed must be a whole number"),
    ("logit_lens", (GRAMMAR, P, [3], 5), r"token position must be a whole number"),
    ("ablate", (GRAMMAR, P, {"a": 1}, "zero", False, None, 8, 0.0, 0, 1.0, 0), r"^Heads must be a list such as"),
    ("inside_cell", (GRAMMAR, [P], 0, 0, None, None), r"^The prompt must be text\.$"),
    ("patch", (GRAMMAR, P, "tom", " she", " he", "heads", "denoising", "logit_diff"), r"same number of tokens"),
])
def test_refusals_are_one_sentence(server, name, args, pattern):
    with pytest.raises(AppError) as info:
        Client(server.url, verbose=False).predict(*args, api_name=f"/tool_{name}")
    assert_clean_error(info.value, pattern)
    assert "\n" not in str(info.value)
