"""Opening one attention cell on the server (issue 29's cell view): the API handler `ui.inside_api.inside`
in process, one torch thread (as the app runs), on a text of T = 64 tokens, and its JSON.

Two models: the grammar built-in (target ≤ 30 ms) and GPT-2 small with random weights (bench.real_app's
folder, opened as the app opens --model folders; target ≤ 60 ms). For each, per round a new session
Steps a 63-token prompt (the text then holds 64), then:

* first_cell: the first cell of that text (the query's and the key's residual streams carried up from
  the decoder's key/value cache through the layers below, each layer checked against the decoder's
  attention; every number with its formula) and its JSON (orjson, as gradio's responses are encoded);
* next_cell: another cell of the same text, the same work;
* head: the head as matrices (lab.inside.head: every position carried up once, kept for the text) and
  its JSON;
* cell_after_head: a cell once the text's layer inputs are kept (one layer rebuilt);
* forward: the model's own forward over the 64 tokens, timed in the same round: the machine's speed
  at that moment (this machine is shared and loaded; compare the rows with it).

The cell is in the last layer, head 0, query = the last token, key = a different earlier token each time.

    python -m bench.inside [--reps 15] [--skip gpt2]
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import orjson
import torch

from bench.common import Timer, emit, grammar_prompt, parser, summary
from bench.real_models import cpu_model

T = 64
TARGETS_MS = {"grammar (built-in)": 30.0, "gpt2": 60.0}


def measure(name: str, entry, reps: int) -> dict:
    from lab import inside as lab_inside
    from lab.session import Session
    from model.generate import Sampling
    from ui.inside_api import inside

    layer = entry.model.cfg.n_layers - 1
    rows = {"first_cell": [], "next_cell": [], "head": [], "cell_after_head": [], "forward": []}
    for r in range(3 + reps):  # three warm-up rounds
        s = Session()
        s.step(name, grammar_prompt(entry.tokenizer, T - 1, offset=41 * r), Sampling(temperature=0.0))
        assert len(s.decoder.window) == T
        with Timer() as first:
            orjson.dumps(inside(s, layer, 0, T - 1, r % T))
        with Timer() as nxt:
            orjson.dumps(inside(s, layer, 0, T - 1, (r + 7) % T))
        with Timer() as head:
            orjson.dumps(lab_inside.head(s.text, s.heads.settings, layer, 0))
        with Timer() as after:
            orjson.dumps(inside(s, layer, 0, T - 1, (r + 11) % T))
        with torch.inference_mode(), Timer() as forward:
            entry.model(torch.tensor([s.decoder.window]))
        s.close()
        if r >= 3:
            for k, t in (("first_cell", first), ("next_cell", nxt), ("head", head), ("cell_after_head", after),
                         ("forward", forward)):
                rows[k].append(t.s)
    return {k: summary(v) for k, v in rows.items()}


def main() -> None:
    p = parser("inside", __doc__)
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--skip", default="", help="'gpt2' leaves GPT-2 out")
    args = p.parse_args()
    torch.set_num_threads(1)
    from lab.catalogue.models import BUILTINS

    runs = [("grammar (built-in)", lambda: ("grammar (built-in)", BUILTINS.get("grammar (built-in)")))]
    tmp = tempfile.TemporaryDirectory()
    if "gpt2" not in args.skip:
        def gpt2():
            from bench.real_app import build_gpt2
            from lab.catalogue.external import EXTERNAL, HashRecord, parse_source

            folder = Path(tmp.name) / "gpt2"
            build_gpt2(folder)
            EXTERNAL.record = HashRecord(Path(tmp.name) / "hashes.json")
            EXTERNAL.configure([parse_source(str(folder))])
            return EXTERNAL.names[0], EXTERNAL.get(EXTERNAL.names[0])
        runs.append(("gpt2", gpt2))
    with tmp:
        for key, opened in runs:
            name, entry = opened()
            ms = measure(name, entry, args.reps)
            target = TARGETS_MS[key]
            emit("inside", model=entry.summary, T=T, ms=ms, target_ms=target,
                 met={k: ms[k]["median"] <= target for k in ("first_cell", "next_cell", "cell_after_head")},
                 cpu=cpu_model(), threads=1)


if __name__ == "__main__":
    main()
