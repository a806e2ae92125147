"""Attribution patching (model/attribution.py): the first-order estimate of every patching cell, checked
against exact patching.

* The estimate is the gradient times the difference: per site, in float64, it equals the central finite
  difference (Richardson-extrapolated) of the metric along the patch, computed by the float64 forward
  written out from the weights (tests/support/patch_reference.py, which shares no code with the engine),
  to 1e-6 relative; on GPT-2-like, Llama-like with grouped keys, NeoX-like (partial rotary, parallel
  residual) and sandwich-norm (Gemma-like) models, both directions, both metrics; nanochat's options
  (smear, x0 mix, backout) by the engine's own patched forward.
* Where the metric is linear in a site (the last residual, no final norm) the estimate is the exact effect.
* The tracked forward is the plain recording bit for bit and leaves the model as it was.
* The top-k exact re-runs are lab/patching.py's sweep cells bit for bit (its own sweep is called), batched as
  that sweep batches them or one cell alone; the grids and batches are the lab's.
* Stop between phases and between batches; progress; refusals in sentences; the disagreement flags.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from lab import patching
from lab.catalogue.models import BUILTINS, ModelEntry
from model.attribution import (ATP_ABS_SHARE, ATP_GRIDS, AnswerMetric, AttributionCheck, atp_grid_sites,
                               attribute, attribute_and_verify, attribution_steps, exact_patched_metrics, verify_top)
from model.config import ModelConfig
from model.norms import RMSNorm
from model.patching import Activations, Patch, PatchSite, sweep_chunks
from model.transformer import DecoderLM
from tests.support.inside_ref import rope_angles
from tests.support.patch_reference import metric_of, one_thread, reference  # noqa: F401 (fixture)

A = [1, 2, 3, 4, 5, 6, 7]
B = [1, 9, 3, 4, 10, 6, 7]  # differs at positions 1 and 4; same last token
CONFIGS = {
    "gpt2": dict(gelu_approximate="tanh"),
    "llama-gqa": dict(pos_encoding="rope", norm_kind="rmsnorm", activation="swiglu", n_kv_heads=2, bias=False),
    "neox": dict(pos_encoding="rope", rope_fraction=0.5, parallel_residual=True, gelu_approximate="tanh"),
    "sandwich": dict(pos_encoding="rope", norm="sandwich", norm_kind="rmsnorm", norm_offset=1.0, bias=False,
                     activation="geglu", gelu_approximate="tanh", embed_scale=4.0, n_kv_heads=1, head_size=6,
                     logit_softcap=5.0),
}
METRICS = {"gpt2": AnswerMetric("logit_diff", 3, 5), "llama-gqa": AnswerMetric("prob", 3),
           "neox": AnswerMetric("logit_diff", 2, 11), "sandwich": AnswerMetric("prob", 12)}
FD_STEP = 1e-3
ABS_GRIDS = ("head_pos", "heads", "resid", "attn", "mlp")


def make(name: str | dict, seed: int = 0, dtype=torch.float32) -> DecoderLM:
    """A tiny model, its weights large enough that attention is far from uniform, frozen as the app freezes
    the weights it serves. In float64 its rotary tables are float64's too (the engine keeps float32's cos and
    sin, 1e-8 apart from the reference's), so that the engine and the reference compute one function."""
    torch.manual_seed(seed)
    options = CONFIGS[name] if isinstance(name, str) else name
    model = DecoderLM(ModelConfig(vocab_size=16, block_size=16, n_layers=2, n_heads=4, d_model=16, **options)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0 if p.dim() > 1 else 1.0)
    for p in model.parameters():
        p.requires_grad_(False)
    model = model.to(dtype)
    if dtype == torch.float64 and model.cfg.pos_encoding == "rope":
        angles = torch.from_numpy(rope_angles(model.cfg, 0, range(model.cfg.block_size)))
        model.rope_cos, model.rope_sin = angles.cos(), angles.sin()
    return model


@pytest.fixture
def rmsnorm_in_float64(monkeypatch):
    """The engine's RMSNorm takes any input that is not float32 through float32 (its path for 16-bit weights),
    which would round a float64 check to float32's precision; here a float64 input stays float64 (the
    same formula as its float32 path)."""
    def forward(self, x):
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.weight is None:
            return normed
        return (self.weight + self.offset if self.offset else self.weight) * normed
    monkeypatch.setattr(RMSNorm, "forward", forward)


