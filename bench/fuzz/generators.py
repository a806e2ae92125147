"""The call generators: for each parameter of an endpoint a valid value (coherent with the model the
call names), an edge value of about the right type, or junk; `build` makes a whole call of one mode."""

from __future__ import annotations

import math
from typing import Any

from lab.limits import MAX_NEW_TOKENS, MAX_PROMPT_CHARS, SEED_RANGE

from .calls import CALL_TIMEOUT_S, TRAIN_TIMEOUT_S, Call, Endpoint, Param, client_can_send
from .knowledge import ModelInfo
from .values import FILEDATA_META, HUGE, INTEGERS, JUNK, LIMITS, RAW_JUNK, SEEDS, SERVER_PATHS, TEXT, TINY

class CallGenerators:
    """The values and calls the fuzzer makes, a part of `Fuzzer` kept apart to be read on its own.

    It reads the fuzzer's `files` (the uploads it can make), `know` (its twins' models and text),
    `served` (files the server served) and `workdir`.
    """

    def numeric_range(self, p: Param) -> tuple[float, float] | None:
        lo, hi = LIMITS.get(p.name, (p.lo, p.hi))
        if lo is None or hi is None:
            return None
        if p.lo is not None:
            lo, hi = max(lo, p.lo), min(hi, p.hi)
        return lo, hi

    def is_int(self, p: Param) -> bool:
        return p.name in INTEGERS or p.type == "integer"

    def file_value(self, p: Param, draw, call: Call) -> Any:
        from gradio_client import handle_file

        if p.name == "path" or "safetensors" in p.label.lower() or "model" in p.label.lower():
            path, label, info = self.files.checkpoint(draw)
            call.info = ModelInfo(info["layers"], info["heads"], [info["prompt"]])
        else:
            path, label = self.files.text(draw, valid=True)
        call.note = (call.note + "; " if call.note else "") + label
        return handle_file(str(path))

    def valid_value(self, p: Param, draw, call: Call, ctx: dict) -> Any:
        name, info = p.name, ctx.get("info")
        if name == "model_name":
            return ctx["model"]
        if name == "prompt":
            prompts = info.prompts if info and info.prompts else [p.default or "a"]
            prompt = draw.choice(prompts)
            if draw.chance(0.1):  # longer than the context: cropped with a notice
                prompt = (prompt + " ") * 12 if " " in prompt else prompt * 12
            return prompt[:MAX_PROMPT_CHARS]
        if name == "layer":
            return draw.integer(0, max(0, (info.layers if info else 1) - 1))
        if name == "head":
            n = info.heads if info else 1
            return "all" if draw.chance(0.4) else draw.integer(0, max(0, n - 1))
        if name == "seed":
            return draw.choice(SEEDS) if draw.chance(0.8) else draw.integer(*SEED_RANGE)
        if name == "max_new":
            return draw.integer(1, 12) if draw.chance(0.9) else MAX_NEW_TOKENS
        if name == "temperature" and draw.chance(0.25):
            return 0.0
        if name == "steps":
            lo = int(self.numeric_range(p)[0])
            return draw.integer(lo, lo + 2)
        if name in TINY:
            return draw.choice(TINY[name])
        if name == "corpus_name":
            return ctx.setdefault("corpus", draw.choice(p.enum or ["sort"]))
        if name == "pasted":
            return TEXT if ctx.get("corpus") == "text" or draw.chance(0.2) else ""
        if p.component == "File":
            if ctx.get("corpus") == "text" and draw.chance(0.3) or p.name == "path":
                return self.file_value(p, draw, call)
            return None
        if p.enum:
            return draw.choice(p.enum)
        rng = self.numeric_range(p)
        if rng is not None:
            lo, hi = rng
            if self.is_int(p):
                return draw.integer(int(math.ceil(lo)), int(math.floor(hi)))
            return draw.choice([lo, hi, round(draw.uniform(lo, hi), 4)])
        if p.type in ("number", "integer"):
            return p.default if isinstance(p.default, (int, float)) else 0
        if p.type == "boolean":
            return draw.chance(0.5)
        return p.default if p.default is not None else p.example

    def edge_value(self, p: Param, draw, raw: bool) -> tuple[Any, str]:
        """A value of about the right type at or past the edge of what is allowed."""
        rng = self.numeric_range(p)
        if rng is not None or p.type in ("number", "integer"):
            lo, hi = rng or (0, 1)
            options = [(lo, "low bound"), (hi, "high bound"), (lo - 1, "below low"), (hi + 1, "above high"),
                       (hi + 0.001, "just above high"), (lo - 1e-9, "just below low"), (HUGE, "10**400"),
                       (-HUGE, "-10**400"), (2**63, "2**63"), (1e308, "1e308"), (0, "0"), (-1, "-1"), (True, "True")]
            if self.is_int(p):
                options += [(2.5, "2.5 for a whole number"), (lo + 0.5, "low + 0.5"), (float(hi), "float high"),
                            (str(int(lo)), "whole number as text"), (" 1 ", "padded text number")]
            if raw:
                options += [(float("nan"), "NaN"), (float("inf"), "Infinity"), (float("-inf"), "-Infinity")]
            return draw.choice(options)
        if p.enum:
            e = draw.choice(p.enum)
            options = [(str(e).upper(), "choice in upper case"), (f" {e} ", "choice with spaces"),
                       (str(e) + "\x00", "choice + NUL"), ([e], "choice in a list"), ("", "empty"),
                       (str(e) if not isinstance(e, str) else e + "x", "near choice")]
            if p.name == "model_name":
                options += [("my sort model", "someone's trained model"), ("uploaded: m", "someone's upload"),
                            ("grammar (built-in) ", "trailing space")]
            if p.name in ("layer", "head"):
                options += [(99, "99"), (-1, "-1"), ("1", "number as text"), (1.0, "1.0")]
            return draw.choice(options)
        if p.name == "prompt" or p.component == "Textbox":
            options = [("", "empty"), ("  \n\t ", "blank"), ("a" * (MAX_PROMPT_CHARS + 1), "limit + 1"),
                       ("a" * MAX_PROMPT_CHARS, "at the limit"), ("zebra qqq", "unknown words"),
                       ("\u0000\u0001\u001f", "control characters"), ("\ud83d", "lone surrogate"),
                       ("x" * 1_000_000, "1 MB"), ("\u202e\u200b\ufeff", "format characters"),
                       ("<EOS>", "<EOS> alone"), (TEXT * 3, "3 training texts")]
            return draw.choice(options)
        if p.component == "File":
            if raw:
                return self.raw_filedata(draw)
            from gradio_client import handle_file

            what = draw.choice(["hostile checkpoint", "text file", "checkpoint"])
            if what == "hostile checkpoint":
                path, label, _ = self.files.hostile(draw)
            elif what == "text file":
                path, label = self.files.text(draw)
            else:
                path, label, _ = self.files.checkpoint(draw)
            return handle_file(str(path)), label
        label, value = draw.choice(JUNK)
        return value, label

    def raw_filedata(self, draw) -> tuple[Any, str]:
        """FileData naming a server path nobody uploaded, or a file the server served to a session."""
        if self.served and draw.chance(0.4):
            f, name = draw.choice(self.served), draw.choice(["x.safetensors", "x.txt"])
            return ({"path": f["path"], "meta": FILEDATA_META, "orig_name": name},
                    f"a served file's path, named {name!r}")
        p = draw.choice(SERVER_PATHS)
        fd = {"path": p, "meta": FILEDATA_META}
        if p.startswith("http"):
            fd = {"path": "x.safetensors", "url": p, "meta": FILEDATA_META}
        return fd, f"FileData naming {p!r}"

    def junk_value(self, draw, raw: bool) -> tuple[Any, str]:
        label, value = draw.choice(JUNK + (RAW_JUNK if raw else []))
        return value, label

    def build(self, ep: Endpoint, draw, mode: str | None = None, transport: str | None = None) -> Call:
        """A call of `ep`: all valid, one argument bad, or every argument from anywhere."""
        mode = mode or draw.choice(["valid", "valid", "valid", "one-bad", "one-bad", "one-bad", "chaos"])
        raw = transport == "raw" or (transport is None and draw.chance(0.12))
        call = Call(ep.name, [], "raw" if raw else "client", mode,
                    timeout=TRAIN_TIMEOUT_S if ep.name.endswith("train") else CALL_TIMEOUT_S)
        ctx: dict = {}
        if any(p.name == "model_name" for p in ep.params):
            t = self.know.text
            if t and t.get("model_name") in self.know.models and draw.chance(0.5):
                ctx["model"] = t["model_name"]
            else:
                ctx["model"] = draw.choice(sorted(self.know.models))
            ctx["info"] = self.know.models[ctx["model"]]
        elif self.know.text and self.know.text.get("model_name") in self.know.models:
            ctx["info"] = self.know.models[self.know.text["model_name"]]
        bad = draw.index(len(ep.params)) if mode == "one-bad" and ep.params else -1
        notes = []
        for i, p in enumerate(ep.params):
            if mode == "chaos":
                kind = draw.choice(["valid", "edge", "junk"])
            else:
                kind = "valid" if i != bad else draw.choice(["edge", "edge", "junk"])
            if kind == "valid":
                v = self.valid_value(p, draw, call, ctx)
                if p.name == "prompt" and self.know.text and self.know.text.get("model_name") == ctx.get("model") \
                        and draw.chance(0.6):
                    v = self.know.text["prompt"]  # continue the current text more often than not
                if p.name == "seed" and self.know.text and draw.chance(0.6):
                    v = self.know.text["seed"]
            elif kind == "edge":
                v, label = self.edge_value(p, draw, raw)
                notes.append(f"{p.name}: {label}")
            else:
                v, label = self.junk_value(draw, raw)
                notes.append(f"{p.name}: {label}")
            call.args.append(v)
        if raw and draw.chance(0.05):  # the wrong number of arguments
            if call.args and draw.chance(0.5):
                call.args.pop()
                notes.append("one argument too few")
            else:
                call.args.append(0)
                notes.append("one argument too many")
        if raw and any(isinstance(a, dict) and str(a.get("path", "")).startswith(str(self.workdir)) for a in call.args):
            call.transport = "client"  # a local file needs gradio_client to upload it
        if not raw and not client_can_send(call.args):
            call.transport = "raw"
        for a in call.args:
            if isinstance(a, dict) and any(a.get("path") == f["path"] for f in self.served):
                call.served.append(next(f for f in self.served if f["path"] == a.get("path")))
                call.replay = False
        call.note = "; ".join(filter(None, [*notes, call.note]))
        return call

    # -- one call, checked
