"""The server's log, read after every call: each Python traceback it printed, reduced to its root
exception, where it was raised and whose code that is (the app's or gradio's)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tests.support.server import ROOT

from .checks import shorten


@dataclass
class Traceback:
    exc: str  # first line of the root exception, e.g. "TypeError: '<' not supported ..."
    raised_in: str  # the root exception's last frame, e.g. "gradio/components/slider.py:preprocess"
    printed_by: str  # the outermost catcher, e.g. "gradio/queueing.py:process_events"
    origin: str  # "app" when any frame is in this repository, else "gradio" (its preprocessing, routing)
    refusal: bool  # a gr.Error (a refusal with a message), printed only because print_exception is on

    @property
    def kind(self) -> str:
        what = "refusal (gr.Error)" if self.refusal else self.exc.split(":")[0]
        return f"traceback: {what} raised in {self.raised_in}, printed by {self.printed_by}"


FRAME_RE = re.compile(r'^\s+File "([^"]+)", line (\d+), in (\S+)')


def short_frame(path: str, func: str) -> str:
    p = Path(path)
    try:
        return f"{p.resolve().relative_to(ROOT)}:{func}"
    except ValueError:
        pass
    m = re.search(r"(?:site|dist)-packages/(.*)$", path)
    return f"{m.group(1) if m else p.name}:{func}"


def frame_origin(path: str) -> str:
    if "-packages/" in path:
        return path.split("-packages/")[1].split("/")[0]
    try:
        Path(path).resolve().relative_to(ROOT)
        return "app"
    except ValueError:
        return "python"


class LogWatch:
    """Reads what the server printed since the last read and finds the Python tracebacks in it."""

    CHAIN = ("During handling of the above exception", "The above exception was the direct cause")

    def __init__(self, path: Path | None):
        self.path = path
        self.offset = path.stat().st_size if path is not None and path.exists() else 0
        self.pending = ""

    def read(self) -> list[Traceback]:
        if self.path is None or not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        self.offset += len(chunk)
        text = self.pending + chunk.decode("utf-8", errors="replace")
        tbs, self.pending = self.parse(text)
        return tbs

    @classmethod
    def parse(cls, text: str) -> tuple[list[Traceback], str]:
        """The complete tracebacks in `text`, and the unfinished tail to read again with more text."""
        lines = text.split("\n")
        tail = lines.pop()  # an unfinished line
        out: list[Traceback] = []
        i, n = 0, len(lines)
        while i < n:
            if not lines[i].startswith("Traceback (most recent call last):"):
                i += 1
                continue
            start, hint = i, lines[i - 1] if i else ""
            blocks = []  # (frames, exception line) of a chain, innermost first
            while True:
                frames, j = [], i + 1
                while j < n and (lines[j].startswith(" ") or not lines[j]):
                    m = FRAME_RE.match(lines[j])
                    if m:
                        frames.append((m.group(1), m.group(3)))
                    j += 1
                if j >= n:
                    return out, "\n".join(lines[start:] + [tail])
                blocks.append((frames, lines[j]))
                k = j + 1
                while k < n and (not lines[k] or lines[k].startswith(" ")):
                    k += 1  # the rest of a multi-line exception message
                if k < n and lines[k].startswith(cls.CHAIN):
                    k += 1
                    while k < n and not lines[k]:
                        k += 1
                    if k < n and lines[k].startswith("Traceback (most recent call last):"):
                        i = k
                        continue
                    if k >= n:
                        return out, "\n".join(lines[start:] + [tail])
                i = k
                break
            root_frames, root_exc = blocks[0]
            outer_frames = blocks[-1][0]
            raised = root_frames[-1] if root_frames else ("?", "?")
            ours = [f for b in blocks for f in b[0] if frame_origin(f[0]) == "app"]
            raised_in = short_frame(*raised)
            if ours and frame_origin(raised[0]) != "app":
                raised_in += f" (called from {short_frame(*ours[-1])})"
            if hint.startswith(("ERROR:", "--- Logging error")):
                printer = "a log line " + repr(shorten(hint, 70))
            elif outer_frames:
                printer = short_frame(*outer_frames[0])
            else:
                printer = "?"
            exc = root_exc.strip()
            out.append(Traceback(exc=shorten(exc, 300), raised_in=raised_in, printed_by=printer,
                                 origin="app" if ours else "gradio",
                                 refusal=exc.split(":")[0] == "gradio.exceptions.Error"))
        return out, tail
