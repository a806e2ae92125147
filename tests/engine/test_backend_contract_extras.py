"""Two parts of the backend contract (model/backend.py) on the own engine and on nnsight
(model/nnsight_backend.py), on a small random folder of every family the nnsight backend reaches:

* the pre-softmax attention scores: both backends return the own engine's `scores` (scaled, soft-capped,
  -inf where the mask hides a key, local windows included) for the heads asked for, with and without an
  intervention, equal at 1e-5 on the finite entries and -inf on the same ones;
* a sweep in chunks (`patch_steps`): the chunks follow batch_tokens (one layer per chunk on the own engine,
  layers mixed on nnsight), join into exactly `patch_cells`' answer, agree across the backends, and a bad
  sweep is refused when it is asked for, before any forward runs.
"""

from __future__ import annotations

import pytest
import torch

from model.attention import causal_mask
from model.backend import PATCH_BATCH_TOKENS, ForwardRequest, OwnBackend, PatchRequest
from model.families import open_folder
from model.interventions import AttentionEdit, Intervention
from model.nnsight_backend import NnsightBackend, nnsight_available
from model.patching import PatchSite
from tests.support.family_folders import family_folder

if not nnsight_available():  # checked without importing it: nnsight gives every object a `.save`, which breaks
    # anyio's typed attributes if gradio is imported after it in the same process (the backend imports it on use)
    pytest.skip("the nnsight backend needs nnsight (requirements-scale.txt)", allow_module_level=True)

FAMILIES = ("gpt2", "neox", "llama", "llama3", "qwen2", "qwen3", "smollm3", "phi3", "olmo2", "gemma2", "gemma3")
PROMPT = "Once upon a time there was a little fox"
TOL = 1e-5


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """family -> (OwnBackend, NnsightBackend) on the same random folder, each made once."""
    root = tmp_path_factory.mktemp("families")
    made = {}

    def get(name):
        if name not in made:
            folder = family_folder(name, root)
            model, tok = open_folder(folder)
            made[name] = OwnBackend(model, tok), NnsightBackend(folder)
        return made[name]

    return get


def close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    """Equal at TOL, relative to the larger magnitude where that is above 1."""
    assert a.shape == b.shape, (what, a.shape, b.shape)
    scale = max(1.0, float(b.abs().max())) if b.numel() else 1.0
    diff = float((a - b).abs().max()) if b.numel() else 0.0
    assert diff <= TOL * scale, f"{what} differs by {diff:.2e} (scale {scale:.1f})"


