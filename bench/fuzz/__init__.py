"""Stateful fuzzer of the app's public API: every endpoint, any value for any argument, in any order.

    python -m bench.fuzz                          # 10,000 calls against its own server (tests/ROBUSTNESS.md: a run)
    python -m bench.fuzz --calls 2000 --seed 7
    python -m bench.fuzz --url http://127.0.0.1:7860/ --log app.log   # an app you started (--log: its output)

The endpoints and their parameters are read from the running app (`Client.view_api`), so an
endpoint added later is fuzzed with no change here. Each argument gets a valid value (from the
parameter's choices, examples and range, narrowed by lab.limits, and coherent with the model the
call names), an edge value of the right type (bounds, just past them, 10**400, 2**63, 2.5 for a
whole number, NaN and ±inf), or a value of the wrong type (None, lists, dicts, 200-deep nesting,
long strings, lone surrogates, FileData-shaped dicts). Calls go through gradio_client, or as
hand-made HTTP (`POST /gradio_api/call/<name>` with the same session hash) for what the client
cannot send: NaN and infinity (JSON has no literal for them; gradio_client refuses them before
sending), 5,000-deep nesting, FileData naming server paths, the wrong number of arguments.
Uploads: a valid tiny checkpoint, checkpoints whose tokenizer, config or meta JSON is mutated
(padding, pad ids, normalizers, backtracking regexes, huge tokens, unknown keys, wrong types,
random tree edits) and hostile text files for training.

How "a refusal changes nothing" is checked: twin sessions. Every call goes to session A; every
call that succeeds on A is replayed on session B, which never sees the refused calls, and both
answers must be equal (file paths and timings masked). A refused call that changed A shows as a
difference at A's next success; after each refusal the fuzzer often sends such a success at once
(a probe: a Step that continues the current text with random sampling, or an Undo), so the
refusal to blame is the one just before. After a difference or a hang the pair starts afresh.

Outcome of each call:
  ok             it succeeded
  refused-clean  refused with a clear message
  refused-leaky  refused, but the message carries a file path, a Python type or exception name, a
                 traceback, a cache hash, or is over 400 characters (what the caller sent is not a leak)
  unexpected     the generic error (gradio's "error": null, or "Something went wrong"), an HTTP
                 error, or the client failing
  state-changed  a refused call changed the session (the twin differs), or a call deleted a file the
                 server had served to a session
  hang           no answer within the time limit
Every Python traceback the server prints is read from its log right after the call, and every
defect (each class but ok and refused-clean, and each kind of traceback) is counted by kind with
one example: the call (endpoint, arguments, transport) and what came back. Each kind says whose
code it is ("app": app.py, lab/, model/, viz/; "gradio": gradio's preprocessing or routing, before
any handler runs) and how it is reached ("client": gradio_client can send it; "raw-http": only a
hand-made request). tests/api/test_fuzz.py runs the same machinery, bounded, under hypothesis.

The modules, in the order a call meets them: `values` (what may be sent, and `RandomDraw`, the
source of every choice), `files` (checkpoints and texts to upload), `generators` (a call of an
endpoint: valid, one argument bad, or chaos), `calls` (the endpoints `view_api()` lists; sending a
call through gradio_client or as hand-made HTTP), `checks` (leaks in a message; twin answers
compared), `log` (the server's tracebacks), `knowledge` (the twins' models and text), `report` (the
tally), `fuzzer` (`Fuzzer`: one checked call, and the mix of actions); `__main__` runs it.
"""

from .checks import leaks, shorten
from .fuzzer import Fuzzer
from .knowledge import BUILTINS
from .log import LogWatch
from .values import RandomDraw

__all__ = ["BUILTINS", "Fuzzer", "LogWatch", "RandomDraw", "leaks", "shorten"]  # what tests/api/test_fuzz.py drives it with
