"""A class on one server: N learners at once, each doing a lesson with think time; what each click costs them.

    python -m bench.classroom                              # 30 learners, own addresses, default model then GPT-2
    python -m bench.classroom --one-address                # the same class behind one address (a school's NAT)
    python -m bench.classroom --learners 3 --rounds 1 --think 0.2,0.5 --models default   # a smoke run
    python -m bench.classroom --one-address --env DECODER_LAB_RATE_SCALE=30   # with an operator's setting

For each model (`--models`: the built-in default, and a folder of GPT-2 small's shape with random weights,
tests/support/gpt2_small.py, added with `python app.py --model FOLDER`), this starts the app
(tests.support.server.AppServer: `python app.py` on a free loopback port) with its real per-address
shares and rates (`DECODER_LAB_RATE_SCALE=1`, not the tests' 1000; `--env` adds settings), has the
teacher's machine (127.0.0.1) load the model with one Step, then lets `--learners` learners in, each a
gradio_client Client (one server session) from its own loopback address, 127.0.0.2, 127.0.0.3, … (or
all from 127.0.0.2 with `--one-address`; bench/classroom_clients.py says how).

Each learner opens the page at a random moment of its first think, then does a lesson `--rounds` times
(or until `--duration` seconds have passed), thinking a random time in `--think` (seconds, from a
generator seeded by `--seed` and the learner's number) before every click:

    select   the model chosen in the menu (/select_model)
    step     Step ×10 on the learner's own prompt (/step; the first one types the prompt)
    generate Generate 20 tokens (/generate)
    head     another layer and head opened (the page's Head menu: its change event, by number)
    inside   Inside one cell of that head (/inside, the selected token and its strongest key)
    patch    an activation-patching sweep over every head (/patch, two prompts of the same length)
    undo     Undo (/undo)

A refused call is counted by kind (the sentence's few words, bench/classroom_clients.py's KINDS) and
the lesson goes on; when the model ends a text (<EOS>) a new one starts (Reset, not timed). Per model,
one JSON line per action: its answer time (click → answer, wall ms: n, median = p50, p95, min, max),
three parts of it: the client's own work before it sends the call, the door's wait (the join request's
round trip: the address's and the session's turn) and the wait in gradio's queue (queued → started),
the largest queue rank gradio reported, errors and refusals by kind; then a summary: the teacher's
Steps alone before class (the same client's cost with nobody else on), the server process's peak
resident memory (VmHWM), its CPU seconds, this process's (the learners' clients share the machine),
the CPU, and the targets (Step p95 ≤ 1 s, 0 errors, memory ≤ 12 GB). bench/CLASSROOM.md says how to
read them.
"""

from __future__ import annotations

import json
import random
import resource
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import default_entry, emit, parser, summary
from bench.real_models import cpu_model
from tests.support.server import AppServer

STEPS = 10
NEW_TOKENS = 20
ACTIONS = ("open", "select", "step", "generate", "head", "inside", "patch", "undo")
TARGETS = {"step_p95_ms": 1000.0, "errors": 0, "memory_mb": 12 * 1024.0}
NAMES = ["anna", "tom", "lisa", "john", "sara", "paul", "emma", "mark", "maria", "david", "julia", "peter"]
PLACES = ["station", "garden", "market", "park", "library", "school", "kitchen"]
GPT2_FOLDER = "gpt2-small"


@dataclass(frozen=True)
class Model:
    """What a lesson needs of a model: its name in the menu, its layers and heads, a patching pair."""

    name: str
    layers: int
    heads: int
    patch: tuple[str, str, str, str]  # prompt A, prompt B (same length in tokens), answer, other answer


GRAMMAR_PATCH = ("anna found the key . she gave it to tom because he asked",
                 "tom found the key . he gave it to anna because she asked", " she", " he")


def default_model() -> Model:
    """The lesson's model for the app's default built-in (grammar): its sizes read from the lab."""
    from lab.catalogue.models import DEFAULT_MODEL

    cfg = default_entry().model.cfg
    return Model(DEFAULT_MODEL, cfg.n_layers, cfg.n_heads, GRAMMAR_PATCH)


