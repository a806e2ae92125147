"""A patching sweep whose A/B difference is noise says so (lab/patching.py `NOISE_RATIO`): the rule on the
built-ins' minimal pairs (never fires) and on a random nanoGPT run written the way nanoGPT writes one (fires,
with the numbers), exactly at its boundary, and the headline of a difference of the wrong sign.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from lab import patching
from lab.catalogue.external import ExternalModels, parse_source
from lab.catalogue.models import BUILTINS
from lab.session import Session
from tests.support.nanogpt_runs import CHARS, reference, save_run

GRAMMAR = "grammar (built-in)"
PAIRS = [("anna found the key . she gave it to tom because he asked",
          "tom found the key . he gave it to anna because she asked", "her", "him"),
         ("tom found the key . he gave it to anna because", "anna found the key . she gave it to tom because",
          "she", "he")]


@pytest.fixture(scope="module")
def random_run(tmp_path_factory):
    """A nanoGPT character model of random weights (ckpt.pt and meta.pkl), as `--model` offers it."""
    root = tmp_path_factory.mktemp("nanogpt")
    path = save_run(root / "run", reference(len(CHARS), block=64))
    s = Session()
    s.external = ExternalModels([parse_source(str(path))], root / "hashes.json")
    return s.entry_for(s.external.names[0])


def spread_ratio(r: patching.PatchResult) -> float:
    low, high = r.spread()
    return (high - low) / abs(r.setup.difference)


@pytest.mark.parametrize("what", list(patching.SWEEPS))
def test_the_builtins_minimal_pairs_are_never_called_noise(what):
    """Every sweep of the grammar model's pairs, both metrics and directions: the difference is real, the rule
    stays quiet and the headline is the plain one."""
    entry = BUILTINS.get(GRAMMAR)
    for a, b, x, y in PAIRS:
        for metric in patching.METRICS:
            setup = patching.prepare_sweep(entry, a, b, metric, x, y)
            for direction in patching.DIRECTIONS:
                r = patching.sweep(setup, what, direction)
                assert spread_ratio(r) < 1.2 and not r.small_difference() and not r.wrong_sign()
                assert r.cautions() == [] and r.to_json()["cautions"] == []
                assert r.summary().endswith(f"% of the {setup.metric.difference_name} difference")


def test_a_random_models_difference_is_called_noise_with_its_numbers(random_run):
    r = patching.sweep(patching.prepare_sweep(random_run, "the fox ran", "the fox run", "logit_diff", " ", "e"),
                       "heads", "denoising")
    s, (low, high) = r.setup, r.spread()
    assert s.difference > 0 and spread_ratio(r) > patching.NOISE_RATIO  # 0.445 against a spread of 1.48
    assert r.small_difference() and not r.wrong_sign()
    [caution] = r.cautions()
    for number in (f"{s.difference:+.3f}", f"{low:.3f}", f"{high:.3f}", f"{spread_ratio(r):.1f} times",
                   f"{100 * np.nanmax(r.values):.0f} %", f"{100 * np.nanmin(r.values):.0f} %"):
        assert number in caution
    assert r.summary().endswith("difference, a difference too small to read (see the warning)")
    assert r.to_json()["cautions"] == [caution]


def test_a_difference_of_the_wrong_sign_is_said_in_the_headline(random_run):
    """The answer tokens name A's answer first: a metric lower on A than on B is the opposite of what they
    imply, whatever the map's shares."""
    r = patching.sweep(patching.prepare_sweep(random_run, "abcab", "abcac", "logit_diff", "c", "a"), "heads", "noising")
    assert r.setup.difference < 0 and r.wrong_sign() and not r.small_difference()
    assert f"of the wrong sign ({r.setup.difference:+.3f})" in r.summary()
    [caution] = r.cautions()
    assert caution.startswith("Wrong sign") and f"lower on A ({r.setup.clean:.3f})" in caution
    # both at once: a difference of the wrong sign that single patches also drown
    both = patching.sweep(patching.prepare_sweep(random_run, "hello world", "hello worle", "logit_diff", "a", "e"),
                          "heads", "denoising")
    assert both.wrong_sign() and both.small_difference() and len(both.cautions()) == 2
    assert both.summary().endswith("of the wrong sign (-0.729) and too small to read (see the warning)")
    prob = patching.sweep(patching.prepare_sweep(random_run, "abcab", "abcac", "prob", "d"), "heads", "denoising")
    assert prob.setup.difference < 0 and "A gives d a lower probability than B does" in prob.cautions()[0]


def test_the_rule_at_its_boundary(random_run):
    """A real sweep's cells rescaled to a spread of exactly 1, against a difference of exactly 1/2 (the ratio
    NOISE_RATIO: not noise) and of the next float below 1/2 (noise); the cells not computed do not count."""
    r = patching.sweep(patching.prepare_sweep(random_run, "the fox ran", "the fox run", "logit_diff", " ", "e"),
                       "heads", "denoising")
    m = (r.metric - r.metric.min()) / (r.metric.max() - r.metric.min())
    assert m.max() - m.min() == 1.0 and patching.NOISE_RATIO == 2.0

    def at(clean: float, metric=m) -> patching.PatchResult:
        setup = dataclasses.replace(r.setup, clean=clean, corrupted=0.0)
        return dataclasses.replace(r, setup=setup, metric=metric, values=metric / clean)

    assert not at(0.5).small_difference() and at(0.5).cautions() == []
    below = at(np.nextafter(0.5, 0.0))
    assert below.small_difference() and "2.0 times the difference" in below.cautions()[0]
    assert not at(-0.5).small_difference() and at(-0.5).wrong_sign()
    assert at(-np.nextafter(0.5, 0.0)).small_difference()
    stopped = m.copy()
    stopped[stopped > 0.4] = np.nan  # a stopped sweep: only what was computed spreads
    assert not at(np.nextafter(0.5, 0.0), stopped).small_difference()
    assert not at(0.5, np.full_like(m, np.nan)).small_difference()
