"""The server-wide memory budget seen from outside: RSS after many sessions that each upload big models.

Before the budgets, every session could hold `MAX_USER_MODELS` (3) uploaded models of up to
`UPLOAD_MAX_MB`: about +43 MB of RSS per session, ~12.7 GB at 300 sessions. Now the bytes that all
sessions hold together, their own models and their texts' attention, are bounded by
`lab.limits.MEMORY_MAX_BYTES` (`DECODER_LAB_MEMORY_MB`): an upload or a longer text beyond it is
refused ("The server is full right now …") unless idle sessions can make room (`lab.server.budget.ModelBudget`).

This starts `python app.py` (tests.support.server.AppServer) behind a pretend proxy (`DECODER_LAB_BEHIND_PROXY=1`,
real rate limits: `DECODER_LAB_RATE_SCALE=1`), so each simulated visitor is its own client by its
`X-Forwarded-For` address, and with the budget given by `--models-mb`. It builds one valid
checkpoint as close to the checkpoint limits as they allow (6 layers, d_model 256, d_ff 1024,
context 256, a character vocabulary filling the rest of `Limits.max_params`: ~5.0 M float32
parameters, a ~19 MB file). Then `--sessions` visitors (one gradio_client Client each, its own
address, `--workers` at a time) upload that file up to 3 times (`/upload_model`) and do one
`/step` on the last model they got in (on the built-in default model if every upload was refused,
as the refusal suggests). It records the server's RSS (tests.support.server.rss_mb of its process tree)
idle, every 25 sessions and sampled every 0.25 s for the peak; uploads accepted and refused by
message class ("server is full", "Slow down", other); every other error; and what is left in
gradio's upload folder at the end (files and bytes: disk, or memory where that folder is a tmpfs).

The stated ceiling is  idle RSS + budget × (1 + `ALLOCATOR_SLACK`) + margin, stated before the run:

- `ALLOCATOR_SLACK` (25 %): glibc's allocator keeps freed blocks around the live ones (models
  refused after their file was read, texts that grew and shrank); the budget counts live bytes;
- fixed `FIXED_MARGIN_MB` (150 MB): what the first uploads and Steps load once (torch's kernels),
  two uploads in flight (`CONCURRENCY["upload"]`; each reads its 19 MB file);
- per session `SESSION_MARGIN_MB` (1.5 MB) × sessions: gradio's own copy of its state (~135 KB,
  see lab.limits.SESSION_CAPACITY), the session object and its small Python state.

    python -m bench.memory_budget [--sessions 300] [--models-mb 2048] [--workers 4] [--idle-s S]
                                  [--server-env NAME=VALUE ...]
"""

from __future__ import annotations

import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from bench.clients import Sampler
from bench.common import emit, parser
from tests.support.server import AppServer, rss_mb

FIXED_MARGIN_MB = 150.0
ALLOCATOR_SLACK = 0.25
SESSION_MARGIN_MB = 1.5
UPLOADS_PER_SESSION = 3
EXAMPLE = "anna gave tom the key because she"


