"""The values the fuzzer sends: hostile and wrong-typed ones for any argument, what only a hand-made
request can carry, valid training texts and seeds, the app's own ranges, and the source of every
choice (`RandomDraw`: random.Random here, hypothesis in tests/api/test_fuzz.py)."""

from __future__ import annotations

import random
from typing import Any

from lab.catalogue.models import ASSETS
from lab.limits import (
    MAX_NEW_TOKENS, SEED_RANGE, TEMPERATURE_RANGE, TEXT_CHARS, TOP_K_RANGE, TOP_P_RANGE, TRAIN_LIMITS,
)
from tests.support.server import ROOT

HUGE = 10**400


class RawJSON:
    """A piece of JSON text spliced into a hand-made request as is (e.g. 5,000-deep nesting)."""

    def __init__(self, text: str, label: str):
        self.text, self.label = text, label

    def __repr__(self) -> str:
        return f"<json {self.label}>"


def nested(depth: int) -> list:
    x: list = []
    for _ in range(depth):
        x = [x]
    return x


FILEDATA_META = {"_type": "gradio.FileData"}
# Wrong types and hostile values for any argument, all JSON that gradio_client can send.
JUNK: list[tuple[str, Any]] = [
    ("None", None), ("True", True), ("False", False), ("0", 0), ("-1", -1), ("0.5", 0.5), ("2.5", 2.5),
    ("10**400", HUGE), ("-10**400", -HUGE), ("2**63", 2**63), ("1e308", 1e308), ("-1e308", -1e308),
    ("5e-324", 5e-324), ("-0.0", -0.0),
    ("''", ""), ("'   '", "   "), ("'1'", "1"), ("'0.5'", "0.5"), ("'1e400'", "1e400"), ("'nan'", "nan"),
    ("'-inf'", "-inf"), ("arabic-indic 3", "\u0663"), ("'1_0'", "1_0"), ("'0x10'", "0x10"),
    ("[]", []), ("[1, 2]", [1, 2]), ("[[['x']]]", [[["x"]]]), ("{}", {}), ("{'a': 1}", {"a": 1}),
    ("gradio update dict", {"__type__": "update", "value": 0}), ("200-deep list", nested(200)),
    ("10k chars", "x" * 10_000), ("NUL", "\x00"), ("lone surrogate", "\ud800"), ("RTL override", "\u202egnp.exe"),
    ("emoji ZWJ", "\U0001f469\u200d\U0001f469\u200d\U0001f467"), ("format string", "{0} %s %n {__class__}"),
    ("html", "<script>alert(1)</script>"), ("relative path", "../../../../etc/passwd"),
    ("absolute path", "/etc/passwd"), ("windows path", "C:\\Windows\\win.ini"),
    ("FileData /etc/passwd (client uploads its own copy)", {"path": "/etc/passwd", "meta": FILEDATA_META}),
]
# What only a hand-made request can carry.
RAW_JUNK: list[tuple[str, Any]] = [
    ("NaN", float("nan")), ("Infinity", float("inf")), ("-Infinity", float("-inf")),
    ("5000-deep list", RawJSON("[" * 5000 + "]" * 5000, "5000-deep list")),
]
# FileData naming files on the server that nobody uploaded (hand-made requests only).
SERVER_PATHS = ["/etc/passwd", str(ROOT / "app.py"), "app.py", str(ASSETS / "sort.safetensors"),
                "../../../../etc/passwd", "/proc/self/environ", "/dev/zero", "", "http://127.0.0.1:9/x.safetensors",
                "/tmp"]

_LINE = ("the cat sat on the mat . the dog ran to the park and the bird sang in the tree . "
         "a girl read a book while a boy played with a ball near the river . ")
TEXT = _LINE * (TEXT_CHARS[0] // len(_LINE) + 1)  # a training text just over the shortest allowed
# example prompts of a model trained on each corpus (the learned ones from /select_model win)
CORPUS_PROMPTS = {"sort": "503124=", "copy": "hcbpadlk|", "toy": "how is living in amsterdam <EOS>",
                  "grammar": "anna found the key . she", "text": "the cat sat on the"}
SEEDS = [0, 1, 2, 3, 42, 2**31 - 1]

# The app's own knowledge of its numbers (lab.limits), by parameter name; the API's declared
# range narrows them (e.g. the Steps slider starts at 10 while the lab accepts 1).
LIMITS: dict[str, tuple[float, float]] = {
    "temperature": TEMPERATURE_RANGE, "top_k": TOP_K_RANGE, "top_p": TOP_P_RANGE, "seed": SEED_RANGE,
    "max_new": (1, MAX_NEW_TOKENS), "layers": TRAIN_LIMITS["layers"], "heads": TRAIN_LIMITS["heads"],
    "d_model": TRAIN_LIMITS["d_model"], "d_ff": TRAIN_LIMITS["d_ff"], "dropout": TRAIN_LIMITS["dropout"],
    "steps": TRAIN_LIMITS["steps"], "lr": TRAIN_LIMITS["learning rate"],
}
INTEGERS = {"top_k", "seed", "max_new", "layers", "heads", "d_model", "d_ff", "steps", "layer"}
# Valid training settings are kept tiny so that a run takes well under a second.
TINY = {"layers": [1, 2], "heads": [1, 2], "d_model": [8, 16], "d_ff": [0, 16, 32], "dropout": [0.0, 0.1],
        "lr": [1e-3, 3e-3, 0.01]}


class RandomDraw:
    """The fuzzer's source of choices: random.Random here, hypothesis in tests/api/test_fuzz.py."""

    def __init__(self, rng: random.Random):
        self.rng = rng

    def index(self, n: int) -> int:
        return self.rng.randrange(n)

    def uniform(self, lo: float, hi: float) -> float:
        return self.rng.uniform(lo, hi)

    def choice(self, seq):
        seq = list(seq)
        return seq[self.index(len(seq))]

    def chance(self, p: float) -> bool:
        return self.index(1000) < p * 1000

    def integer(self, lo: int, hi: int) -> int:
        return lo + self.index(hi - lo + 1)