def mixed(base: dict, source: dict, eps: float) -> dict:
    """A reference recording whose every activation is base + eps (source − base)."""
    def mix(b, s):
        return None if b is None else b + eps * (s - b)
    return {"head": [[mix(b, s) for b, s in zip(bl, sl)] for bl, sl in zip(base["head"], source["head"])],
            **{k: [mix(b, s) for b, s in zip(base[k], source[k])] for k in ("attn", "mlp", "resid")}}


def central_difference(f) -> float:
    """d/de f(e) at 0, central differences at h and h/2 combined by Richardson (error O(h^4))."""
    d1 = (f(FD_STEP) - f(-FD_STEP)) / (2 * FD_STEP)
    d2 = (f(FD_STEP / 2) - f(-FD_STEP / 2)) / FD_STEP
    return (4 * d2 - d1) / 3


def reference_directional(model, metric: AnswerMetric, base_ids, source_ids, grid: str) -> np.ndarray:
    """Per cell of `grid`: the derivative of the metric along the patch base → source of that cell, by
    central differences on the float64 reference forward."""
    cfg = model.cfg
    n_used = cfg.vocab_used or cfg.vocab_size
    _, base = reference(model, base_ids)
    _, source = reference(model, source_ids)
    sources = {}
    out = []
    for site in atp_grid_sites(cfg, grid, len(base_ids)):
        if grid == "mlp" and base["mlp"][site.layer] is None:
            out.append(np.nan)
            continue

        def f(eps):
            if eps not in sources:
                sources[eps] = mixed(base, source, eps)
            logits, _ = reference(model, base_ids, [(site.kind, site.layer, site.head, site.positions)], sources[eps])
            return metric_of(logits[-1], metric.kind, metric.answer, metric.other, n_used)
        out.append(central_difference(f))
    return np.array(out)


def assert_derivatives(estimate: np.ndarray, fd: np.ndarray, what: str) -> None:
    """Per cell, to 1e-6 relative; cells a billion times smaller than the largest, to that absolute size."""
    est, fd = estimate.ravel(), fd.ravel()
    assert np.array_equal(np.isnan(est), np.isnan(fd)), what
    ok = ~np.isnan(fd)
    atol = 1e-9 * np.abs(fd[ok]).max()
    bad = np.abs(est[ok] - fd[ok]) > 1e-6 * np.abs(fd[ok]) + atol
    assert not bad.any(), f"{what}: {np.flatnonzero(bad)[:5]} est {est[ok][bad][:3]} fd {fd[ok][bad][:3]}"


@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_estimate_is_gradient_times_difference_by_finite_differences(name, rmsnorm_in_float64):
    model = make(name, dtype=torch.float64)
    metric = METRICS[name]
    for direction in ("noising", "denoising"):
        att = attribute(model, A, B, metric, direction)
        base_ids, source_ids = (A, B) if direction == "noising" else (B, A)
        for grid in ABS_GRIDS:
            fd = reference_directional(model, metric, base_ids, source_ids, grid)
            assert_derivatives(att.estimates[grid], fd, f"{name} {direction} {grid}")
        # before the first token the texts differ in, the two runs are the same: nothing to patch
        assert np.all(att.estimates["head_pos"][:, :, 0] == 0) and np.all(att.estimates["resid"][:, 0] == 0)
        assert np.any(att.estimates["head_pos"][:, :, -1] != 0)
        # the metric on each text is the reference's
        n = model.cfg.vocab_size
        for ids, value in ((A, att.metric_a), (B, att.metric_b)):
            want = metric_of(reference(model, ids)[0][-1], metric.kind, metric.answer, metric.other, n)
            assert value == pytest.approx(want, rel=1e-12, abs=1e-12)