def gpt2_model(folder: Path) -> Model:
    """The lesson's model for a Hugging Face folder added with --model (its name as the menu shows it)."""
    cfg = json.loads((folder / "config.json").read_text())
    return Model(f"{folder.name} (folder)", cfg.get("n_layer", cfg.get("num_hidden_layers")),
                 cfg.get("n_head", cfg.get("num_attention_heads")),
                 ("When Mary and John went to the store, John gave a drink to",
                  "When John and Mary went to the store, Mary gave a drink to", " Mary", " John"))


@dataclass
class Action:
    """One click of a lesson: which action, the endpoint (or "head": the Head menu), its arguments, the think
    time before it."""

    action: str
    api: str
    args: list = field(default_factory=list)
    think_s: float = 0.0


def prompt_for(rng: random.Random) -> str:
    """A learner's own prompt: words every built-in grammar text uses, so each model reads them."""
    a, b = rng.sample(NAMES, 2)
    return f"{a} met {b} at the {rng.choice(PLACES)} . {rng.choice(['she', 'he'])}"


def lesson(rng: random.Random, model: Model, think: tuple[float, float], seed: int) -> list[Action]:
    """One lesson's clicks, in order, with their think times, all drawn from `rng`."""
    def pause() -> float:
        return round(rng.uniform(*think), 3)

    prompt = prompt_for(rng)
    sampling = [model.name, prompt, 0.8, 0, 1.0, seed]
    first = [0, "all", "weights"]
    layer, head = rng.randrange(model.layers), rng.randrange(model.heads)
    a, b, yes, no = model.patch
    return [Action("select", "/select_model", [model.name], pause()),
            *(Action("step", "/step", [*sampling, *first], pause()) for _ in range(STEPS)),
            Action("generate", "/generate", [*sampling, NEW_TOKENS, *first], pause()),
            Action("head", "head", [model.name, layer, head, "weights"], pause()),
            Action("inside", "/inside", [layer, head, None, None], pause()),
            Action("patch", "/patch", [model.name, a, b, "logit_diff", yes, no, "heads", "denoising"], pause()),
            Action("undo", "/undo", [layer, head, "weights"], pause())]


def script(seed: int, learner: int, model: Model, think: tuple[float, float], rounds: int | None):
    """A learner's whole class, (round, Action) after (round, Action): the page opened during its first think,
    then `rounds` lessons (None: lessons without end, for a class that lasts a time).

    The same seed, learner and model give the same clicks and think times."""
    rng = random.Random(f"{seed}:{learner}")
    yield 0, Action("open", "", [], round(rng.uniform(0, think[1]), 3))
    r = 0
    while rounds is None or r < rounds:
        for act in lesson(rng, model, think, seed * 1_000_003 + learner * 1_000 + r):
            yield r, act
        r += 1


def addresses(learners: int, one_address: bool) -> list[str]:
    """Each learner's loopback address: its own (127.0.0.2 …), or 127.0.0.2 for all (one NAT)."""
    if learners > 250 * 256:
        raise ValueError("at most 64,000 learners have loopback addresses here")
    return ["127.0.0.2" if one_address else f"127.0.{(i + 2) // 256}.{(i + 2) % 256}" for i in range(learners)]


def action_rows(calls: list) -> list[dict]:
    """Per action, in lesson order: summaries (ms) of the answer time and of its client, door and queue parts, the
    largest queue rank, errors by kind.

    A call that ended a text (the model's <EOS>, a full text) is counted apart, not as an error."""
    from bench.classroom_clients import ENDED

    rows = []
    for name in ACTIONS:
        mine = [c for c in calls if c.action == name]
        if not mine:
            continue
        ok = [c for c in mine if c.outcome == "ok"]
        refusals: dict[str, int] = {}
        for c in mine:
            if c.outcome not in ("ok", *ENDED):
                refusals[c.outcome] = refusals.get(c.outcome, 0) + 1
        ranks = [c.rank for c in mine if c.rank is not None]
        rows.append({"action": name, "calls": len(mine), "answer_ms": summary([c.answer_s for c in ok]),
                     **{f"{part}_ms": summary([t for c in ok if (t := getattr(c, f"{part}_s")) is not None])
                        for part in ("client", "door", "queue")},
                     "queue_rank_max": max(ranks) if ranks else None, "errors": sum(refusals.values()),
                     "refusals": dict(sorted(refusals.items(), key=lambda kv: -kv[1])),
                     "texts_ended": sum(c.outcome in ENDED for c in mine)})
    return rows


