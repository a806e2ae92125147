"""Who a call counts against (the door's client, ui/door.py), and the headers only the door may set.

A call's client is its address (lab.server.rates.client_key: behind a proxy, the address it forwarded). One
kind of call comes from the server itself: gradio's MCP server (`python app.py --mcp`, ui/tools.py) makes each
tool call as a call of this app from its own address, passing on the MCP request's headers. So the door marks
every request to the MCP server with its client (`VIA`, holding a key only this process knows), and a call
carrying that mark counts against the client it names: one agent's flood spends its own address's shares, not
those of every MCP client at once. A VIA without the key, which anyone could send, is dropped as it arrives,
and so is `CHARGED` (what the door charged a call for, ui/door.py), whoever sent it.
"""

from __future__ import annotations

import hmac
import secrets

from lab.server.rates import client_key

CHARGED = b"x-decoder-lab-charged"  # what the door charged a call for (its rate, "replay"), comma-separated
VIA = b"x-decoder-lab-via"  # "<key> <client>": the client an MCP request came from, on the calls made for it
_VIA_KEY = secrets.token_urlsafe(24)  # this process's own
MCP_PATH = "/gradio_api/mcp"  # gradio's MCP server (streamable HTTP; SSE under it)


def request_header(scope, name: bytes) -> str | None:
    """A raw ASGI request's header (`name` in lower case), or None."""
    for k, v in scope.get("headers", []):
        if k.lower() == name:
            return v.decode("latin-1")
    return None


def _via(value: str | None) -> str | None:
    """The client a VIA mark names, when this process wrote it (None otherwise)."""
    key, _, client = (value or "").partition(" ")
    return client if client and hmac.compare_digest(key.encode(), _VIA_KEY.encode()) else None


def scope_client(scope) -> str:
    """The client a raw ASGI request counts against: the one its VIA names, else its address."""
    host = (scope.get("client") or (None,))[0]
    return _via(request_header(scope, VIA)) or client_key(host, request_header(scope, b"x-forwarded-for"))


def request_client(request) -> str | None:
    """The client a call counts against, from its gr.Request (None without one), as `scope_client`."""
    if request is None or request.client is None:
        return None
    return _via(request.headers.get(VIA.decode())) or client_key(request.client.host,
                                                                 request.headers.get("x-forwarded-for"))


def without_charge(scope):
    """The request as the door reads it: without a `CHARGED` header or a `VIA` this process did not write; a
    request to the MCP server with a VIA naming its own client (any VIA it came with dropped)."""
    headers = scope.get("headers", [])
    mcp = scope.get("path", "").startswith(MCP_PATH)
    if mcp or any(k.lower() in (CHARGED, VIA) for k, _ in headers):
        kept = [(k, v) for k, v in headers
                if k.lower() != CHARGED and (k.lower() != VIA or (not mcp and _via(v.decode("latin-1"))))]
        scope = dict(scope, headers=kept)
        if mcp:
            scope["headers"].append((VIA, f"{_VIA_KEY} {scope_client(scope)}".encode("latin-1")))
    return scope