def test_the_options_of_nanochat_by_the_engines_own_patched_forward(rmsnorm_in_float64):
    """The reference does not write out nanochat's smear, x0 mix and backout; the engine's float64 patched
    forward along each patch gives the derivative instead (the smear model starts its graph from a recording)."""
    options = dict(pos_encoding="rope", norm_kind="rmsnorm", norm_weight=False, norm_bias=False, bias=False,
                   activation="relu2", smear_width=8, x0_mix=True, backout_layer=0, embed_norm=True)
    model = make(options, dtype=torch.float64)
    with torch.no_grad():  # the lambdas start at 0 (nothing mixed in): give each a part to play
        model.smear_lambda.fill_(0.7)
        model.backout_lambda.fill_(0.4)
        for blk in model.blocks:
            blk.x0_lambda.fill_(0.5)
    metric = AnswerMetric("logit_diff", 3, 5)
    att = attribute(model, A, B, metric)
    base, source = (model(torch.tensor([t]), record=True).activations for t in (A, B))

    def mix(eps):
        return Activations(*(tuple(None if b is None else b + eps * (s - b) for b, s in zip(getattr(base, f),
                           getattr(source, f))) for f in ("heads", "attn", "mlp", "residuals")))
    cache = {}
    for grid in ABS_GRIDS:
        sites = atp_grid_sites(model.cfg, grid, len(A))

        def f(eps):
            if eps not in cache:
                cache[eps] = mix(eps)
            rows = [PatchSite(s.kind, s.layer, s.head, s.positions, row=j) for j, s in enumerate(sites)]
            with torch.no_grad():
                out = model(torch.tensor([A] * len(sites)), patch=Patch(cache[eps], rows), return_residuals=True)
            x = out.residuals[-1][:, -1]  # the read-out in float64 (the forward's logits are float32)
            return metric.of(model.head(model.norm_f(x)), model.cfg).numpy()
        assert_derivatives(att.estimates[grid], central_difference(f), f"nanochat {grid}")


def test_where_the_metric_is_linear_in_a_site_the_estimate_is_exact():
    """Without a final norm the logit difference is linear in the last residual stream: patching it at the last
    position gives B's metric, and the estimate says so (share 1 of the difference, both directions)."""
    model = make(dict(norm="none", activation="relu"), dtype=torch.float64)
    for direction in ("noising", "denoising"):
        att = attribute(model, A, B, AnswerMetric("logit_diff", 3, 5), direction)
        want = att.metric_b - att.metric_a if direction == "noising" else att.metric_a - att.metric_b
        assert att.estimates["resid"][-1, -1] == pytest.approx(want, rel=1e-12)
        assert att.shares("resid")[-1, -1] == pytest.approx(1.0, rel=1e-12)
        assert np.all(att.estimates["resid"][-1, :-1] == 0)  # the last stream's other positions reach no logit


@pytest.mark.parametrize("name", ["gpt2", "llama-gqa"])
def test_the_tracked_forward_is_the_plain_recording_bit_for_bit(name):
    model = make(name)
    before = model(torch.tensor([A]), logits="last").logits
    with torch.inference_mode():  # the caller's inference mode does not keep the gradient from being taken
        att = attribute(model, A, B, METRICS[name])
    with torch.inference_mode():
        plain = [model(torch.tensor([ids]), record=True, logits="last") for ids in (A, B)]
    for got, want in ((att.base, plain[0].activations), (att.source, plain[1].activations)):
        for field in ("heads", "attn", "mlp", "residuals"):
            assert all(torch.equal(g, w) for g, w in zip(getattr(got, field), getattr(want, field))), field
    cfg = model.cfg
    assert att.metric_a == float(METRICS[name].of(plain[0].logits[:, -1], cfg)[0])
    assert att.metric_b == float(METRICS[name].of(plain[1].logits[:, -1], cfg)[0])
    # the model is left as it was: frozen, no gradient kept, the same forward
    assert not any(p.requires_grad or p.grad is not None for p in model.parameters())
    assert torch.equal(model(torch.tensor([A]), logits="last").logits, before)
    assert not att.base.residuals[0].requires_grad


def test_the_grids_are_the_labs_and_batches_keep_to_one_layer():
    entry = ModelEntry("tiny", make("llama-gqa"), None, {})
    cfg = entry.model.cfg
    for what in patching.SWEEPS:
        _, _, sites = patching.grid(entry, what, len(A))
        assert atp_grid_sites(cfg, what, len(A)) == sites
        for rows in (1, 3, 7, 73):
            chunks = list(sweep_chunks(sites, rows))
            assert [s for a, b in chunks for s in sites[a:b]] == sites  # every site once, in order
            assert all(b - a <= rows and len({s.layer for s in sites[a:b]}) == 1 for a, b in chunks)
            # a batch ends early only where the layer changes
            assert all(b - a == rows or b == len(sites) or sites[b].layer != sites[a].layer for a, b in chunks)
    head_pos = atp_grid_sites(cfg, "head_pos", len(A))
    assert len(head_pos) == 2 * 4 * 7 and head_pos[8] == PatchSite("head", 0, head=1, positions=(1,))