def verdict(rows: list[dict], peak_mb: float | None) -> dict:
    """The targets, each with what was measured and whether it is met."""
    step = next((r for r in rows if r["action"] == "step"), None)
    p95 = step["answer_ms"].get("p95") if step else None
    errors = sum(r["errors"] for r in rows)
    return {"step_p95_ms": {"measured": p95, "target": TARGETS["step_p95_ms"],
                            "met": p95 is not None and p95 <= TARGETS["step_p95_ms"]},
            "errors": {"measured": errors, "target": TARGETS["errors"], "met": errors == TARGETS["errors"]},
            "memory_mb": {"measured": peak_mb, "target": TARGETS["memory_mb"],
                          "met": peak_mb is not None and peak_mb <= TARGETS["memory_mb"]}}


def proc_status(pid: int, key: str) -> float | None:
    """A /proc/PID/status field in MB (VmHWM: the peak resident memory; VmRSS: now), None once it has gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process (its threads together), from /proc/PID/stat."""
    import os

    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 2)


def own_cpu_seconds() -> float:
    use = resource.getrusage(resource.RUSAGE_SELF)
    return round(use.ru_utime + use.ru_stime, 2)


def warm_up(url: str, model: Model, steps: int = 5) -> tuple[float, dict]:
    """The teacher opens the model before class (127.0.0.1): a first Step loads its weights (seconds), then
    `steps` more Steps alone, the reference for the learners' (their summary in ms)."""
    from bench.classroom_clients import learner_client

    t0 = time.perf_counter()
    c = learner_client(url)
    step = [model.name, "anna met tom at the park .", 0.8, 0, 1.0, 0, 0, "all", "weights"]
    c.predict(model.name, api_name="/select_model")
    c.predict(*step, api_name="/step")
    first = round(time.perf_counter() - t0, 2)
    alone = []
    for _ in range(steps):
        t1 = time.perf_counter()
        c.predict(*step, api_name="/step")
        alone.append(time.perf_counter() - t1)
    c.close()
    return first, summary(alone)


def reset_text(model: Model):
    """What a learner does when the model ended its text: Reset, and the lesson goes on with a new one."""
    def reset(client) -> None:
        client.predict(model.name, api_name="/reset")
    return reset


