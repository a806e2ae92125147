"""Every option list and limit of the lab, stated once.

The dropdowns and sliders in app.py, the checks in lab/, the concurrency settings of the
server and the README's Limits table all read this module (a test holds the README to
`limits_table()`). Option lists that belong to the engine (positional encodings, norms,
activations, tokenizers) or to the figures (attention views and kinds) are defined there and only
re-exported here, so there is still one home for each.
"""

from __future__ import annotations

import os

from model.checkpoint import DEFAULT_LIMITS as CHECKPOINT_LIMITS
from model.config import ACTIVATIONS, NORMS, POS_ENCODINGS
from model.corpora import MAX_TEXT_CHARS, MIN_TEXT_CHARS
from model.film import FILM_FRAMES, MAX_FILM_FRAMES, MAX_PROBE_TOKENS
from model.heads import MATCH_FORMULA, ROLES as HEAD_ROLES
from model.generate import SEED_RANGE, TEMPERATURE_RANGE, TOP_P_RANGE
from model.tokenizers import TOKENIZER_KINDS
from viz import ATTENTION_KINDS, ATTENTION_VIEWS, COLOUR_MODES, OVERVIEW_MAX_T

__all__ = [
    "ACTIVATIONS", "ATTENTION_KINDS", "ATTENTION_VIEWS", "CHECKPOINT_LIMITS", "COLOUR_MODES", "FILM_FRAMES",
    "HEAD_ROLES", "MATCH_FORMULA", "MAX_PROBE_TOKENS", "NORMS", "POS_ENCODINGS", "TOKENIZER_KINDS",
    "MAX_PROMPT_CHARS", "MAX_NEW_TOKENS", "MAX_USER_MODELS", "OVERVIEW_MAX_TOKENS",
    "TEMPERATURE_RANGE", "TOP_K_RANGE", "TOP_P_RANGE", "SEED_RANGE", "TRAIN_LIMITS", "TRAIN_CORPORA",
    "TRAIN_MAX_SECONDS", "STOP_WAIT_S", "TEXT_CHARS", "UPLOAD_MAX_MB", "STATE_TTL_S", "SESSION_CAPACITY", "QUEUE_SIZE",
    "CONCURRENCY", "RUN_FILES_MAX_AGE_S", "limits_table",
]

# ---------------------------------------------------------------------------- Explore
MAX_PROMPT_CHARS = 2000
# From this many heads (layers × heads) a model opens on one head and the compact head-roles map of every head
# (lab.catalogue.models.many_heads); viz.heads.COMPACT_HEADS, where the maps turn compact, is the same number
MANY_HEADS = 1024
MAX_NEW_TOKENS = 256  # per Generate, and generated tokens per text
OVERVIEW_MAX_TOKENS = OVERVIEW_MAX_T  # the all-layers view draws n_layers × n_heads panels (viz's bound)
TOP_K_RANGE = (0, 50)  # 0 = off

# ------------------------------------------------------------------------------ Train
# The Train form: inclusive (low, high) of every number a person sets, whatever the client sends.
TRAIN_LIMITS = {
    "layers": (1, 4),
    "heads": (1, 4),
    "d_model": (8, 128),
    "d_ff": (0, 512),
    "steps": (1, int(os.environ.get("DECODER_LAB_MAX_STEPS", "2000"))),  # a test raises it: a run that cannot end
    "learning rate": (1e-5, 0.1),
    "dropout": (0.0, 0.5),
    "seed": SEED_RANGE,
}
TRAIN_MAX_SECONDS = float(os.environ.get("DECODER_LAB_TRAIN_SECONDS", "180"))
STOP_WAIT_S = 30.0  # Stop answers with the status the run ends with if it ends this soon (its next step, then the save)
TEXT_CHARS = (MIN_TEXT_CHARS, MAX_TEXT_CHARS)
# corpus name (the engine's) → what the dropdown says and the line under it
TRAIN_CORPORA = {
    "grammar": ("Generated English (names, pronouns)",
                "Generated English mini-stories where later pronouns (she/he/her/him/his) refer back to names."),
    "sort": ("Sort six digits", "Sort six random digits: '503124=012345'. Loss only on the sorted answer."),
    "copy": ("Copy a random sequence (induction)",
             "Induction: repeat eight random letters after '|': 'hcbpadlk|hcbpadlk'. Loss only on the copy."),
    "toy": ("Article toy (7 words)", "The seven-word Amsterdam example of article 001: two hand-written sequences."),
    "text": ("My own text (paste or upload)",
             f"Your own UTF-8 text ({MIN_TEXT_CHARS:,} to {MAX_TEXT_CHARS:,} characters), split 90/10 by position."),
}