def model_files(folder: Path, copies: int = 1) -> tuple[list[Path], str, int]:
    """Valid checkpoints at the checkpoint limits (~19 MB each) under `folder`: (paths, example prompt,
    bytes of the model in memory). The copies differ only in one metadata field: gradio keeps an
    upload at a path made of its content's hash and its name, so two visitors uploading the same
    file at the same moment share one path (see `visit`)."""
    import torch

    from lab.server.budget import model_bytes
    from model.checkpoint import DEFAULT_LIMITS, save_checkpoint
    from model.config import ModelConfig
    from model.tokenizers import CharTokenizer
    from model.transformer import DecoderLM

    lim = DEFAULT_LIMITS
    base = {"block_size": lim.max_block_size, "n_layers": lim.max_layers, "n_heads": 8, "d_model": lim.max_d_model,
            "d_ff": lim.max_d_ff, "pos_encoding": "learned"}
    # every extra vocabulary entry adds an embedding row and a head row: 2 * d_model parameters
    small = ModelConfig(vocab_size=64, **base).n_params()
    vocab = min(lim.max_vocab, 64 + (lim.max_params - small) // (2 * lim.max_d_model))
    letters = sorted(set(EXAMPLE))
    chars = letters + [chr(0x100 + i) for i in range(vocab - 1 - len(letters))]  # + <unk>
    tok = CharTokenizer(chars)
    cfg = ModelConfig(vocab_size=tok.vocab_size, **base)
    lim.check(cfg)
    torch.manual_seed(0)
    model = DecoderLM(cfg).eval()
    paths = []
    for k in range(copies):
        path = save_checkpoint(folder / f"big{k}.safetensors", model, tok, {"examples": [EXAMPLE], "copy": k})
        size = path.stat().st_size
        if size > lim.max_file_bytes:
            raise RuntimeError(f"model file is {size:,} bytes, above the upload limit {lim.max_file_bytes:,}")
        paths.append(path)
    return paths, EXAMPLE, model_bytes(model)


def text_bytes(path: Path, prompt: str) -> int:
    """Bytes one session's text holds after one Step on the uploaded model (measured in this process)."""
    import shutil

    from bench.memory import session_bytes
    from lab.session import Session
    from model.generate import Sampling

    session = Session()
    copy = path.with_name("measure.safetensors")
    shutil.copyfile(path, copy)  # Session.upload deletes the file it loaded
    try:
        name = session.upload(str(copy))
        session.step(name, prompt, Sampling(temperature=0.8, top_k=0, top_p=1.0, seed=0))
        return session_bytes(session)
    finally:
        session.close()


def address(i: int) -> str:
    """The i-th visitor's address (198.18.0.0/15, the benchmarking range): one client each."""
    return f"198.18.{i // 250}.{i % 250 + 1}"


def kind(message: str) -> str:
    """The class of a refusal's message."""
    if "server is full" in message:
        return "full"
    if message.startswith("Slow down"):
        return "slow_down"
    return "other"


def visit(url: str, i: int, path: Path, prompt: str, uploads: int = UPLOADS_PER_SESSION,
          builtin: str | None = None) -> dict:
    """One visitor from its own address: `uploads` uploads of `path`, then one Step.

    Visitors at the same time must upload different files: lab.session.Session.upload deletes the
    file it loaded, and gradio stores two uploads of the same bytes and name at the same path, so
    the second visitor's upload would find nothing ("cannot read …", counted as "other").

    Returns {"accepted": n, "full": n, "slow_down": n, "other": n, "errors": [...], "model": name
    stepped on or None, "stepped": bool}.
    """
    from gradio_client import Client, handle_file
    from gradio_client.exceptions import AppError

    out = {"accepted": 0, "full": 0, "slow_down": 0, "other": 0, "errors": [], "model": None, "stepped": False,
           "refusals": []}
    c = Client(url, verbose=False, download_files=False, analytics_enabled=False,
               headers={"X-Forwarded-For": address(i)})
    try:
        for _ in range(uploads):
            try:
                res = c.predict(handle_file(str(path)), api_name="/upload_model")
            except AppError as exc:
                k = kind(str(exc))
                out[k] += 1
                out["refusals"].append(str(exc)[:200])
                if k == "other":
                    out["errors"].append(f"upload: {str(exc)[:200]}")
                continue
            except Exception as exc:  # noqa: BLE001 - reported, not raised
                out["errors"].append(f"upload: {exc!r}"[:200])
                continue
            value = res[-1].get("value") if isinstance(res[-1], dict) else res[-1]
            if isinstance(value, str) and value.startswith("uploaded: "):
                out["accepted"] += 1
                out["model"] = value
            else:
                out["errors"].append(f"upload answered {str(res)[:200]}")
        name = out["model"] or builtin
        if name is not None:
            step_prompt = prompt if out["model"] else "anna found the key . she gave it to tom because he"
            try:
                tokens = c.predict(name, step_prompt, 0.8, 0, 1.0, i, 0, "all", "weights", api_name="/step")[0]
                out["stepped"] = bool(tokens)
                if not tokens:
                    out["errors"].append("step returned no tokens")
            except Exception as exc:  # noqa: BLE001
                out["errors"].append(f"step on {name!r}: {str(exc)[:200]}")
    finally:
        c.close()
    return out


def arguments():
    """The command line; `--sessions` may not pass the session store's bound."""
    from lab.limits import IDLE_S, MAX_SESSIONS, MEMORY_MAX_BYTES

    p = parser("memory_budget", __doc__)
    p.add_argument("--sessions", type=int, default=300, help="visitors, each from its own address")
    p.add_argument("--models-mb", type=int, default=MEMORY_MAX_BYTES // 2**20,
                   help="DECODER_LAB_MEMORY_MB of the served app (the server-wide memory budget: own models and texts)")
    p.add_argument("--workers", type=int, default=4, help="visitors at a time")
    p.add_argument("--idle-s", type=float, default=None,
                   help=f"DECODER_LAB_IDLE_S of the served app (default: its own, {IDLE_S:g} s)")
    p.add_argument("--server-env", action="append", default=[], metavar="NAME=VALUE",
                   help="more environment of the served app (e.g. MALLOC_ARENA_MAX=2), repeatable")
    args = p.parse_args()
    if args.sessions > MAX_SESSIONS:
        p.error(f"--sessions above MAX_SESSIONS ({MAX_SESSIONS}) would measure the session store, not the model budget")
    return args


def server_env(args) -> dict[str, str]:
    """The served app's environment: a pretend proxy, real rates, the budget asked for."""
    env = {"DECODER_LAB_BEHIND_PROXY": "1", "DECODER_LAB_RATE_SCALE": "1", "DECODER_LAB_MEMORY_MB": str(args.models_mb),
           "DECODER_LAB_THREADS": "1"}
    if args.idle_s is not None:
        env["DECODER_LAB_IDLE_S"] = str(args.idle_s)
    env.update(kv.split("=", 1) for kv in args.server_env)
    return env


def visit_all(server, args, paths: list[Path], prompt: str, builtin: str) -> dict:
    """Send `--sessions` visitors to the running server, `--workers` at a time (each worker uploads its own
    copy of the model file), sampling its RSS. Returns the counts, the refusals and the RSS readings."""
    pid = server.pid
    totals = {"accepted": 0, "full": 0, "slow_down": 0, "other": 0, "stepped": 0, "stepped_own": 0}
    errors: list[str] = []
    other_messages: set[str] = set()
    rss_every_25: dict[int, float] = {}
    urllib.request.urlopen(server.url, timeout=10).read()
    time.sleep(2)
    idle = rss_mb(pid, tree=True)
    sampler = Sampler(lambda: rss_mb(pid, tree=True), every=0.25)
    sampler.start()
    lock = threading.Lock()
    done = 0
    mine = threading.local()

    def one(i: int) -> dict:
        if not hasattr(mine, "path"):
            with lock:
                mine.path = paths[len(taken)]
                taken.append(mine.path)
        return visit(server.url, i, mine.path, prompt, UPLOADS_PER_SESSION, builtin)

    taken: list[Path] = []
    t0 = time.perf_counter()
    try:
        with ThreadPoolExecutor(args.workers) as ex:
            futures = [ex.submit(one, i) for i in range(args.sessions)]
            for f in as_completed(futures):
                try:
                    r = f.result()
                except Exception as exc:  # noqa: BLE001
                    r = {"errors": [f"visitor: {exc!r}"[:200]]}
                with lock:
                    done += 1
                    for k in ("accepted", "full", "slow_down", "other"):
                        totals[k] += r.get(k, 0)
                    totals["stepped"] += bool(r.get("stepped"))
                    totals["stepped_own"] += bool(r.get("stepped") and r.get("model"))
                    errors += r.get("errors", [])
                    other_messages.update(m for m in r.get("refusals", []) if kind(m) == "other")
                    if done % 25 == 0 or done == args.sessions:
                        rss_every_25[done] = rss_mb(pid, tree=True)
                        print(f"# {done} sessions, {time.perf_counter() - t0:.0f} s: rss {rss_every_25[done]} MB, "
                              f"{totals}", flush=True)
        seconds = time.perf_counter() - t0
        time.sleep(2)
        after = rss_mb(pid, tree=True)
    finally:
        samples = sampler.stop()
    return {"totals": totals, "errors": errors, "other_messages": other_messages, "idle": idle, "after": after,
            "samples": samples, "rss_every_25": rss_every_25, "seconds": seconds}


def main() -> None:
    from bench.common import default_entry
    from lab.limits import CONCURRENCY

    args = arguments()
    tmp = Path(tempfile.mkdtemp(prefix="memory-budget-"))
    paths, prompt, nbytes = model_files(tmp, args.workers)  # one per worker (see `visit`)
    path = paths[0]
    per_text = text_bytes(path, prompt)
    builtin = default_entry().name
    server = AppServer(server_env(args), tmp).start()
    try:
        m = visit_all(server, args, paths, prompt, builtin)
        temp_files = [f for f in (tmp / "gradio").rglob("*") if f.is_file()]
        temp_left = {"files": len(temp_files), "bytes": sum(f.stat().st_size for f in temp_files)}
        log_errors = [ln for ln in server.output().splitlines() if "Traceback" in ln or "unexpected error" in ln]
    finally:
        server.stop()
    totals, errors, idle, after, rss_every_25 = m["totals"], m["errors"], m["idle"], m["after"], m["rss_every_25"]
    peak = max([*m["samples"], *rss_every_25.values(), after])
    margin = FIXED_MARGIN_MB + SESSION_MARGIN_MB * args.sessions + ALLOCATOR_SLACK * args.models_mb
    ceiling = round(idle + args.models_mb + margin, 1)  # rss_mb is KiB / 1024: MiB, as the budget's MB
    emit(
        "memory_budget",
        sessions=args.sessions, workers=args.workers, models_mb=args.models_mb, server_env=args.server_env,
        upload_concurrency=CONCURRENCY["upload"],
        model_file_bytes=path.stat().st_size, model_bytes=nbytes, text_bytes_one_step=per_text,
        idle_rss_mb=idle, peak_rss_mb=peak, after_rss_mb=after, rss_every_25_sessions_mb=rss_every_25,
        uploads_tried=args.sessions * UPLOADS_PER_SESSION, uploads_accepted=totals["accepted"],
        refused_server_full=totals["full"], refused_slow_down=totals["slow_down"], refused_other=totals["other"],
        other_messages=sorted(m["other_messages"])[:5], steps_ok=totals["stepped"],
        steps_on_own_model=totals["stepped_own"],
        errors=len(errors), error_examples=errors[:5], server_log_errors=log_errors[:5],
        margin_mb=margin, ceiling_mb=ceiling, under_ceiling=peak <= ceiling,
        peak_growth_mb=round(peak - idle, 1), gradio_temp_left=temp_left, seconds=round(m["seconds"], 1),
        without_budget_estimate_mb=round(idle + args.sessions * UPLOADS_PER_SESSION * nbytes / 2**20, 1),
    )
    for f in tmp.glob("*.safetensors"):
        f.unlink()


if __name__ == "__main__":
    main()
