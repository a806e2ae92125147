"""The app as an MCP server (`python app.py --mcp`), through the real MCP client (the `mcp` SDK, streamable HTTP
at /gradio_api/mcp/): it lists the stateless tools only (names, descriptions, input schemas), each tool's
answer holds the page's numbers for the same arguments (tests/support/page_numbers.py asks the page's own
endpoints), a refusal arrives as an MCP error whose text is the sentence, and a flood from one client is held by
that address's shares, the MCP request's address, not the server's own: its rate of Generate (counted, not timed:
the server's buckets do not refill while the test runs) and its share of the queue. The worked call in
docs/api.md prints what the docs say it prints.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
import threading
from pathlib import Path

import httpx
import mcp
import pytest
from gradio_client import Client
from mcp.client.streamable_http import streamable_http_client

from lab.catalogue.models import BUILTINS
from tests.support.page_numbers import CALLS, GRAMMAR, P
from tests.support.server import AppServer

TOOLS = ["models", "generate", "attention", "head_roles", "logit_lens", "ablate", "inside_cell", "patch"]
CIRCUIT_TOOLS = ["dla", "composition", "head_circuits", "atp"]  # their calls: tests/api/test_mcp_circuits.py
SLOW_DOWN = "Slow down: Generate was pressed too often from your address in a short time. Try again in "


def in_own_thread(work):
    """work() in a thread of its own, its result returned and its exception raised here: asyncio.run needs a
    thread with no event loop running, and a browser test's Playwright (sync API) leaves one running in the
    thread of whichever test file ran before this one in the same worker."""
    out: dict = {}

    def run():
        try:
            out["value"] = work()
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """--mcp, with the real rates and shares, in buckets that (almost) never refill."""
    env = {"DECODER_LAB_RATE_SCALE": "1", "DECODER_LAB_RATE_WINDOW_SCALE": "1000"}
    app = AppServer(env, tmp_path_factory.mktemp("mcp"), args=["--mcp"]).start()
    yield app
    app.stop()


@contextlib.asynccontextmanager
async def connected(server, source: str | None = None):
    """An MCP session with the app; `source`: the loopback address the client connects from (127.0.0.0/8 is all
    this machine's), so that one test's calls count against an address of its own."""
    transport = httpx.AsyncHTTPTransport(local_address=source) if source else None
    async with httpx.AsyncClient(transport=transport, timeout=httpx.Timeout(60, read=600)) as http:
        async with streamable_http_client(server.url + "gradio_api/mcp/", http_client=http) as (read, write, _):
            async with mcp.ClientSession(read, write) as session:
                await session.initialize()
                yield session


def call(server, name: str, arguments: dict, source: str | None = None, progress: bool = False):
    """(isError, the answer's text) of one tool call; with `progress`, asking for progress notifications (gradio's
    MCP server then runs the call another way, and words its errors otherwise)."""
    async def noted(done, total, message):
        pass

    async def go():
        async with connected(server, source) as session:
            result = await session.call_tool(name, arguments, progress_callback=noted if progress else None)
            return result.isError, result.content[0].text
    return in_own_thread(lambda: asyncio.run(go()))


def test_the_stateless_tools_are_listed_with_descriptions_and_schemas(server):
    async def go():
        async with connected(server) as session:
            return (await session.list_tools()).tools
    tools = {t.name: t for t in in_own_thread(lambda: asyncio.run(go()))}
    assert list(tools) == TOOLS + CIRCUIT_TOOLS  # the page's endpoints (which act on a session) are not tools
    for tool in tools.values():
        assert tool.description and "Returns:" in tool.description, tool.name
    generate = tools["generate"].inputSchema
    assert generate["required"] == ["model", "prompt"]
    assert generate["properties"]["seed"]["type"] == "integer" and generate["properties"]["temperature"]["default"]
    assert generate["properties"]["model"]["description"] == "a model's name, as the models tool lists them."
    assert tools["attention"].inputSchema["properties"]["head"]["oneOf"] == [{"type": "null"}, {"type": "integer"}]
    assert tools["ablate"].inputSchema["properties"]["heads"] == {
        "type": "array", "items": {"type": "string"},
        "description": 'the heads to ablate, as labels such as "L1H0" (layer 1, head 0).'}
    assert "bits" in tools["ablate"].description and tools["models"].inputSchema["properties"] == {}


@pytest.mark.parametrize("name", TOOLS)
def test_each_tool_answers_with_the_pages_numbers(server, name):
    arguments, check = CALLS[name]
    error, text = call(server, name, arguments)
    assert not error, text
    got = json.loads(text)  # JSON text
    if check is None:
        assert got == {"models": BUILTINS.names, "default": GRAMMAR}
    else:
        check(Client(server.url, verbose=False), got)


@pytest.mark.parametrize("arguments,sentence", [
    ({"model": "no such model", "prompt": P, "layer": 0}, "Unknown model 'no such model'. Pick one from the list."),
    ({"model": GRAMMAR, "prompt": P, "layer": 5}, "layer must be a whole number between 0 and 2; got 5"),
    ({"model": GRAMMAR, "prompt": "a <b>", "layer": 0},  # as written: no HTML escapes in an MCP error
     "This model does not know these words: 'a', '<', 'b', '>'. Its vocabulary has 97 tokens; open “Vocabulary” "
     "(under the text) to see them all, or try one of the example prompts."),
])
@pytest.mark.parametrize("progress", [False, True])
def test_a_refusal_is_an_mcp_error_with_the_sentence(server, arguments, sentence, progress):
    assert call(server, "attention", arguments, progress=progress) == (True, sentence)


def test_one_clients_flood_is_held_by_its_addresss_rate(server):
    """Generate's bucket holds 20 calls at once and does not refill during the test: of 22 calls in a row from
    one address the last two are refused, in the door's sentence. The MCP server makes each call of the app
    from the server itself; they count against the address of the MCP request (ui/door.py's VIA): another
    address's Generate still answers, and so do the flooding address's calls of other tools."""
    arguments = {"model": "sort digits (built-in)", "prompt": "503124=", "max_new_tokens": 1, "temperature": 0.0}

    async def flood():
        async with connected(server, "127.0.0.3") as session:
            return [await session.call_tool("generate", arguments) for _ in range(22)]
    results = in_own_thread(lambda: asyncio.run(flood()))
    assert [r.isError for r in results] == [False] * 20 + [True] * 2
    for r in results[20:]:
        assert r.content[0].text.startswith(SLOW_DOWN), r.content[0].text
    assert json.loads(results[0].content[0].text)["generated"][0]["piece"] == "0"
    for progress in (False, True):  # a new connection: the same address
        error, text = call(server, "generate", arguments, "127.0.0.3", progress)
        assert error and text.startswith(SLOW_DOWN)
    error, text = call(server, "generate", arguments, "127.0.0.4")  # another address: its own bucket
    assert not error and json.loads(text)["generated"][0]["piece"] == "0"
    error, text = call(server, "attention", {"model": GRAMMAR, "prompt": P, "layer": 0, "head": 0}, "127.0.0.3")
    assert not error and json.loads(text)["heads"] == [0]


def test_one_clients_calls_at_once_are_held_by_its_share_of_the_queue(server):
    """Twelve calls sent together: each answers with the same numbers or is refused at the door in a sentence
    about the address's share (which ones depends on the machine; that every call ends one of the two ways
    does not)."""
    arguments = {"model": GRAMMAR, "prompt": P, "layer": 2, "head": 3}
    want = json.loads(call(server, "attention", arguments)[1])

    async def together():
        async with connected(server) as session:
            return await asyncio.gather(*(session.call_tool("attention", arguments) for _ in range(12)))
    results = in_own_thread(lambda: asyncio.run(together()))
    answered = [json.loads(r.content[0].text) for r in results if not r.isError]
    refused = [r.content[0].text for r in results if r.isError]
    assert answered and all(a == want for a in answered) and len(answered) + len(refused) == 12
    assert all(text.startswith("Your address") for text in refused), refused


def test_the_worked_call_in_the_docs_prints_what_they_say(server):
    docs = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text(encoding="utf-8")
    [code] = [b for b in re.findall(r"```python\n(.*?)```", docs, re.S) if "streamable_http_client" in b]
    code = code.replace('"http://127.0.0.1:7860/gradio_api/mcp/"', repr(server.url + "gradio_api/mcp/"))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        in_own_thread(lambda: exec(compile(code, "docs/api.md", "exec"), {"__name__": "docs"}))
    assert f"It prints `{printed.getvalue().strip()}`" in docs


def test_mcp_is_served_only_when_asked_for(monkeypatch):
    import app

    monkeypatch.delenv("DECODER_LAB_MCP", raising=False)
    assert app.serves_mcp([]) is None  # gradio's own GRADIO_MCP_SERVER then decides: off unless set
    assert app.serves_mcp(["--mcp"]) is True
    monkeypatch.setenv("DECODER_LAB_MCP", "1")  # a Space's variable
    assert app.serves_mcp([]) is True
