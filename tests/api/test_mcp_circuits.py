"""The Circuits view's tools over MCP (`python app.py --mcp`, the real MCP client as tests/api/test_mcp.py uses
it, each client in a thread of its own): they are listed after the others with descriptions that say what they
return and in what units, and input schemas from their type hints; each call's answer holds the page's numbers
for the same arguments (tests/support/circuit_numbers.py asks the page's own endpoints); a refusal arrives as an
MCP error whose text is the sentence, with or without progress asked for.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from gradio_client import Client

from tests.api.test_mcp import call, connected, in_own_thread
from tests.support.circuit_numbers import CIRCUIT_CALLS
from tests.support.page_numbers import A, B, GRAMMAR, P
from tests.support.server import AppServer

CIRCUIT_TOOLS = ["dla", "composition", "head_circuits", "atp"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    app = AppServer(tmp=tmp_path_factory.mktemp("mcp_circuits"), args=["--mcp"]).start()
    yield app
    app.stop()


def test_the_circuits_tools_are_listed_with_descriptions_and_schemas(server):
    async def go():
        async with connected(server) as session:
            return (await session.list_tools()).tools
    listed = in_own_thread(lambda: asyncio.run(go()))
    names = [t.name for t in listed]
    assert names[-4:] == CIRCUIT_TOOLS and names.index("patch") < names.index("dla")  # after the others
    tools = {t.name: t for t in listed}
    for name in CIRCUIT_TOOLS:
        assert "Returns:" in tools[name].description, name
    assert "logits" in tools["dla"].description and "logits" in tools["head_circuits"].description
    assert "-1 to 1" in tools["composition"].description
    dla = tools["dla"].inputSchema
    assert dla["required"] == ["model", "prompt"]
    assert dla["properties"]["position"]["oneOf"] == [{"type": "null"}, {"type": "integer"}]
    assert dla["properties"]["other"]["oneOf"] == [{"type": "null"}, {"type": "string"}]
    composition = tools["composition"].inputSchema
    assert composition["required"] == ["model"]
    assert composition["properties"]["kind"]["default"] == "k" and composition["properties"]["top"]["type"] == "integer"
    heads = tools["head_circuits"].inputSchema
    assert heads["required"] == ["model", "prompt", "layer", "head"]
    assert heads["properties"]["layer"] == {"type": "integer", "description": "the layer, from 0."}
    atp = tools["atp"].inputSchema
    assert atp["required"] == ["model", "prompt_a", "prompt_b", "answer"]
    assert atp["properties"]["k"]["default"] == 5 and atp["properties"]["direction"]["default"] == "denoising"


@pytest.mark.parametrize("name", CIRCUIT_TOOLS)
def test_each_circuits_tool_answers_with_the_pages_numbers(server, name):
    arguments, check = CIRCUIT_CALLS[name]
    error, text = call(server, name, arguments)
    assert not error, text
    check(Client(server.url, verbose=False), json.loads(text))


@pytest.mark.parametrize("name,arguments,sentence", [
    ("dla", {"model": GRAMMAR, "prompt": P, "position": 40},
     "token position must be a whole number between 0 and 11; got 40"),
    ("composition", {"model": GRAMMAR, "kind": "z"}, "kind must be one of q, k, v; got 'z'"),
    ("head_circuits", {"model": GRAMMAR, "prompt": P, "layer": 0, "head": 9},
     "head must be a whole number between 0 and 3; got 9"),
    ("atp", {"model": GRAMMAR, "prompt_a": A, "prompt_b": B, "answer": " she", "other": " she"},
     "The two answer tokens are the same token: a logit difference needs two different ones."),
])
@pytest.mark.parametrize("progress", [False, True])
def test_a_refusal_is_an_mcp_error_with_the_sentence(server, name, arguments, sentence, progress):
    assert call(server, name, arguments, progress=progress) == (True, sentence)
