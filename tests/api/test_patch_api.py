"""/patch through the running app (gradio_client against a real server): the heatmap's numbers are the
lab's sweep (each cell a forward of the model with that activation patched, tests/lab/test_patching_lab.py),
refusals are sentences, and a sweep counts in the server's budgets: the per-address rate of sweeps and the
memory a sweep holds while it runs.
"""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

from lab import patching
from lab.catalogue.models import BUILTINS
from lab.limits import RATE_LIMITS
from tests.support.api import assert_clean_error
from tests.support.server import AppServer

GRAMMAR, COPY = "grammar (built-in)", "copy / induction (built-in)"
A = "anna found the key . she gave it to tom because he asked"
B = "tom found the key . he gave it to anna because she asked"


@pytest.mark.parametrize("what,direction", [("heads", "denoising"), ("resid", "noising"), ("mlp", "denoising")])
def test_the_numbers_are_the_labs_sweep(app_server, what, direction):
    c = Client(app_server.url, verbose=False)
    got = c.predict(GRAMMAR, A, B, "logit_diff", " she", " he", what, direction, api_name="/patch")
    setup = patching.prepare_sweep(BUILTINS.get(GRAMMAR), A, B, "logit_diff", " she", " he")
    want = patching.sweep(setup, what, direction)
    # the server runs one torch thread, this process may run several: float32 rounding apart
    np.testing.assert_allclose(np.array(got["values"], dtype=float), want.values, atol=1e-4, rtol=0)
    np.testing.assert_allclose(np.array(got["metric_patched"], dtype=float), want.metric, atol=1e-4, rtol=0)
    assert got["metric_a"] == pytest.approx(setup.clean, abs=1e-4)
    assert got["metric_b"] == pytest.approx(setup.corrupted, abs=1e-4)
    assert (got["rows"], got["columns"]) == (want.rows, want.columns)
    assert got["tokens_a"] == setup.tokens_a and got["tokens_b"] == setup.tokens_b
    assert got["sweep"] == what and got["direction"] == direction and got["done"] == got["cells"] == want.values.size
    assert got["value_is"] == patching.VALUE_NAMES[direction] and got["metric_is"] == "logit(she) − logit(he)"
    if what == "heads":
        assert got["summary"].startswith("L1H0 restores ") and got["summary"].endswith("of the she/he difference")


def test_refusals_are_sentences(app_server):
    c = Client(app_server.url, verbose=False)
    cases = [
        ((GRAMMAR, "anna found the key . she", "tom found the key", "logit_diff", " she", " he", "heads", "denoising"),
         r"same number of tokens.*minimal pair"),
        ((GRAMMAR, A, B, "logit_diff", "she gave", " he", "heads", "denoising"), "single token"),
        ((GRAMMAR, A, A, "logit_diff", " she", " he", "heads", "denoising"), "no difference for a patch"),
        ((GRAMMAR, A, B, "entropy", " she", " he", "heads", "denoising"), "metric"),
        ((GRAMMAR, A, B, "logit_diff", " she", " he", "neurons", "denoising"), "what to patch"),
        ((GRAMMAR, A, B, "logit_diff", " she", " he", "heads", [1]), "direction"),
        (("no such model", A, B, "logit_diff", " she", " he", "heads", "denoising"), "Unknown model"),
        (("article toy (built-in)", "how is living in amsterdam <EOS>", "living in amsterdam is how <EOS>",
          "prob", "how", None, "mlp", "denoising"), "no MLP"),
    ]
    for args, pattern in cases:
        with pytest.raises(AppError) as info:
            c.predict(*args, api_name="/patch")
        assert_clean_error(info.value, pattern)


@pytest.fixture(scope="module")
def budgeted(tmp_path_factory):
    """A server with the real rates (buckets that do not refill while the test runs) and 3 MB of memory for
    everyone's models, texts and sweeps: a sweep of the copy model fits (about 2 MB), one of the grammar
    model (about 3.3 MB) does not."""
    env = {"DECODER_LAB_RATE_SCALE": "1", "DECODER_LAB_RATE_WINDOW_SCALE": "1000", "DECODER_LAB_MEMORY_MB": "3",
           "DECODER_LAB_CLIENT_MEMORY_MB": "3"}
    server = AppServer(env, tmp_path_factory.mktemp("patch_budget")).start()
    yield server
    server.stop()


def test_sweeps_count_in_the_servers_memory_and_rate(budgeted):
    copy, grammar = BUILTINS.get(COPY), BUILTINS.get(GRAMMAR)
    assert patching.sweep_bytes(copy, 12) < 3 * 2**20 < patching.sweep_bytes(grammar, 13)
    c = Client(budgeted.url, verbose=False)
    with pytest.raises(AppError) as info:  # refused by the memory budget (it still costs a sweep of the rate)
        c.predict(GRAMMAR, A, B, "logit_diff", " she", " he", "heads", "denoising", api_name="/patch")
    assert_clean_error(info.value, r"patching sweep on this model needs 3\.\d MB of memory")
    burst = RATE_LIMITS["patch"][0]
    for _ in range(burst - 1):
        got = c.predict(COPY, "hcbpadlk|hcb", "hcbpadlk|hcp", "logit_diff", "p", "a", "heads", "denoising",
                        api_name="/patch")
        assert got["done"] == got["cells"] == 8
    with pytest.raises((AppError, httpx.HTTPStatusError)) as info:
        c.predict(COPY, "hcbpadlk|hcb", "hcbpadlk|hcp", "logit_diff", "p", "a", "heads", "denoising",
                  api_name="/patch")
    exc = info.value
    message = exc.response.json()["error"] if isinstance(exc, httpx.HTTPStatusError) else str(exc)
    assert message.startswith("Slow down: too many patching sweeps were run from your address"), message
