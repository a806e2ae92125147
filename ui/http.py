"""Raw HTTP on the app's own routes: malformed calls get a 4xx and a plain message, never HTTP 500."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from pathlib import Path

import gradio as gr
from gradio.utils import get_type_hints, get_upload_folder

from lab.checks import is_int

from . import diagnose
from .door import Door, without_charge

log = logging.getLogger("decoder_lab")


class RefuseMalformedCalls:
    """ASGI middleware: a call to an unknown endpoint or a page-only function with no server side,
    with the wrong number of values, a non-finite number or no fitting event data, gets a 4xx and a
    plain message before gradio's routes see it (they answer such calls with HTTP 500 or an empty
    error); so does a call holding a lone surrogate, which is not text. The direct routes (/run/<name>,
    /api/<name>) run only what the page itself runs there, the functions outside the queue, and their
    refusals come back as 400 with the handler's sentence."""

    # queue/join and call/<name> go through the queue; run/<name> and api/<name> answer in the reply
    CALL = re.compile(r"^/gradio_api/(?:(queue/join)|call/(?:v2/)?([^/]+)|(?:run|api)/([^/]+))/?$")
    UPLOAD = "/gradio_api/upload"
    FIELDS = {"session_hash": str, "event_id": str, "oauth_token": str, "trigger_id": int,
              "simple_format": bool, "batched": bool}  # gradio's own check of these answers a list, not a sentence
    KINDS = {str: "text", int: "a whole number", bool: "true or false"}
    MAX_BODY = 16 * 2**20  # the largest valid call: 1.2 M characters of pasted text, JSON-escaped (≤ 12 B each)

    def __init__(self, app, blocks: gr.Blocks):
        self.app, self.blocks = app, blocks
        self.door = Door(blocks)  # each address's share of the queue, its rates, its session's turn
        diagnose.watch(blocks, self.door)  # what `kill -USR1` reports (ui/diagnose.py)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            scope = without_charge(scope)
        match = self.CALL.match(scope.get("path", "")) if scope["type"] == "http" else None
        if match is None and scope.get("method") == "POST" and scope["path"].rstrip("/") == self.UPLOAD:
            refused = self.door.admit_upload(scope)  # the address's share of gradio's cache
            if refused:
                log.info("refused an upload at the door: %s", refused[1])
                await asyncio.sleep(self.door.refusal_pause_s)  # one sent again at once costs little (ui/door.py)
                return await self.refuse(send, *refused, close=True)  # its body is never read
        if match is None or scope.get("method") != "POST":
            return await self.app(scope, receive, send)
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.MAX_BODY:
                return await self.refuse(send, 413, "The request is too large.")
        direct = match.group(3) is not None
        problem = self.problem(match.group(2) or match.group(3), body, direct)
        if problem:
            log.info("refused HTTP call %s: %s", scope["path"][:80], problem[1])
            return await self.refuse(send, *problem)
        if direct:
            send = self.refusals_as_400(send)
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        if direct:
            return await self.app(scope, replay, send)
        async with self.door.admit(scope, match.group(2), body) as refused:
            if refused:
                log.info("refused HTTP call %s at the door: %s", scope["path"][:80], refused[1])
                return await self.refuse(send, *refused)
            await self.app(scope, replay, send)

    def problem(self, api_name: str | None, body: bytes, direct: bool = False) -> tuple[int, str] | None:
        def finite_only(token):
            raise ValueError(token)

        try:
            payload = json.loads(body, parse_constant=finite_only)
        except (ValueError, RecursionError):  # RecursionError: nesting deeper than any real call
            return 400, "The request is not valid JSON with finite numbers."
        if not isinstance(payload, dict):
            return 400, "The request must be a JSON object."
        for key, kind in self.FIELDS.items():
            value = payload.get(key)
            if value is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
                return 400, f"{key} must be {self.KINDS[kind]}."
        fns, index = self.blocks.fns, payload.get("fn_index")
        if api_name is None or (direct and index is not None):  # the page's own calls name a function by index
            fn = fns.get(index) if is_int(index) else None
            if fn is None:
                return 404, "There is no such function."
        else:
            fn = next((f for f in fns.values() if f.api_name == api_name), None)
            if fn is None:
                return 404, f"There is no API endpoint named {api_name[:40]!r}."
        if fn.fn is None:
            return 404, "This function runs in the page alone: the server has nothing to run for it."
        if direct and fn.queue:  # the queue is where concurrency limits and admission apply: no way around it
            where = (f"POST /gradio_api/call/{fn.api_name} (as gradio_client does)" if fn.api_visibility != "private"
                     else "POST /gradio_api/queue/join (as the page does)")
            return 404, f"This function runs in the queue, not in a direct call: use {where}."
        # a lone surrogate (JSON's \\udfff) is no text: gradio cannot send back an answer or a refusal that holds
        # it (a direct reply ends in a bare 500, the page's shared event stream breaks off and the call never ends)
        if not self.utf8(payload):
            return 400, "The request holds text that is not valid Unicode (a lone surrogate)."
        if fn.collects_event_data and not self.event_data_fits(fn, payload.get("event_data")):
            return 400, "This event needs the details the page sends with it (such as which item was clicked)."
        if not direct and api_name is not None and isinstance(payload.get("data"), dict):
            return None  # /call/v2: values by name, checked by gradio
        data = payload.get("data")
        api_inputs = [b for b in fn.inputs if not getattr(b, "skip_api", False)]
        # only /call/<name> fills in the values the API leaves out (the session); every other route needs all
        counts = {len(fn.inputs), len(api_inputs)} if api_name is not None and not direct else {len(fn.inputs)}
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

    def event_data_fits(self, fn, data) -> bool:
        """Whether `data` makes the event object the handler asks for (gradio's own attempt fails with an
        empty error); no file in it."""
        hints = get_type_hints(fn.fn).values()
        kinds = [h for h in hints if isinstance(h, type) and issubclass(h, gr.EventData)]
        try:
            for kind in kinds:
                kind(None, data)
        except Exception:  # any exception: the class reads keys, indexes and attributes of what was sent
            return False
        return not self.holds_file(data)

    @staticmethod
    def utf8(payload) -> bool:
        """Whether every string in the parsed request can be written as UTF-8 (JSON's \\ud800 escapes
        parse to lone surrogates, which cannot)."""
        try:
            json.dumps(payload, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True

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
    def refusals_as_400(send):
        """`send` for a direct route, where gradio answers every error with HTTP 500: a handler's refusal
        (a sentence) becomes a 400 with the same body, the generic message of a fault stays a 500, and an
        empty error gets a sentence."""
        start, chunks = None, []

        async def wrapped(message):
            nonlocal start
            if message["type"] == "http.response.start" and message["status"] == 500:
                start = message
                return
            if start is None or message["type"] != "http.response.body":
                return await send(message)
            chunks.append(message.get("body", b""))
            if message.get("more_body"):
                return
            status, raw = 500, b"".join(chunks)
            try:
                error = json.loads(raw).get("error")
            except (ValueError, AttributeError):
                error = None
            if isinstance(error, str) and error.strip() and not error.startswith("Something went wrong"):
                status = 400
            elif not (isinstance(error, str) and error.strip()):
                error = "The server could not run this call."
                raw = json.dumps({"error": error, "detail": error}).encode()
            headers = [(k, v) for k, v in start["headers"] if k.lower() != b"content-length"]
            await send({**start, "status": status, "headers": [*headers, (b"content-length", str(len(raw)).encode())]})
            await send({"type": "http.response.body", "body": raw})

        return wrapped

    @staticmethod
    async def refuse(send, status: int, message: str, close: bool = False):
        raw = json.dumps({"error": message, "detail": message}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
        await send({"type": "http.response.start", "status": status,
                    "headers": headers + [(b"connection", b"close")] * close})
        await send({"type": "http.response.body", "body": raw})