def lab_setup(model: DecoderLM, metric: AnswerMetric) -> patching.PatchSetup:
    """What lab.patching.prepare_sweep makes of A and B, for a model without a tokenizer (its own calls)."""
    entry = ModelEntry("tiny", model, None, {})
    m = patching.Metric(metric.kind, metric.answer, metric.other, "a", None if metric.other is None else "b")
    clean, corrupted = (float(m.of(patching._last_logits(entry, ids), entry)[0]) for ids in (A, B))
    return patching.PatchSetup(entry, A, B, m, clean, corrupted)


def check_against_the_labs_sweeps(setup: patching.PatchSetup, metric: AnswerMetric, k: int = 5) -> None:
    """For every lab sweep and direction: the top-k re-runs are the cells of the lab's sweep bit for bit, batched
    as the lab batches (and one cell alone against the sweep of one cell per batch)."""
    model, T = setup.entry.model, len(setup.ids_a)
    for direction in patching.DIRECTIONS:
        att = attribute(model, setup.ids_a, setup.ids_b, metric, direction)
        assert (att.metric_a, att.metric_b) == (setup.clean, setup.corrupted)
        for what in patching.SWEEPS:
            if what == "mlp" and model.cfg.ff_dim == 0:
                continue
            for rows, batch_tokens in ((max(1, patching.BATCH_TOKENS // T), None), (1, T)):
                cells = patching.sweep(setup, what, direction, batch_tokens=batch_tokens).metric
                check = verify_top(model, att, what, k, batch_rows=rows)
                assert len(check.cells) == min(k, cells.size) and not check.stopped
                for c in check.cells:
                    assert c.patched == cells[c.index], (direction, what, rows, c.name)
                    assert c.exact == c.patched - att.metric_base


@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_top_k_reruns_are_the_lab_sweeps_cells_bit_for_bit(name):
    model = make(name)
    check_against_the_labs_sweeps(lab_setup(model, METRICS[name]), METRICS[name])


def test_the_top_k_reruns_on_the_grammar_model_are_its_sweeps_cells():
    entry = BUILTINS.get("grammar (built-in)")
    setup = patching.prepare_sweep(entry, "anna found the key . she gave it to tom because he asked",
                                   "tom found the key . he gave it to anna because she asked", "logit_diff",
                                   " she", " he")
    check_against_the_labs_sweeps(setup, AnswerMetric("logit_diff", setup.metric.answer, setup.metric.other), k=4)


def test_head_by_position_reruns_are_single_patched_forwards():
    """The head × position grid has no lab sweep: each re-run is the engine's patched forward of that one site,
    with the patched text's own recording as its base, as the lab runs a cell."""
    model = make("neox")
    metric = METRICS["neox"]
    att = attribute(model, A, B, metric)
    check = verify_top(model, att, "head_pos", 6)
    ids = torch.tensor([A])
    for c in check.cells:
        with torch.inference_mode():
            logits = model(ids, patch=Patch(att.source, [c.site], base=att.base), logits="last").logits
        assert c.patched == float(metric.of(logits[:, -1], model.cfg)[0])
        assert c.site == PatchSite("head", c.index[0], head=c.index[1], positions=(c.index[2],))
    # largest estimated |effect| first
    sizes = [abs(c.estimate) for c in check.cells]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] == np.nanmax(np.abs(att.estimates["head_pos"]))


def test_the_flags_say_where_estimate_and_exact_part():
    model = make("gpt2")
    att = attribute(model, A, B, METRICS["gpt2"])
    check = verify_top(model, att, "resid", 8)
    assert check.abs_tol == ATP_ABS_SHARE * abs(att.metric_a - att.metric_b)
    for c in check.cells:
        assert c.abs_error == abs(c.estimate - c.exact)
        assert c.rel_error == pytest.approx(c.abs_error / abs(c.exact))
        assert c.disagrees == (c.abs_error > check.abs_tol and c.rel_error > check.rel_tol)
        assert c.sign_flip == (c.estimate * c.exact < 0 and min(abs(c.estimate), abs(c.exact)) > check.abs_tol)
        assert c.relative_change > 0
    strict = verify_top(model, att, "resid", 8, rel_tol=0.0, abs_tol=0.0)
    assert [c.disagrees for c in strict.cells] == [c.abs_error > 0 for c in strict.cells]
    assert strict.disagreements and not verify_top(model, att, "resid", 8, rel_tol=1e9).disagreements
    assert strict.cells[0].name in {f"after L{r} @{t}" for r in range(2) for t in range(7)} | \
        {f"embedding @{t}" for t in range(7)}


def test_progress_and_stop_between_phases():
    model = make("gpt2")
    metric = METRICS["gpt2"]
    seen = []
    att = attribute(model, A, B, metric, progress=lambda *p: seen.append(p))
    assert seen == [("source forward", 1, 3), ("base forward", 2, 3)] and not att.stopped
    for phases in range(3):  # stop asked before phase `phases + 1`: the run ends there
        asked = []

        def stop():
            asked.append(1)
            return len(asked) > phases
        steps = list(attribution_steps(model, A, B, metric, stop=stop))
        result = steps[-1].result
        assert result.stopped and steps[-1].phase == "stopped" and len(steps) == phases + 1
        assert all(np.isnan(v).all() for v in result.estimates.values())
        assert np.isnan(result.metric_b) == (phases < 1) and np.isnan(result.metric_a) == (phases < 2)
        with pytest.raises(ValueError, match="stopped before its backward pass"):
            verify_top(model, result, "resid")
    # verification: progress after each batch but the last; an Event set after the first batch stops the rest
    seen.clear()
    full = verify_top(model, att, "head_pos", 5, progress=lambda *p: seen.append(p))
    assert seen == [("exact re-runs", n, 5) for n in range(1, 5)] and len(full.cells) == 5
    event = threading.Event()
    part = verify_top(model, att, "head_pos", 5, progress=lambda *p: event.set(), stop=event)
    assert part.stopped and len(part.cells) == 1 and part.cells[0] == full.cells[0]
    # both at once: stopped before the estimates exist, an empty check
    done = attribute_and_verify(model, A, B, metric, "heads", stop=lambda: True)
    assert isinstance(done, AttributionCheck) and done.stopped and done.cells == []
    both = attribute_and_verify(model, A, B, metric, "heads", 3, progress=lambda *p: seen.append(p))
    assert len(both.cells) == 3 and not both.stopped and seen[-1][0] == "exact re-runs"


def test_refusals_say_what_is_wrong():
    model = make("gpt2")
    metric = METRICS["gpt2"]
    att = attribute(model, A, B, metric)
    bad = {
        "same number of tokens": lambda: attribute(model, A, B[:-1], metric),
        "non-empty": lambda: attribute(model, [], [], metric),
        "outside 0..15": lambda: attribute(model, A, [99] * 7, metric),
        "at most 16": lambda: attribute(model, [1] * 17, [2] * 17, metric),
        "direction must be": lambda: attribute(model, A, B, metric, "sideways"),
        "AnswerMetric": lambda: attribute(model, A, B, "logit_diff"),
        "out of range": lambda: attribute(model, A, B, AnswerMetric("prob", 16)),
        "metric kind": lambda: AnswerMetric("loss", 1),
        "needs two answer tokens": lambda: AnswerMetric("logit_diff", 1),
        "same token": lambda: AnswerMetric("logit_diff", 1, 1),
        "grid must be": lambda: verify_top(model, att, "neurons"),
        "positive whole": lambda: verify_top(model, att, "resid", 0),
        "no MLP": lambda: verify_top(make(dict(d_ff=0)), attribute(make(dict(d_ff=0)), A, B, metric), "mlp"),
    }
    for words, call in bad.items():
        with pytest.raises(ValueError, match=words):
            call()
    dropout = DecoderLM(ModelConfig(vocab_size=16, block_size=16, n_layers=1, n_heads=2, d_model=8, dropout=0.1))
    with pytest.raises(ValueError, match="eval mode"):
        attribute(dropout.train(), A, B, metric)


def test_a_model_without_mlps_has_no_mlp_estimates():
    model = make(dict(d_ff=0, attn_out_proj=False))
    att = attribute(model, A, B, METRICS["gpt2"])
    assert np.isnan(att.estimates["mlp"]).all() and np.isfinite(att.estimates["attn"]).all()
    assert set(att.estimates) == set(ATP_GRIDS)
    assert att.estimates["heads"] == pytest.approx(att.estimates["head_pos"].sum(-1), abs=0)
    # the exact runner, one batch of sites: row j takes site j
    sites = atp_grid_sites(model.cfg, "attn", len(A))
    got = exact_patched_metrics(model, torch.tensor([A]), att.base, att.source, sites, METRICS["gpt2"])
    assert got.shape == (len(sites),) and got.dtype == np.float64
