"""Raw HTTP on the app's own routes: malformed calls get a 4xx and a plain message, never HTTP 500."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import gradio as gr
from gradio.utils import get_upload_folder

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
        except (ValueError, RecursionError):  # RecursionError: nesting deeper than any real call
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
        api_inputs = [b for b in fn.inputs if not getattr(b, "skip_api", False)]
        counts = {len(fn.inputs), len(api_inputs)}
        if not isinstance(data, list) or len(data) not in counts:
            got = len(data) if isinstance(data, list) else "none"
            return 400, f"This call needs {min(counts)} values; it sent {got}."
        inputs = fn.inputs if len(data) == len(fn.inputs) else api_inputs
        for block, value in zip(inputs, data):
            name = block.label or "a value"
            if isinstance(block, (gr.File, gr.UploadButton)):
                if not self.uploaded_file(value):
                    return 400, f"{name}: send a file uploaded to this app (or nothing)."
            elif self.holds_file(value):  # gradio would try to move it into its cache, whatever the input
                return 400, f"{name}: a file is not a value this argument takes."
        return None

    @classmethod
    def holds_file(cls, value, depth: int = 0) -> bool:
        """Whether a value is, or contains, something gradio treats as a file (a FileData dict)."""
        if depth > 50:
            return True  # deeper than any real value: refuse rather than walk on
        if isinstance(value, dict):
            meta = value.get("meta")
            if isinstance(meta, dict) and meta.get("_type") == "gradio.FileData":
                return True
            return any(cls.holds_file(v, depth + 1) for v in value.values())
        if isinstance(value, list):
            return any(cls.holds_file(v, depth + 1) for v in value)
        return False

    @staticmethod
    def uploaded_file(value) -> bool:
        """None, or a FileData of a file uploaded to this server (what gradio's own check needs, without
        its traceback and empty error for anything else)."""
        if value is None:
            return True
        if not isinstance(value, dict) or not isinstance(value.get("path"), str) or not value["path"]:
            return False
        optional = {"url": str, "orig_name": str, "mime_type": str, "size": int, "is_stream": bool, "meta": dict}
        if any(value.get(k) is not None and not isinstance(value[k], t) for k, t in optional.items()):
            return False
        upload_dir = Path(get_upload_folder()).resolve()
        try:
            return Path(value["path"]).resolve().is_relative_to(upload_dir)
        except (OSError, ValueError, RuntimeError):
            return False

    @staticmethod
    async def refuse(send, status: int, message: str):
        raw = json.dumps({"error": message, "detail": message}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]})
        await send({"type": "http.response.body", "body": raw})
