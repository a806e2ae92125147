"""A stand-in for NDIF on 127.0.0.1, answering nnsight's remote requests as nnsight 0.8.1's client expects
(nnsight/intervention/backends/remote.py, schema/request.py, schema/response.py), for
tests/engine/test_nnsight_backend.py.

What the client does, and what this server answers:

1. GET /subscribe, upgraded to a websocket (header `ndif-api-key`): the first message is JSON
   {"session_id": ...}; status updates for the session's jobs follow on it.
2. POST /request, multipart: form field `data` (RequestModel's JSON: model_key, session_id, compress, env) and
   file `blob` (the serialized trace, zstd-compressed when `compress`), the key in `ndif-api-key`. A wrong
   key is a 401 whose JSON `detail` the client shows; otherwise a ResponseModel JSON with status RECEIVED.
3. On the websocket: RUNNING (JSON), then COMPLETED as a binary frame (`ResponseModel.pickle()`, its `data`
   the result itself: torch.save of the saved values, zstd-compressed when the request was), or ERROR (JSON
   with the description) when the job fails.

The job runs as a server must: `RequestModel.deserialize` with the persistent objects of this server's own
copy of the model (loaded with nnsight from the local folder the model key's repo_id names), then the
tracer's own `execute`, under nnsight's trace depth so that only saved values come back. The websocket is
written by hand (RFC 6455: the accept hash, unmasked server frames), as nothing else here serves one.
"""

from __future__ import annotations

import base64
import email.parser
import email.policy
import hashlib
import io
import json
import linecache
import socket
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import torch

WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def ws_frame(opcode: int, payload: bytes) -> bytes:
    """One final, unmasked websocket frame (a server's)."""
    n = len(payload)
    if n < 126:
        size = bytes([n])
    elif n < 1 << 16:
        size = bytes([126]) + n.to_bytes(2, "big")
    else:
        size = bytes([127]) + n.to_bytes(8, "big")
    return bytes([0x80 | opcode]) + size + payload


class FakeNDIF(ThreadingHTTPServer):
    """The server: `key` is the API key it accepts, `folders` maps a repo id to the local model folder."""

    daemon_threads = True

    def __init__(self, key: str, folders: dict[str, Path]):
        super().__init__(("127.0.0.1", 0), Handler)
        self.key, self.folders = key, {str(k): Path(v) for k, v in folders.items()}
        self.models: dict[str, object] = {}
        self.sockets: dict[str, tuple[socket.socket, threading.Lock]] = {}
        self.requests: list[dict] = []  # what each POST carried (the key only as key_ok)
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def send(self, session_id: str, opcode: int, payload: bytes) -> None:
        sock, lock = self.sockets[session_id]
        with lock:
            sock.sendall(ws_frame(opcode, payload))

    def model_for(self, model_key: str):
        """This server's copy of the model the key names ("import.path.Class:{json with repo_id}")."""
        from nnsight import TransformersModel

        repo = json.loads(model_key.split(":", 1)[1])["repo_id"]
        with self.lock:
            if repo not in self.models:
                model = TransformersModel(str(self.folders[repo]), task="text-generation",
                                          attn_implementation="eager", dispatch=True, dtype=torch.float32)
                model.requires_grad_(False)
                self.models[repo] = model
            return self.models[repo]

    def run_job(self, job: str, session_id: str, meta, blob: bytes) -> None:
        from nnsight.schema.request import RequestModel
        from nnsight.schema.response import ResponseModel, Status
        from nnsight.tracing.tracer import _saves, dec, inc

        self.send(session_id, 0x1, ResponseModel(id=job, status=Status.RUNNING).model_dump_json().encode())
        # deserializing registers the block's source under the client's file name, as on a server; this server
        # shares the client's process, so the client's own lines are put back afterwards
        lines = dict(linecache.cache)
        try:
            model = self.model_for(meta.model_key)
            tracer = RequestModel.deserialize(blob, model._remoteable_persistent_objects(), compress=meta.compress)
            scope = tracer.info.frame.f_locals
            inc()  # the depth of an outermost trace: its execute hands back the saved values alone
            try:
                with torch.no_grad():
                    tracer.execute(tracer.info.code)
                saved = _saves()  # nnsight's own record of what the block saved (by identity)
                result = {k: v for k, v in scope.items() if id(v) in saved}
            finally:
                dec()
            buffer = io.BytesIO()
            torch.save(result, buffer)
            data = buffer.getvalue()
            if meta.compress:
                import zstandard

                data = zstandard.ZstdCompressor().compress(data)
            done = ResponseModel(id=job, status=Status.COMPLETED, description="done", data=data)
            self.send(session_id, 0x2, done.pickle())
        except Exception as exc:  # the job's failure goes back as NDIF sends it: an ERROR update
            failed = ResponseModel(id=job, status=Status.ERROR, description=f"{type(exc).__name__}: {exc}")
            self.send(session_id, 0x1, failed.model_dump_json().encode())
        finally:
            for name, entry in lines.items():
                if linecache.cache.get(name) is not entry:
                    linecache.cache[name] = entry


class Handler(BaseHTTPRequestHandler):
    server: FakeNDIF

    def log_message(self, *args) -> None:  # quiet: the test's output is its own
        pass

    def do_GET(self) -> None:
        if self.path != "/subscribe" or self.headers.get("Upgrade", "").lower() != "websocket":
            self.send_error(404)
            return
        accept = base64.b64encode(hashlib.sha1((self.headers["Sec-WebSocket-Key"] + WS_GUID).encode()).digest())
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept.decode())
        self.end_headers()
        session_id = uuid.uuid4().hex
        self.server.sockets[session_id] = (self.connection, threading.Lock())
        self.server.send(session_id, 0x1, json.dumps({"session_id": session_id}).encode())
        # read the client's frames until it closes (it sends nothing else)
        while True:
            head = self.rfile.read(2)
            if len(head) < 2:
                return
            opcode, n = head[0] & 0x0F, head[1] & 0x7F
            if n == 126:
                n = int.from_bytes(self.rfile.read(2), "big")
            elif n == 127:
                n = int.from_bytes(self.rfile.read(8), "big")
            self.rfile.read((4 if head[1] & 0x80 else 0) + n)
            if opcode == 0x8:
                self.server.send(session_id, 0x8, b"")
                return

    def do_POST(self) -> None:
        from nnsight.schema.request import RequestModel
        from nnsight.schema.response import ResponseModel, Status

        body = self.rfile.read(int(self.headers["Content-Length"]))
        key_ok = self.headers.get("ndif-api-key") == self.server.key
        if self.path != "/request":
            self.send_error(404)
            return
        head = f"Content-Type: {self.headers['Content-Type']}\r\n\r\n".encode()
        message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
        parts = {p.get_param("name", header="content-disposition"): p.get_payload(decode=True)
                 for p in message.iter_parts()}
        meta = RequestModel.model_validate_json(parts["data"])
        self.server.requests.append({"model_key": meta.model_key, "session_id": meta.session_id, "key_ok": key_ok,
                                     "compress": meta.compress, "blob_bytes": len(parts["blob"]),
                                     "nnsight_version": self.headers.get("nnsight-version")})
        if not key_ok:
            self._json(401, {"detail": "this NDIF API key is not valid"})
            return
        job = uuid.uuid4().hex
        self._json(200, json.loads(ResponseModel(id=job, status=Status.RECEIVED).model_dump_json()))
        threading.Thread(target=self.server.run_job, args=(job, meta.session_id, meta, parts["blob"]),
                         daemon=True).start()

    def _json(self, status: int, value) -> None:
        data = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