# --------------------------------------------------------------------------- Sessions
MAX_USER_MODELS = 3  # a person's own (trained or uploaded) models; the oldest goes first
UPLOAD_MAX_MB = CHECKPOINT_LIMITS.max_file_bytes // 2**20  # the checkpoint loader's own bound
STATE_TTL_S = float(os.environ.get("DECODER_LAB_STATE_TTL", "1800"))
# "stored": added models whose files hold bfloat16 or float16 weights keep them so (half of float32's memory:
# a 1B model in about 2.5 GB), computing as transformers does in that dtype; "float32" (default): exact float32
WEIGHTS_DTYPE = os.environ.get("DECODER_LAB_WEIGHTS", "float32")
# gradio's own copies of session state (~135 KB each); lab.server.sessionstore keeps the sessions
SESSION_CAPACITY = 2000
QUEUE_SIZE = int(os.environ.get("DECODER_LAB_QUEUE", "32"))
RUN_FILES_MAX_AGE_S = 3600  # downloadable model files of a session
# concurrency_limit of each lane of the queue (ui/lanes.py puts every event in one; one training at a time: it
# takes a whole core; patch: lab/patching.py sweeps; replay: session files opened, never behind another address's)
CONCURRENCY = {"explore": 4, "generate": 2, "train": 1, "upload": 2, "patch": 1, "tools": 2, "film": 2, "export": 2,
               "page": 4, "replay": 8}

# ------------------------------ Server-wide budgets (lab/server/: budget.py, rates.py, sessionstore.py)
# What one visitor may take of what everyone shares. A client is its address (an IPv6 address
# counts by its /64); behind a proxy (a Hugging Face Space) the address the proxy forwarded.
# Rates are token buckets: action → (burst, count, window_s): `burst` at once, then `count` per
# `window_s` seconds. A person never comes near them; a script is told to slow down.
_UPLOAD_BYTES = int(os.environ.get("DECODER_LAB_CLIENT_UPLOAD_MB", str(5 * UPLOAD_MAX_MB))) * 2**20
RATE_LIMITS = {
    "session": (60, 60, 60.0),  # new sessions (page loads, API clients): a classroom behind one address fits
    "generate": (20, 30, 60.0),
    "patch": (10, 10, 60.0),  # activation-patching sweeps (lab/patching.py): seconds of CPU each on a GPT-2
    "train": (5, 10, 600.0),
    "upload": (5, 10, 600.0),
    "import": (5, 10, 600.0),  # session files opened
    "export": (20, 30, 60.0),  # files made: session files, numbers, web pages
    # CPU of replays, in Steps (a Step, an Undo or a generated token each): a session file or a link's steps
    # are paid before the replay starts; two of the longest session files at once, then one per 10 min
    "replay": (2 * 4 * 256, 4 * 256, 600.0),
    # bytes sent to /gradio_api/upload (files land in gradio's cache, outside the disk budget): five of the
    # largest files at once, then as many again per hour
    "upload_bytes": (_UPLOAD_BYTES, _UPLOAD_BYTES, 3600.0),
}
# DECODER_LAB_RATE_SCALE multiplies every burst and count (a test suite calls from one address all along)
_RATE_SCALE = max(1, int(os.environ.get("DECODER_LAB_RATE_SCALE", "1")))
# DECODER_LAB_RATE_WINDOW_SCALE multiplies every window: a test server started with 1000 refills its buckets
# (almost) never, so what a test counts does not depend on how fast the machine answers
_WINDOW_SCALE = max(1.0, float(os.environ.get("DECODER_LAB_RATE_WINDOW_SCALE", "1")))
RATE_LIMITS = {a: (b * _RATE_SCALE, c * _RATE_SCALE, w * _WINDOW_SCALE) for a, (b, c, w) in RATE_LIMITS.items()}
RATE_MAX_KEYS = 10_000  # (client, action) buckets remembered; the least recently used is forgotten
# Trust X-Forwarded-For only behind a proxy that sets it (Spaces set SPACE_ID); otherwise anyone could forge it.
BEHIND_PROXY = bool(os.environ.get("SPACE_ID")) or os.environ.get("DECODER_LAB_BEHIND_PROXY", "") == "1"
IDLE_S = float(os.environ.get("DECODER_LAB_IDLE_S", "300"))  # a session that acted in the last IDLE_S seconds (or is acting, or training) loses nothing to others
# sessions kept (lab.server.sessionstore.SessionStore); a text holds up to ~6 MB
MAX_SESSIONS = int(os.environ.get("DECODER_LAB_MAX_SESSIONS", "500"))
# memory held by all sessions together: their own models and their texts' attention (which grows as T²)
MEMORY_MAX_BYTES = int(os.environ.get("DECODER_LAB_MEMORY_MB", "4096")) * 2**20
# texts that keep their attention, cache and distributions in memory (lab/server/warm.py): the least recently
# used beyond this drop them and compute them again when used (a GPT-2 text of 64 tokens holds ~13 MB)
WARM_MAX_BYTES = int(os.environ.get("DECODER_LAB_WARM_MB", "128")) * 2**20
RUN_FILES_MAX_BYTES = int(os.environ.get("DECODER_LAB_FILES_MB", "1024")) * 2**20  # all sessions' model files
RUN_FILES_SESSION_MAX_BYTES = MAX_USER_MODELS * CHECKPOINT_LIMITS.max_file_bytes  # one session's files
__all__ += ["RATE_LIMITS", "RATE_MAX_KEYS", "BEHIND_PROXY", "IDLE_S", "MAX_SESSIONS", "MEMORY_MAX_BYTES",
            "WARM_MAX_BYTES", "RUN_FILES_MAX_BYTES", "RUN_FILES_SESSION_MAX_BYTES"]