def same_scores(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    """-inf on the same entries (and nothing else infinite or NaN), the finite ones equal at TOL."""
    assert a.shape == b.shape, (what, a.shape, b.shape)
    hidden = torch.isneginf(a)
    assert torch.equal(hidden, torch.isneginf(b)), f"{what}: -inf on other entries"
    assert bool(torch.isfinite(a[~hidden]).all() and torch.isfinite(b[~hidden]).all()), what
    close(a[~hidden], b[~hidden], what)


def text_ids(own) -> tuple[int, ...]:
    return tuple(own.tokenizer.encode(PROMPT))


@pytest.mark.parametrize("family", FAMILIES)
def test_the_scores_are_the_same_with_and_without_changes(pair, family):
    own, nn = pair(family)
    ids = text_ids(own)
    cfg, T, q = own.cfg, len(ids), len(ids) - 1
    L, H = cfg.n_layers, cfg.n_heads
    source = ids[:-3] + (ids[-2], ids[-3], ids[-1])
    changes = {
        "plain": {},
        "zero": {"intervention": Intervention(heads=[(0, 1)], mode="zero")},
        "uniform": {"intervention": Intervention(heads=[(0, 2), (L - 1, 0)], mode="uniform")},
        # one row onto the key before the query (inside every local window here), one row made uniform
        "edits": {"intervention": Intervention(edits=[AttentionEdit(0, 1, q, q - 1),
                                                      AttentionEdit(0, 3, q - 1, None)])},
        "patch": {"patch": PatchRequest(source, (PatchSite("resid", 1, positions=(T - 3,)),))},
    }
    got = {}
    for name, change in changes.items():
        request = ForwardRequest(ids, attention="all", scores=True, logits="all", **change)
        a, b = own.forward(request), nn.forward(request)
        assert a.scores.keys() == b.scores.keys() == a.attention.keys(), name
        for (layer, head), mine in a.scores.items():
            same_scores(mine, b.scores[layer, head], f"{family} {name} layer {layer} head {head}")
            # the own engine's mask, its local windows included, is where both hide a key
            hidden = causal_mask(T, T, window=cfg.window(layer))
            assert torch.equal(torch.isneginf(b.scores[layer, head]), hidden), (name, layer)
        got[name] = a
    plain = got["plain"].scores
    for name in ("zero", "edits", "uniform"):
        # what an intervention changes comes after layer 0's softmax: its scores are the model's own, and a later
        # layer's change with the residual stream they are read from
        for head in range(H):
            assert torch.equal(got[name].scores[0, head], plain[0, head]), (name, head)
        moved = max(float((got[name].scores[L - 1, h] - plain[L - 1, h]).nan_to_num(posinf=0, neginf=0).abs().max())
                    for h in range(H))
        assert moved > 1e-4, f"{name} changed no later score"
    # the edited row is still the row that was used, while its scores are the model's own
    assert float(got["edits"].attention[0, 1][q, q - 1]) == 1.0


def test_scores_come_for_the_heads_asked_for_only(pair):
    own, nn = pair("gemma2")
    ids = text_ids(own)
    chosen = ForwardRequest(ids, attention=[(1, 2), (0, 0)], scores=True)
    a, b = own.forward(chosen), nn.forward(chosen)
    assert set(a.scores) == set(b.scores) == {(0, 0), (1, 2)} and b.logits.shape == (1, own.cfg.vocab_size)
    for key in a.scores:
        same_scores(a.scores[key], b.scores[key], f"chosen {key}")
    without = ForwardRequest(ids, attention="all")
    assert own.forward(without).scores == {} and nn.forward(without).scores == {}
    with pytest.raises(ValueError, match="scores are returned for the heads attention names"):
        ForwardRequest(ids, scores=True)
    with pytest.raises(ValueError, match="scores must be true or false"):
        ForwardRequest(ids, attention="all", scores="yes")


def sweep_sites(cfg, T: int) -> list[PatchSite]:
    """Residual sites of every layer, then every head, then the branches: layers change along the list."""
    return ([PatchSite("resid", r, positions=(T - 3,)) for r in range(cfg.n_layers + 1)]
            + [PatchSite("head", l, head=h) for l in range(cfg.n_layers) for h in range(cfg.n_heads)]
            + [PatchSite(kind, l, positions=(T - 3,)) for kind in ("attn", "mlp") for l in range(cfg.n_layers)])


def one_layer_chunks(sites, per_chunk: int) -> list[int]:
    """The chunk sizes the own engine's sweep should make: runs of one layer, each cut every `per_chunk` sites."""
    sizes, start = [], 0
    while start < len(sites):
        stop = start + 1
        while stop < len(sites) and stop - start < per_chunk and sites[stop].layer == sites[start].layer:
            stop += 1
        sizes.append(stop - start)
        start = stop
    return sizes


@pytest.mark.parametrize("family", ["gpt2", "llama", "gemma2"])
def test_a_sweep_in_chunks_is_the_whole_sweep(pair, family):
    own, nn = pair(family)
    ids = text_ids(own)
    source = ids[:-3] + (ids[-2], ids[-3], ids[-1])
    T, V = len(ids), own.cfg.vocab_size
    sites = sweep_sites(own.cfg, T)
    cells = {b.name: b.patch_cells(ids, source, sites) for b in (own, nn)}
    close(cells["nnsight"], cells["own"], f"{family} cells")
    for backend in (own, nn):
        # by default the sweep is the batches of PATCH_BATCH_TOKENS, joined: exactly patch_cells
        whole = list(backend.patch_steps(ids, source, sites))
        assert torch.equal(torch.cat(whole), cells[backend.name]), backend.name
        assert sum(len(c) for c in whole) == len(sites) and all(len(c) <= PATCH_BATCH_TOKENS // T for c in whole)
        for batch_tokens in (3 * T + 1, T - 1):
            per_chunk = max(1, batch_tokens // T)
            chunks = list(backend.patch_steps(ids, source, sites, batch_tokens=batch_tokens))
            sizes = [len(c) for c in chunks]
            if backend is own:
                assert sizes == one_layer_chunks(sites, per_chunk), sizes
            else:  # nnsight: one session per chunk, its sites from any layers
                assert sizes == [min(per_chunk, len(sites) - s) for s in range(0, len(sites), per_chunk)], sizes
            assert all(c.shape[1:] == (V,) for c in chunks)
            close(torch.cat(chunks), cells[backend.name], f"{family} {backend.name} chunks of {batch_tokens} tokens")
    # a sweep of no site: no chunk, and patch_cells' (0, V)
    for backend in (own, nn):
        assert list(backend.patch_steps(ids, source, [])) == []
        assert backend.patch_cells(ids, source, []).shape == (0, V)


class Counting:
    """A model that counts its forwards (everything else is the wrapped model's)."""

    def __init__(self, model):
        self.model, self.calls = model, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.model(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.model, name)


def test_a_bad_sweep_is_refused_before_any_chunk_runs(pair, monkeypatch):
    own, nn = pair("llama")
    counted = Counting(own.model)
    own = OwnBackend(counted, own.tokenizer)
    sessions = []
    real_session = nn._session
    monkeypatch.setattr(nn, "_session", lambda *args: sessions.append(args) or real_session(*args))
    ids = text_ids(own)
    T, L, H = len(ids), own.cfg.n_layers, own.cfg.n_heads
    good = [PatchSite("head", 0, head=0)]
    bad = [(ids, good + [PatchSite("head", L, head=0)], None, f"patch layer {L} is out of range"),
           (ids, good + [PatchSite("head", 0, head=H)], None, f"patch head {H} is out of range"),
           (ids, [PatchSite("resid", 0, positions=(T,))], None, "out of range"),
           (ids, good + ["resid 0"], None, "PatchSite"),
           (ids, [PatchSite("head", 0, head=0, row=1)], None, "names no batch row"),
           (ids[:-1], good, None, "same length"),
           (ids, good, 0, "batch_tokens"),
           (ids, good, True, "batch_tokens"),
           (ids, good, 2.5, "batch_tokens")]
    for backend in (own, nn):
        for source, sites, batch_tokens, words in bad:
            # refused by the call itself, nothing iterated
            with pytest.raises(ValueError, match=words):
                backend.patch_steps(ids, source, sites, batch_tokens=batch_tokens)
        with pytest.raises(ValueError, match="model reads at most"):
            backend.patch_steps(ids * 10, ids * 10, good)
    assert counted.calls == 0 and sessions == []
    # a good sweep runs nothing until a chunk is asked for, and nothing more after the caller stops
    sites = [PatchSite("head", l, head=h) for l in range(L) for h in range(H)]
    ran = {"own": lambda: counted.calls, "nnsight": lambda: len(sessions)}
    for backend, per_chunk in ((own, 3), (nn, 1)):  # own: the source, the plain run, the chunk; nnsight: a session
        steps = backend.patch_steps(ids, ids, sites, batch_tokens=T)
        assert ran[backend.name]() == 0
        first = next(steps)
        assert first.shape == (1, own.cfg.vocab_size) and ran[backend.name]() == per_chunk
        steps.close()
        assert ran[backend.name]() == per_chunk
