"""The door's VIA header (ui/clients.py): a request to the MCP server is marked with its client, which the calls
gradio's MCP server then makes of this app (from the server's own address, with the MCP request's headers)
count against; a VIA the door did not write, sent by anyone, is dropped and counts for nothing.
"""

from __future__ import annotations

from types import SimpleNamespace

from ui.clients import CHARGED, VIA, request_client, scope_client, without_charge


def scope(path: str, host: str, headers: list[tuple[bytes, bytes]] = ()) -> dict:
    return {"type": "http", "path": path, "client": (host, 5000), "headers": list(headers)}


def as_request(s: dict):
    """What a handler or the queue sees of a request (gr.Request's client and headers)."""
    headers = {k.decode(): v.decode() for k, v in s["headers"]}
    return SimpleNamespace(client=SimpleNamespace(host=s["client"][0]), headers=headers)


def test_an_mcp_request_names_its_client_for_the_calls_made_for_it():
    mcp = without_charge(scope("/gradio_api/mcp/", "198.51.100.7", [(VIA, b"forged 203.0.113.1")]))
    marks = [v for k, v in mcp["headers"] if k == VIA]
    assert len(marks) == 1 and marks[0].endswith(b" 198.51.100.7")  # its own address, the forged mark gone
    # gradio's MCP server passes the MCP request's headers on to the call it makes from the server itself
    loopback = without_charge(scope("/gradio_api/queue/join", "127.0.0.1", [(VIA, marks[0]), (CHARGED, b"patch")]))
    assert scope_client(loopback) == "198.51.100.7" and request_client(as_request(loopback)) == "198.51.100.7"
    assert all(k != CHARGED for k, _ in loopback["headers"])


def test_a_via_the_door_did_not_write_counts_for_nothing():
    for forged in (b"203.0.113.1", b"x 203.0.113.1", b" 203.0.113.1", b""):
        s = without_charge(scope("/gradio_api/queue/join", "192.0.2.5", [(VIA, forged)]))
        assert all(k != VIA for k, _ in s["headers"]), forged
        assert scope_client(s) == "192.0.2.5"
        assert request_client(as_request(scope("/gradio_api/queue/join", "192.0.2.5", [(VIA, forged)]))) == "192.0.2.5"
    assert request_client(None) is None
