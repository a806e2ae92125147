"""One person's Circuits view (the session's `circuits` part): direct logit attribution on their text, the
head composition scores of a model, one head's OV and QK circuits, and attribution patching beside exact
patching for an A/B pair; the last record of each (the view's figures, their clicks and their downloads read
it), and the one long job (composition or attribution patching) the person may run at a time, with its Stop.

The methods and their records are lab.circuits_records' (DLA, composition), lab.circuits_heads' (one
head's OV and QK circuits) and lab.circuits_atp's (attribution patching); the engine's are model/circuits.py
and model/attribution.py. This part checks each request against the server's limits before any work (a
refusal is one sentence and changes nothing), reserves the memory a computation needs in the server's budget
for the person while it runs, and keeps what one person's page needs between calls.

Where the composition scores are kept: lab.circuits_records.COMPOSITION, one cache for the whole server keyed
by the model object (weakly: the scores go with the model) and by fold, at most
lab.circuits_records.COMPOSITION_CACHE_BYTES; a second request for the same model, from anyone, is read from
it and costs nothing. The text's recorded forward that direct logit attribution reads is kept per text and
window (lab.circuits_records.RECORDED, bounded as lab.inside's memo is). The long jobs run their engine call
on a thread of their own, one step at a time: each step's progress is yielded to the caller, and the next step
waits until the caller asks for it, so a Stop pressed on a progress reaches the work before its next step, and
a caller that goes away stops it.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from typing import Callable, Iterator

from . import patching
from .checks import UserError, check_choice, check_int
from .circuits_atp import ATP_TOP, MAX_ATP_TOP, AtPRecord, atp_bytes, atp_export, atp_steps, verify_flops
from .circuits_heads import MAX_OV_INPUTS, OV_TOP, HeadCircuits, circuit_flops, circuits_export, head_circuits
from .circuits_records import (COMPOSITION, CircuitsProgress, CompositionRecord, DLARecord, composition_bytes,
                               composition_export, composition_flops, composition_record, compute_composition, dla,
                               dla_bytes, dla_export)
from .downloads import Export
from .headsettings import need_text
from .patching import DIRECTIONS, SWEEPS
from .server.budget import MODEL_BUDGET

__all__ = ["Circuits", "CircuitsProgress", "METHODS", "MAX_COMPOSITION_GFLOP", "MAX_COMPOSITION_BYTES",
           "MAX_CIRCUIT_GFLOP", "ATP_TOP", "MAX_ATP_TOP", "OV_TOP"]

METHODS = {"dla": "direct logit attribution", "composition": "head composition",
           "circuits": "OV and QK circuits of a head", "atp": "attribution patching"}
# the composition and copying scores of a model at most: GPT-2 small's are ~190 GFLOP (about 5 s of one core)
MAX_COMPOSITION_GFLOP = 400
MAX_COMPOSITION_BYTES = 512 * 2**20  # their working memory at most (GPT-2 small: ~230 MB of float64 factors)
MAX_CIRCUIT_GFLOP = 100  # one head's OV circuit at most (GPT-2 small: ~13 GFLOP over its 50,257 tokens)
_FIRST = {"dla": "Compute the direct logit attribution first: the numbers are the view's.",
          "composition": "Compute the composition scores first: the numbers are the view's.",
          "circuits": "Open a head's circuits first: the numbers are the view's.",
          "atp": "Run attribution patching first: the numbers are the view's."}
_EXPORTS = {"dla": dla_export, "composition": composition_export, "circuits": circuits_export, "atp": atp_export}


def _stepped(work: Callable[[Callable[[str, int, int], None]], object],
             stop: threading.Event) -> Iterator[CircuitsProgress]:
    """Run `work(progress)` on a thread of its own, one step at a time: each progress(phase, done, total) it
    calls is yielded here and the work waits until the caller asks for the next; its result comes last
    (phase "done"). A caller that stops asking (the generator closed) sets `stop` and lets the work end."""
    out: queue.Queue = queue.Queue()
    resume = threading.Semaphore(0)

    def progress(phase: str, done: int, total: int) -> None:
        out.put(("progress", CircuitsProgress(phase, done, total)))
        resume.acquire()

    def run() -> None:
        try:
            out.put(("result", work(progress)))
        except BaseException as exc:  # handed to the caller's thread, which raises it
            out.put(("error", exc))

    worker = threading.Thread(target=run, name="circuits-job", daemon=True)
    worker.start()
    try:
        while True:
            kind, value = out.get()
            if kind == "error":
                raise value
            if kind == "result":
                yield CircuitsProgress("done", 1, 1, value)
                return
            yield value
            resume.release()
    finally:
        stop.set()  # harmless once the work is done; ends it after its step when the caller left early
        resume.release()
        worker.join()


class Circuits:
    """The Circuits view of one session (`owner`: its text, its models by name, and the memory it holds)."""

    def __init__(self, owner) -> None:
        self._owner = owner  # lab.session.Session (not imported: the session imports this)
        self._lock = threading.Lock()  # Stop comes on another thread than the job it stops
        self._stop: threading.Event | None = None  # set while a long job runs
        self.last: dict[str, object] = {}  # the last record of each method (METHODS), the view's

    # ------------------------------------------------------------------------ helpers

    @contextlib.contextmanager
    def _job(self) -> Iterator[threading.Event]:
        with self._lock:
            if self._stop is not None:
                raise UserError("A circuits computation is already running in this session; wait for it or press Stop.")
            stop = self._stop = threading.Event()
        try:
            yield stop
        finally:
            with self._lock:
                self._stop = None

    @contextlib.contextmanager
    def _borrow(self, nbytes: int, what: str) -> Iterator[None]:
        """Hold `nbytes` more in the server's memory budget while the body runs (refused with a sentence)."""
        held = contextlib.ExitStack()
        try:
            held.enter_context(MODEL_BUDGET.borrow(self._owner, nbytes))
        except UserError as exc:
            raise UserError(f"{what} on this model needs {nbytes / 2**20:,.1f} MB of memory while it runs. "
                            f"{exc}") from None
        with held:
            yield

    def _entry(self, model_name):
        if model_name is None:
            if self._owner.entry is None:
                raise UserError("Choose a model first: the composition scores are a model's.")
            entry = self._owner.entry
        else:
            entry = self._owner.entry_for(model_name)
        entry.require("circuits")  # every method here reads the own engine's weights
        return entry

    # ------------------------------------------------------------------------ the verbs

    def dla(self, index=None, answer=None, other=None) -> DLARecord:
        """Direct logit attribution on the person's text at window position `index` (default: the selected
        token, else the last): answer and other as text (" tom", " anna"; answer None: the model's own top
        prediction there; other None: the answer's logit alone)."""
        text = self._owner.text
        need_text(text)
        text.entry.require("circuits")
        with self._borrow(dla_bytes(text.entry, len(text.decoder.window)), "Direct logit attribution"):
            record = dla(text, index, answer, other)
        self.last["dla"] = record
        return record

    def composition_steps(self, model_name=None, fold: bool = True) -> Iterator[CircuitsProgress]:
        """The Q/K/V composition and copying scores of a model (None: the text's), progress after each layer
        and the CompositionRecord last: read from the server's cache when computed before, else computed
        (one long job per session, Stop ends it; refused past MAX_COMPOSITION_GFLOP or _BYTES)."""
        entry = self._entry(model_name)
        if not isinstance(fold, bool):
            raise UserError("fold must be true or false.")
        kept = COMPOSITION.get(entry.model, fold)
        if kept is not None:
            record = composition_record(entry, *kept, cached=True)
            self.last["composition"] = record
            yield CircuitsProgress("done", 1, 1, record)
            return
        flops, nbytes = composition_flops(entry), composition_bytes(entry)
        cfg = entry.cfg
        if flops > MAX_COMPOSITION_GFLOP * 1e9 or nbytes > MAX_COMPOSITION_BYTES:
            raise UserError(f"The composition scores of this model ({cfg.n_layers} layers × {cfg.n_heads} heads, "
                            f"d_model {cfg.d_model}) take about {flops / 1e9:,.0f} GFLOP and "
                            f"{nbytes / 2**20:,.0f} MB, past the server's {MAX_COMPOSITION_GFLOP:,} GFLOP and "
                            f"{MAX_COMPOSITION_BYTES // 2**20:,} MB for them (the server is shared).")
        with self._job() as stop:
            release = COMPOSITION.claim(entry.model, fold)
            try:
                with self._borrow(nbytes, "The composition scores"):
                    for p in _stepped(lambda progress: compute_composition(entry, fold, progress, stop), stop):
                        if p.result is not None:
                            self.last["composition"] = p.result
                        yield p
            finally:
                release()

    def composition(self, model_name=None, fold: bool = True,
                    progress: Callable[[str, int, int], None] | None = None) -> CompositionRecord:
        """`composition_steps` to the end (progress(phase, done, total) after each step): the record."""
        return _to_end(self.composition_steps(model_name, fold), progress)

    def circuits(self, layer, head, top_k=OV_TOP, fold: bool = True) -> HeadCircuits:
        """Head `head` of `layer`'s OV circuit (copying score, spectrum, the top tokens it writes for the text's
        distinct tokens) and QK circuit on the text's tokens, plain and with positions."""
        text = self._owner.text
        need_text(text)
        if not isinstance(fold, bool):
            raise UserError("fold must be true or false.")
        entry, cfg = text.entry, text.entry.cfg
        entry.require("circuits")
        n = min(MAX_OV_INPUTS, len(set(text.decoder.window)))
        if circuit_flops(entry, n) > MAX_CIRCUIT_GFLOP * 1e9:
            raise UserError(f"One head's OV circuit on this model takes about {circuit_flops(entry, n) / 1e9:,.0f} "
                            f"GFLOP over its {cfg.vocab_size:,} tokens, past the server's {MAX_CIRCUIT_GFLOP:,} "
                            "GFLOP for it (the server is shared).")
        vocab = cfg.vocab_used or cfg.vocab_size
        nbytes = 8 * (2 * 4096 * cfg.d_model + n * vocab + 4 * cfg.head_dim * cfg.d_model)
        with self._borrow(nbytes, "A head's circuits"):
            record = head_circuits(text, layer, head, top_k, fold)
        self.last["circuits"] = record
        return record

    def atp_steps(self, model_name, prompt_a, prompt_b, metric, answer, other, what="heads", direction="denoising",
                  k=ATP_TOP) -> Iterator[CircuitsProgress]:
        """Attribution patching of the A/B pair beside the exact sweep of `what` (lab.patching's sweeps and
        directions), and its top `k` cells re-run exactly: progress after each step, the AtPRecord last (one
        long job per session, Stop ends it). Everything is checked before the first forward."""
        entry = self._entry(model_name)
        what = check_choice("what to patch", what, SWEEPS)
        patching.grid(entry, what, 1)  # a sweep the model cannot run (no MLP) is refused first
        direction = check_choice("direction", direction, DIRECTIONS)
        k = check_int("cells to re-run exactly", k, 1, MAX_ATP_TOP)
        with self._job() as stop:
            setup = patching.prepare_sweep(entry, prompt_a, prompt_b, metric, answer, other)
            T = len(setup.ids_a)
            full = patching.sweep_flops(entry, what, T) <= patching.MAX_SWEEP_GFLOP * 1e9
            if not full and verify_flops(entry, what, T, k) > patching.MAX_SWEEP_GFLOP * 1e9:
                raise UserError(f"Even {k} exact re-runs of {T} tokens on this model pass the server's "
                                f"{patching.MAX_SWEEP_GFLOP:,} GFLOP for patching: use shorter prompts.")
            with self._borrow(atp_bytes(entry, T), "Attribution patching"):
                for p in atp_steps(setup, what, direction, k, stop, full):
                    if p.result is not None:
                        self.last["atp"] = p.result
                    yield p

    def atp(self, model_name, prompt_a, prompt_b, metric, answer, other, what="heads", direction="denoising",
            k=ATP_TOP, progress: Callable[[str, int, int], None] | None = None) -> AtPRecord:
        """`atp_steps` to the end (progress(phase, done, total) after each step): the record."""
        return _to_end(self.atp_steps(model_name, prompt_a, prompt_b, metric, answer, other, what, direction, k),
                       progress)

    def stop(self) -> bool:
        """Ask the running job to stop after its current step; False when none runs."""
        with self._lock:
            stop = self._stop
        if stop is None:
            return False
        stop.set()
        return True

    @property
    def running(self) -> bool:
        with self._lock:
            return self._stop is not None

    def export(self, method) -> Export:
        """The numbers of the last record of `method` (METHODS) to download as CSV and JSON."""
        method = check_choice("method", method, METHODS)
        record = self.last.get(method)
        if record is None:
            raise UserError(_FIRST[method])
        return _EXPORTS[method](record)


def _to_end(steps: Iterator[CircuitsProgress], progress: Callable[[str, int, int], None] | None):
    """Run a job's steps to its result, and close them (the job's memory and its slot are given back)."""
    with contextlib.closing(steps):
        for p in steps:
            if p.result is not None:
                return p.result
            if progress is not None:
                progress(p.phase, p.done, p.total)
    raise AssertionError("a job always ends with its result")
