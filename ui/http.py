"""Raw HTTP on the app's own routes: malformed calls get a 4xx and a plain message, never HTTP 500."""

from __future__ import annotations

import json
import logging
import re

import gradio as gr

log = logging.getLogger("decoder_lab")


class RefuseMalformedCalls:
    """ASGI middleware: a call to an unknown endpoint, or with the wrong number of values or a
    non-finite number, gets a 4xx and a plain message before gradio's routes see it (they answer
    such calls with HTTP 500 or an empty error)."""

    CALL = re.compile(r"^/gradio_api/(?:(queue/join)|(?:call|run)/(?:v2/)?([^/]+))/?$")
    MAX_BODY = 16 * 2**20  # the largest valid call: 1.2 M characters of pasted text, JSON-escaped (≤ 12 B each)

    def __init__(self, app, blocks: gr.Blocks):
        self.app, self.blocks = app, blocks

    async def __call__(self, scope, receive, send):
        match = self.CALL.match(scope.get("path", "")) if scope["type"] == "http" else None
        if match is None or scope.get("method") != "POST":
            return await self.app(scope, receive, send)
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.MAX_BODY:
                return await self.refuse(send, 413, "The request is too large.")
        problem = self.problem(match.group(2), body)
        if problem:
            log.info("refused HTTP call %s: %s", scope["path"][:80], problem[1])
            return await self.refuse(send, *problem)
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    def problem(self, api_name: str | None, body: bytes) -> tuple[int, str] | None:
        def finite_only(token):
            raise ValueError(token)

        try:
            payload = json.loads(body, parse_constant=finite_only)
        except ValueError:
            return 400, "The request is not valid JSON with finite numbers."
        if not isinstance(payload, dict):
            return 400, "The request must be a JSON object."
        fns, index = self.blocks.fns, payload.get("fn_index")
        if index is not None or api_name is None:  # the page's own calls name a function by index
            fn = fns.get(index) if isinstance(index, int) and not isinstance(index, bool) else None
            if fn is None:
                return 404, "There is no such function."
        else:
            fn = next((f for f in fns.values() if f.api_name == api_name), None)
            if fn is None:
                return 404, f"There is no API endpoint named {api_name[:40]!r}."
            if isinstance(payload.get("data"), dict):  # /call/v2: values by name, checked by gradio
                return None
        data = payload.get("data")
        counts = {len(fn.inputs), len([b for b in fn.inputs if not getattr(b, "skip_api", False)])}
        if not isinstance(data, list) or len(data) not in counts:
            got = len(data) if isinstance(data, list) else "none"
            return 400, f"This call needs {min(counts)} values; it sent {got}."
        return None

    @staticmethod
    async def refuse(send, status: int, message: str):
        raw = json.dumps({"error": message, "detail": message}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]})
        await send({"type": "http.response.body", "body": raw})
