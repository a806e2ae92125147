"""Shared fixtures: a real app server on a free loopback port, a real headless Chromium.

The server and the browser settings live in tests/support/server.py (the benchmarks use them too); the project is
installed in editable mode (`pip install -r requirements-test.txt`), so `app`, `model`, `viz` and `lab`
import without touching sys.path.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

from tests.support.server import CHROMIUM, CHROMIUM_ARGS, AppServer

# Property tests draw the same examples on every run (seeded from each test's own code), so a run that passes
# passes again and a failure can be replayed: a test that fails only on some runs is a failing test. To search
# new examples instead, run with HYPOTHESIS_PROFILE=explore (or pytest's --hypothesis-profile=explore).
settings.register_profile("ci", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False, database=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# The quick loop is `python -m pytest -m "not slow"`; a plain `python -m pytest` still runs everything. A test is
# marked slow here, without a mark in its file, when it starts something outside its own process: it uses one of
# these fixtures (directly or through another fixture), its body or one of its fixtures' bodies names one of
# STARTS_A_PROCESS (a server, a browser, a Python child, a spawned worker), or it lives in tests/browser/. Tests
# slow for another reason (long trainings) carry `@pytest.mark.slow` in their own file.
SERVER_OR_BROWSER_FIXTURES = {"app_server", "browser"}
STARTS_A_PROCESS = {"AppServer", "sync_playwright", "subprocess", "get_context"}
TESTS = Path(__file__).resolve().parent


def _names_in(code) -> set[str]:
    """Every global and attribute name a function's code uses, nested functions and lambdas included."""
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _names_in(const)
    return names


def _starts_a_process(func) -> bool:
    code = getattr(func, "__code__", None)
    return code is not None and bool(_names_in(code) & STARTS_A_PROCESS)


def is_slow(item) -> bool:
    if item.get_closest_marker("slow") or item.path.parent == TESTS / "browser":
        return True
    if SERVER_OR_BROWSER_FIXTURES & set(item.fixturenames):
        return True
    fixture_defs = getattr(item, "_fixtureinfo", None)
    fixture_defs = fixture_defs.name2fixturedefs if fixture_defs else {}
    funcs = [getattr(item, "function", None)] + [d.func for defs in fixture_defs.values() for d in defs]
    return any(_starts_a_process(f) for f in funcs)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if is_slow(item) and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def train_sort():
    """Train a small sort model in a lab Session, as the Train tab does; returns a function giving the run's last
    progress (its `run.name` and its `download` file)."""

    def run(session, layers: int = 1, steps: int = 20):
        for progress in session.train("sort", "", None, "char", layers, 2, 32, 64, "learned", "pre", "gelu", 0.0,
                                      steps, 3e-3, 0):
            pass
        assert progress.done
        return progress

    return run


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test that used the shared app server carries the end of the server's log in its report
    (CI shows only the report: the log is what says why a page waited)."""
    outcome = yield
    report = outcome.get_result()
    server = getattr(item, "funcargs", {}).get("app_server")
    if report.when == "call" and report.failed and server is not None:
        report.sections.append(("app server log (last 4,000 characters)", server.output()[-4000:]))
        state = server.state()
        if state:
            report.sections.append(("app server state at the failure (ui/diagnose.py)", state[-12_000:]))


@pytest.fixture(scope="session")
def app_server(tmp_path_factory):
    # an action sent while the same session's Generate streams waits for it however slow the machine (the
    # 10 s default would refuse it as busy): 600 s, a hang guard
    server = AppServer({"DECODER_LAB_TRAIN_SECONDS": "60", "DECODER_LAB_BUSY_WAIT_S": "600"},
                       tmp_path_factory.mktemp("app")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: run `python tests/setup_browser.py` (apt-get install chromium)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    """Where browser tests save screenshots: $DECODER_LAB_SCREENSHOTS, else a temporary folder."""
    out = os.environ.get("DECODER_LAB_SCREENSHOTS")
    path = Path(out) if out else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def train_page(app_server, browser):
    """The app at 1366×900 in Chromium, on its Train tab (a tests.support.browser Page)."""
    from tests.support.browser import Page

    context = browser.new_context(viewport={"width": 1366, "height": 900})
    p = Page(context, app_server.url)
    p.open_train_tab()
    yield p
    context.close()