def run_class(server: AppServer, model: Model, args) -> list[dict]:
    """Warm up, let the learners in, wait for them; emit one line per action and the summary; return them."""
    from bench.classroom_clients import learner_url, own_addresses, run_learner

    warm_s, alone = warm_up(server.url, model)
    think = args.think
    rounds = args.rounds if args.rounds is not None else (1 if args.duration is None else None)
    scripts = [script(args.seed, i, model, think, rounds) for i in range(args.learners)]
    where = addresses(args.learners, args.one_address)
    calls: list = []
    lock = threading.Lock()
    cpu0, own0 = cpu_seconds(server.pid), own_cpu_seconds()
    t_start = time.perf_counter()
    stop_at = None if args.duration is None else t_start + args.duration
    with own_addresses():
        threads = [threading.Thread(target=run_learner, daemon=True,
                                    args=(i, learner_url(server.port, where[i]), scripts[i], calls, lock, t_start,
                                          stop_at, reset_text(model)))
                   for i in range(args.learners)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    wall = time.perf_counter() - t_start
    cpu1 = cpu_seconds(server.pid)
    common = {"model": model.name, "addresses": "one" if args.one_address else "own", "learners": args.learners}
    rows = action_rows(calls)
    out = [emit("classroom", **common, **row) for row in rows]
    peak = proc_status(server.pid, "VmHWM")
    server_cpu = None if cpu0 is None or cpu1 is None else round(cpu1 - cpu0, 2)
    out.append(emit("classroom", **common, action="summary", rounds=rounds,
                    duration_s=args.duration, think_s=list(think), seed=args.seed, wall_s=round(wall, 1),
                    calls=len(calls), errors=sum(r["errors"] for r in rows), warm_up_s=warm_s, step_alone_ms=alone,
                    server_start_s=round(server.start_seconds, 2), server_peak_rss_mb=peak,
                    server_rss_end_mb=proc_status(server.pid, "VmRSS"), server_cpu_s=server_cpu,
                    server_cores_busy=None if server_cpu is None else round(server_cpu / wall, 2),
                    clients_cpu_s=round(own_cpu_seconds() - own0, 2), env=args.env, cpu=cpu_model(),
                    targets=verdict(rows, peak)))
    return out


def server_env(args) -> dict[str, str]:
    env = {"DECODER_LAB_RATE_SCALE": "1", "DECODER_LAB_THREADS": str(args.threads)}
    for item in args.env:
        name, _, value = item.partition("=")
        env[name] = value
    return env


def model_folder(args) -> Path:
    """The GPT-2-shaped folder: --model-folder (built there when it holds no model yet), else a temporary one."""
    from tests.support.gpt2_small import build_gpt2_small

    folder = Path(args.model_folder) if args.model_folder else Path(tempfile.mkdtemp(prefix="classroom-")) / GPT2_FOLDER
    if not (folder / "config.json").exists():
        build_gpt2_small(folder)
    return folder


def think_range(text: str) -> tuple[float, float]:
    lo, _, hi = text.partition(",")
    lo, hi = float(lo), float(hi or lo)
    if not 0 <= lo <= hi:
        raise ValueError(f"--think wants LOW,HIGH seconds with 0 ≤ LOW ≤ HIGH; got {text!r}")
    return lo, hi


def main() -> None:
    p = parser("classroom", __doc__)
    p.add_argument("--learners", type=int, default=30, help="learners at once (default 30)")
    p.add_argument("--rounds", type=int, default=None, help="lessons per learner (default 1, or until --duration)")
    p.add_argument("--duration", type=float, default=None, help="seconds of class: lessons repeat until then")
    p.add_argument("--think", type=think_range, default=(2.0, 5.0), help="think time LOW,HIGH in s (default 2,5)")
    p.add_argument("--seed", type=int, default=0, help="seeds prompts, heads and think times (default 0)")
    p.add_argument("--one-address", action="store_true", help="every learner from 127.0.0.2 (one NAT)")
    p.add_argument("--models", default="default,gpt2", help="comma-separated: default, gpt2 (default both)")
    p.add_argument("--gpt2", action="store_true", help="only the GPT-2-shaped folder (as --models gpt2)")
    p.add_argument("--model-folder", help="the GPT-2-shaped folder to use (built there if empty; default: a "
                                          "temporary one, built each run)")
    p.add_argument("--threads", type=int, default=1, help="DECODER_LAB_THREADS of the app (default 1)")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="a setting for the app's environment (repeatable), e.g. DECODER_LAB_CLIENT_WORKERS=4")
    args = p.parse_args()
    models = ["gpt2"] if args.gpt2 else [m.strip() for m in args.models.split(",") if m.strip()]
    if not set(models) <= {"default", "gpt2"} or args.learners < 1:
        p.error("--models takes default and gpt2; --learners at least 1")
    for name in models:
        folder = model_folder(args) if name == "gpt2" else None
        tmp = Path(tempfile.mkdtemp(prefix="classroom-app-"))  # the app's log stays there
        server = AppServer(server_env(args), tmp, args=["--model", str(folder)] if folder else [])
        try:
            server.start(timeout=300)
            run_class(server, gpt2_model(folder) if folder else default_model(), args)
        finally:
            server.stop()
            if folder is not None and not args.model_folder:  # a temporary GPT-2 folder: 500 MB of weights
                shutil.rmtree(folder.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
