"""One person's activation patching (the session's `sweeps`): at most one sweep running at a time, the
way to stop it, and the result of the last sweep the page drew, which its map's clicks and its numbers'
download read. The method itself (the metric, the grid of cells, the batched patched runs, what a sweep
costs) is lab.patching's; this part checks a sweep, reserves its memory in the server's budget for the
person, and keeps what one person's page needs between calls.
"""

from __future__ import annotations

import threading
from typing import Callable, Iterator

from . import patching
from .checks import UserError, check_choice
from .downloads import Export
from .patching import DIRECTIONS, SWEEPS, PatchProgress, PatchResult, grid
from .server.budget import MODEL_BUDGET


class Sweeps:
    """The patching sweeps of one session (`owner`: its models by name, and the memory it holds)."""

    def __init__(self, owner) -> None:
        self._owner = owner  # lab.session.Session (not imported: the session imports this)
        self._lock = threading.Lock()  # Stop comes on another thread than the sweep it stops
        self._stop: threading.Event | None = None  # set while a sweep runs
        self.last: PatchResult | None = None  # the last sweep the page drew (`run_steps` with keep)

    def run_steps(self, model_name, prompt_a, prompt_b, metric, answer, other, what="heads",
                  direction="denoising", keep: bool = True) -> Iterator[PatchProgress]:
        """A sweep (one at a time per session; `stop` ends it): checks everything and reserves its memory
        in the server's budget before the first batch, then `lab.patching.sweep_steps`. With `keep`, its
        result becomes `last` (the page's map) as it is yielded."""
        owner = self._owner
        entry = owner.entry_for(model_name)
        grid(entry, check_choice("what to patch", what, SWEEPS), 1)  # a sweep the model cannot run is refused first
        check_choice("direction", direction, DIRECTIONS)
        with self._lock:
            if self._stop is not None:
                raise UserError("A patching sweep is already running in this session; wait for it or press Stop.")
            stop = self._stop = threading.Event()
        try:
            setup = patching.prepare_sweep(entry, prompt_a, prompt_b, metric, answer, other)
            T, work = len(setup.ids_a), patching.sweep_flops(entry, what, len(setup.ids_a))
            if work > patching.MAX_SWEEP_GFLOP * 1e9:  # read when it runs: the limit is lab.patching's
                runs = len(grid(entry, what, T)[2])
                raise UserError(f"This sweep would run {runs:,} patched forwards of {T} tokens, about "
                                f"{work / 1e9:,.0f} GFLOP of arithmetic; the server runs sweeps of up to "
                                f"{patching.MAX_SWEEP_GFLOP:,} (the server is shared). Use shorter prompts: a minimal pair "
                                "of a few words is enough.")
            nbytes = patching.sweep_bytes(entry, T)
            try:
                with MODEL_BUDGET.borrow(owner, nbytes):
                    for p in patching.sweep_steps(setup, what, direction, stop):
                        if p.result is not None and keep:
                            self.last = p.result
                        yield p
            except UserError as exc:  # only the budget refuses past the checks above
                raise UserError(f"A patching sweep on this model needs {nbytes / 2**20:,.1f} MB of memory while it "
                                f"runs. {exc}") from None
        finally:
            with self._lock:
                self._stop = None

    def run(self, model_name, prompt_a, prompt_b, metric, answer, other, what="heads", direction="denoising",
            progress: Callable[[int, int], None] | None = None) -> PatchResult:
        """`run_steps` to the end, its result not kept as the page's (the API's /patch): the result
        (progress(done, total) after each batch)."""
        for p in self.run_steps(model_name, prompt_a, prompt_b, metric, answer, other, what, direction, keep=False):
            if p.result is not None:
                return p.result
            if progress is not None:
                progress(p.done, p.total)
        raise AssertionError("a sweep always ends with its result")

    def stop(self) -> bool:
        """Ask the running sweep to stop after its current batch; False when none runs."""
        with self._lock:
            stop = self._stop
        if stop is None:
            return False
        stop.set()
        return True

    def export(self) -> Export:
        """The last sweep's numbers to download, one line per cell (lab.patching.export)."""
        if self.last is None:
            raise UserError("Run patching first: the numbers are the map's.")
        return patching.export(self.last)