# ---------------------------- Per-address shares (lab/server/budget.py, lab/server/sessionstore.py, ui/http.py)
# What one address may hold of each shared resource, counted when work is admitted. Generous enough for
# a class of thirty behind one school address; small enough that one address leaves the rest to others.
# Scaled as the rates are (never past the whole): a test suite's shared server sees one address all along.
def _share(name: str, whole: int, part: int) -> int:
    return int(os.environ.get(name, str(max(1, min(whole, (whole // part) * _RATE_SCALE)))))


CLIENT_SESSIONS = _share("DECODER_LAB_CLIENT_SESSIONS", MAX_SESSIONS, 8)
CLIENT_MEMORY_BYTES = _share("DECODER_LAB_CLIENT_MEMORY_MB", MEMORY_MAX_BYTES // 2**20, 4) * 2**20
CLIENT_FILES_BYTES = _share("DECODER_LAB_CLIENT_FILES_MB", RUN_FILES_MAX_BYTES // 2**20, 4) * 2**20
CLIENT_QUEUE = _share("DECODER_LAB_CLIENT_QUEUE", QUEUE_SIZE, 4)  # calls waiting or running
# long calls waiting or running per address, by kind: a training, and a replay (a session file opened or a
# link with steps); another visitor's call of that kind waits behind at most this many of one address's
# (scaled as the rates are: a test suite calls from one address all along)
CLIENT_LONG_CALLS = {"train": int(os.environ.get("DECODER_LAB_CLIENT_TRAININGS", str(_RATE_SCALE))),
                     "replay": int(os.environ.get("DECODER_LAB_CLIENT_REPLAYS", str(_RATE_SCALE)))}
# bytes of warm texts (lab/server/warm.py) of one address: past the bound, an address over this share cools its
# own first
CLIENT_WARM_BYTES = _share("DECODER_LAB_CLIENT_WARM_MB", WARM_MAX_BYTES // 2**20, 4) * 2**20
# calls of one address in gradio's queue at once, waiting or running, besides its trainings: its further calls
# wait at the door (ui/door.py), holding no worker, so one address keeps at most this many workers busy
CLIENT_WORKERS = int(os.environ.get("DECODER_LAB_CLIENT_WORKERS", str(_RATE_SCALE)))
__all__ += ["CLIENT_SESSIONS", "CLIENT_MEMORY_BYTES", "CLIENT_FILES_BYTES", "CLIENT_QUEUE", "CLIENT_LONG_CALLS",
            "CLIENT_WORKERS", "CLIENT_WARM_BYTES"]


MAX_LOG = 4 * MAX_NEW_TOKENS  # actions (Step, Generate, Undo) a text's log keeps: a session file replays them


def _num(x: float) -> str:
    return f"{x:g}"


def limits_table() -> list[str]:
    """The README's Limits table, row by row, as this module states it."""
    t, p, k, s = TEMPERATURE_RANGE, TOP_P_RANGE, TOP_K_RANGE, SEED_RANGE
    L = TRAIN_LIMITS
    c = CHECKPOINT_LIMITS
    return [
        "| what | limit |",
        "|---|---|",
        f"| prompt | 1–{MAX_PROMPT_CHARS} characters; longer than the model's context keeps its last tokens, "
        "with a notice |",
        f"| new tokens | 1–{MAX_NEW_TOKENS} per Generate, {MAX_NEW_TOKENS} per text |",
        f"| sampling | temperature {_num(t[0])}–{_num(t[1])} (0 = greedy), top-k {k[0]}–{k[1]}, "
        f"top-p {_num(p[0])}–{_num(p[1])}, seed {s[0]}–2³¹−1 |",
        f"| all-layers view | ≤ {OVERVIEW_MAX_TOKENS} tokens |",
        f"| training | ≤ {L['layers'][1]} layers, ≤ {L['heads'][1]} heads, d_model {L['d_model'][0]}–{L['d_model'][1]}, "
        f"d_ff ≤ {L['d_ff'][1]}, ≤ {L['steps'][1]} steps, learning rate {_num(L['learning rate'][0])}–"
        f"{_num(L['learning rate'][1])}, dropout ≤ {_num(L['dropout'][1])}, ≤ {_num(TRAIN_MAX_SECONDS)} s wall clock, "
        "one training at a time |",
        f"| training text | {TEXT_CHARS[0]:,} – {TEXT_CHARS[1]:,} characters of UTF-8 |",
        f"| training film | {FILM_FRAMES} frames per training (≤ {MAX_FILM_FRAMES} in a file), probe prompt ≤ "
        f"{MAX_PROBE_TOKENS} tokens |",
        f"| uploads | {UPLOAD_MAX_MB} MB; checkpoints ≤ {c.max_layers} layers, ≤ {c.max_heads} heads, "
        f"d_model ≤ {c.max_d_model}, context ≤ {c.max_block_size}, vocabulary ≤ {c.max_vocab:,}, "
        f"≤ {c.max_params:,} parameters |",
        f"| session files | ≤ {UPLOAD_MAX_MB} MB (an own model's weights travel inside); a text of ≤ {MAX_LOG} "
        f"actions (Step, Generate, Undo); a built-in's text of {MAX_NEW_TOKENS} tokens ≈ 13 KB made Step by Step, "
        "≈ 1 KB by one Generate |",
        f"| sessions | state expires after {_num(STATE_TTL_S / 60)} min idle; at most {MAX_SESSIONS} sessions kept; "
        f"≤ {MAX_USER_MODELS} own models per session; queue of {QUEUE_SIZE} |",
        *budget_rows(),
    ]


# ------------------------------------------------ Server-wide budgets: their README rows
_RATE_WHAT = {"session": "new sessions", "generate": "Generate", "patch": "patching sweeps", "train": "trainings",
              "upload": "uploads", "import": "session files opened", "export": "files made", "replay": "Steps replayed",
              "upload_bytes": "MB uploaded"}
_RATE_UNIT = {"upload_bytes": 2**20}  # what a bucket counts in, as the table states it (bytes as MB)


def _window(seconds: float) -> str:
    if seconds == 60:
        return "minute"
    return f"{_num(seconds / 60)} min" if seconds > 60 else f"{_num(seconds)} s"


def budget_rows() -> list[str]:
    """The Limits rows of the shared guards, lab/server/rates.py, lab/server/sessionstore.py and
    lab/server/budget.py (the last rows of `limits_table()`)."""
    unit = {a: _RATE_UNIT.get(a, 1) for a in RATE_LIMITS}
    rates = "; ".join(f"{_RATE_WHAT[a]} {b // unit[a]} at once, then {c // unit[a]} per {_window(w)}"
                      for a, (b, c, w) in RATE_LIMITS.items())
    mb = 2**20
    return [
        f"| per address | {rates} |",
        f"| whole server | own models and texts ≤ {MEMORY_MAX_BYTES // mb:,} MB of memory, model files ≤ "
        f"{RUN_FILES_MAX_BYTES // mb:,} MB of disk (≤ {RUN_FILES_SESSION_MAX_BYTES // mb} MB per session), "
        f"≤ {MAX_SESSIONS} sessions; when full, the least recently used idle session's go first, and a session "
        f"that acted in the last {_num(IDLE_S / 60)} min loses nothing |",
        f"| one address's share | ≤ {CLIENT_SESSIONS} sessions, ≤ {CLIENT_MEMORY_BYTES // mb:,} MB of own models and "
        f"texts, ≤ {CLIENT_FILES_BYTES // mb:,} MB of files, ≤ {CLIENT_WARM_BYTES // mb:,} MB of texts kept warm "
        f"before its own cool first, ≤ {CLIENT_QUEUE} calls waiting or running, of them ≤ "
        f"{CLIENT_LONG_CALLS['train']} training and ≤ {CLIENT_LONG_CALLS['replay']} replay (a session file or a link "
        f"with steps, its Steps and its model's work paid before it runs) and ≤ {CLIENT_WORKERS} in the queue at once "
        "besides its training (the others wait at the door, holding no worker); past it, the address's own idle "
        "sessions make room, never another address's, and calls are refused when they join the queue |",
    ]
