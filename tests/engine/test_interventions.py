"""Head ablation, attention edits and the logit lens, held against slow by-hand forwards.

The by-hand forward below recomputes attention head by head from the modules' own weights
(q/k/v slices of the fused projection, RoPE written out, mask, softmax, weighted sum), applies
the intervention to that head's slice of the concatenated head outputs before the output
projection, and reuses the norms / feed-forward modules (tested elsewhere) around it.
"""


import pytest
import torch

from model.config import ModelConfig
from model.interventions import ABLATION_MODE_WORDS, ABLATION_MODES, AttentionEdit, Intervention
from model.transformer import DecoderLM, KVCache, logit_lens
from tests.support.by_hand import by_hand

PE = ["sinusoidal", "learned", "rope", "none"]
NORM_ACT = [("pre", "gelu"), ("post", "relu"), ("none", "swiglu")]
MASKS = ["causal", "bidirectional"]


def small(**kw) -> ModelConfig:
    base = dict(vocab_size=13, block_size=24, n_layers=2, n_heads=3, d_model=18)
    return ModelConfig(**{**base, **kw})


def make(seed=0, **kw) -> DecoderLM:
    torch.manual_seed(seed)
    model = DecoderLM(small(**kw)).double().eval()
    std = 0.15 if model.cfg.norm == "none" else 0.4  # without norms the stream grows layer by layer
    with torch.no_grad():  # larger weights than the gpt2 init, so every head matters
        for p in model.parameters():
            p.normal_(0.0, std)
    return model


def ids_for(model, B=2, T=9, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.cfg.vocab_size, (B, T), generator=g)


def close(a, b):
    # float64 throughout; RoPE tables are float32-rounded in the model, hence 1e-6 rather than 1e-12
    return torch.allclose(a, b, atol=1e-6, rtol=1e-6)


def seeded_model(pe, norm, act, mask):
    """A small model of that configuration (seed 0, eval mode) and a text for it."""
    torch.manual_seed(0)
    model = DecoderLM(small(pos_encoding=pe, norm=norm, activation=act, mask=mask)).eval()
    return model, ids_for(model)


# ----------------------------------------------------------------------------------------
# no intervention: bit for bit the normal forward


@pytest.mark.parametrize("pe", PE)
@pytest.mark.parametrize("norm,act", NORM_ACT)
@pytest.mark.parametrize("mask", MASKS)
def test_empty_intervention_is_bit_for_bit_normal_forward(pe, norm, act, mask):
    model, ids = seeded_model(pe, norm, act, mask)
    everyone = [(l, h) for l in range(2) for h in range(3)]
    empties = [Intervention(), Intervention(heads=everyone, keep_only=True, mode="uniform")]
    with torch.no_grad():
        for want in (False, True):
            ref = model(ids, return_attention=want)
            for iv in empties:
                out = model(ids, return_attention=want, intervention=iv)
                assert torch.equal(out.logits, ref.logits)
                if want:
                    for a, b in zip(out.attentions + out.scores, ref.attentions + ref.scores):
                        assert torch.equal(a, b)
                else:
                    assert out.attentions is None and out.scores is None


@pytest.mark.parametrize("pe", PE)
def test_empty_intervention_with_cache_is_unchanged(pe):
    torch.manual_seed(0)
    model = DecoderLM(small(pos_encoding=pe)).eval()
    ids = ids_for(model, T=8)
    with torch.no_grad():
        for want in (False, True):
            c1, c2 = KVCache([]), KVCache([])
            for chunk in (ids[:, :3], ids[:, 3:4], ids[:, 4:]):
                a = model(chunk, return_attention=want, cache=c1)
                b = model(chunk, return_attention=want, cache=c2, intervention=Intervention())
                c1, c2 = a.cache, b.cache
                assert torch.equal(a.logits, b.logits)
                for la, lb in zip(c1.layers, c2.layers):
                    assert torch.equal(la.k, lb.k) and torch.equal(la.v, lb.v)
                if want:
                    for x, y in zip(a.attentions + a.scores, b.attentions + b.scores):
                        assert torch.equal(x, y)


# ----------------------------------------------------------------------------------------
# ablation against the by-hand forward


@pytest.mark.parametrize("mode", ABLATION_MODES)
@pytest.mark.parametrize("pe", PE)
@pytest.mark.parametrize("norm,act", NORM_ACT)
@pytest.mark.parametrize("mask", MASKS)
def test_ablation_matches_by_hand(mode, pe, norm, act, mask):
    model = make(pos_encoding=pe, norm=norm, activation=act, mask=mask)
    ids = ids_for(model)
    heads = {(0, 1), (1, 2)}
    with torch.no_grad():
        plain, _ = by_hand(model, ids)
        assert close(model(ids).logits, plain)  # the reference itself is right
        ref, ref_w = by_hand(model, ids, ablate=heads, mode=mode)
        for want in (False, True):
            out = model(ids, return_attention=want, intervention=Intervention(heads=heads, mode=mode))
            assert close(out.logits, ref)
            assert not close(out.logits, plain)  # the ablation did something
            if want:
                for w, r in zip(out.attentions, ref_w):
                    assert close(w, r)  # the weights actually used (uniform rows for "uniform")


@pytest.mark.parametrize(
    "cfg_kw", [dict(attn_out_proj=False), dict(d_ff=0), dict(bias=False, tie_weights=True)]
)
def test_zero_ablation_other_variants(cfg_kw):
    model = make(**cfg_kw)
    ids = ids_for(model)
    with torch.no_grad():
        ref, _ = by_hand(model, ids, ablate={(0, 0)}, mode="zero")
        assert close(model(ids, intervention=Intervention(heads=[(0, 0)])).logits, ref)


@pytest.mark.parametrize("mask", MASKS)
def test_uniform_ablation_returns_uniform_rows(mask):
    model = make(mask=mask)
    ids = ids_for(model, T=6)
    out = model(ids, return_attention=True, intervention=Intervention(heads=[(1, 0)], mode="uniform"))
    w = out.attentions[1][:, 0]
    T = 6
    if mask == "causal":
        expected = torch.tensor([[1.0 / (i + 1) if k <= i else 0.0 for k in range(T)] for i in range(T)])
    else:
        expected = torch.full((T, T), 1.0 / T)
    assert close(w, expected.double().expand_as(w))
    # scores are still the model's own pre-softmax scores
    assert torch.equal(out.scores[1], model(ids, return_attention=True).scores[1])


def test_every_ablation_mode_has_its_words_beside_its_rule():
    # the Mode choice (its label) and the line that says what is changed (its past participle) read this one
    # table, so a mode is added with its words or the page cannot name it
    assert list(ABLATION_MODE_WORDS) == list(ABLATION_MODES)
    labels = [w.label for w in ABLATION_MODE_WORDS.values()]
    assert all(w.label and w.done for w in ABLATION_MODE_WORDS.values()) and len(set(labels)) == len(labels)


@pytest.mark.parametrize("mode", ABLATION_MODES)
def test_keep_only_equals_ablating_all_others(mode):
    model = make(pos_encoding="rope")
    ids = ids_for(model)
    keep = [(0, 2), (1, 1)]
    others = [(l, h) for l in range(2) for h in range(3) if (l, h) not in keep]
    a = model(ids, return_attention=True, intervention=Intervention(heads=keep, mode=mode, keep_only=True))
    b = model(ids, return_attention=True, intervention=Intervention(heads=others, mode=mode))
    assert torch.equal(a.logits, b.logits)
    for x, y in zip(a.attentions, b.attentions):
        assert torch.equal(x, y)
    ref, _ = by_hand(model, ids, ablate=set(others), mode=mode)
    assert close(a.logits, ref)


# ----------------------------------------------------------------------------------------
# attention edits


@pytest.mark.parametrize("pe", PE)
@pytest.mark.parametrize("norm,act", NORM_ACT)
@pytest.mark.parametrize("mask", MASKS)
def test_attention_edit_to_one_key(pe, norm, act, mask):
    model = make(pos_encoding=pe, norm=norm, activation=act, mask=mask)
    ids = ids_for(model, T=8)
    q, k = 6, 2
    edit = AttentionEdit(layer=0, head=1, query=q, key=k)
    with torch.no_grad():
        before = model(ids).logits
        out = model(ids, return_attention=True, intervention=Intervention(edits=[edit]))
        row = out.attentions[0][:, 1, q]
        assert torch.equal(row, torch.nn.functional.one_hot(torch.tensor(k), 8).double().expand_as(row))
        ref, _ = by_hand(model, ids, edits=[edit])
        assert close(out.logits, ref)
        p_before, p_after = before.softmax(-1), out.logits.softmax(-1)
        assert close(p_after, ref.softmax(-1))
        assert not close(p_after[:, q], p_before[:, q])  # the query's own next-token distribution moved
        if mask == "causal":  # earlier positions cannot see the edit
            assert close(p_after[:, :q], p_before[:, :q])


@pytest.mark.parametrize("mask", MASKS)
def test_attention_edit_uniform_row(mask):
    model = make(mask=mask, pos_encoding="rope")
    ids = ids_for(model, T=7)
    edit = AttentionEdit(layer=1, head=2, query=4)
    out = model(ids, return_attention=True, intervention=Intervention(edits=[edit]))
    n = 5 if mask == "causal" else 7
    row = out.attentions[1][:, 2, 4]
    assert close(row[:, :n], torch.full((2, n), 1.0 / n, dtype=torch.double))
    assert torch.all(row[:, n:] == 0)
    ref, _ = by_hand(model, ids, edits=[edit])
    assert close(out.logits, ref)


def test_edit_and_ablation_together():
    model = make()
    ids = ids_for(model)
    iv = Intervention(heads=[(1, 0)], mode="mean", edits=[AttentionEdit(0, 2, 5, 0)])
    ref, _ = by_hand(model, ids, ablate={(1, 0)}, mode="mean", edits=iv.edits)
    assert close(model(ids, intervention=iv).logits, ref)


# ----------------------------------------------------------------------------------------
# cache path under an intervention


@pytest.mark.parametrize("pe", PE)
def test_intervention_with_cache_matches_full_forward(pe):
    model = make(pos_encoding=pe)
    ids = ids_for(model, T=8)
    for iv in (
        Intervention(heads=[(0, 1)], mode="zero"),
        Intervention(heads=[(1, 2)], mode="uniform"),
        Intervention(edits=[AttentionEdit(0, 0, 7, 3)]),
    ):
        full = model(ids, intervention=iv).logits
        cache, parts = KVCache([]), []
        for chunk in (ids[:, :5], ids[:, 5:7], ids[:, 7:]):
            edits_here = Intervention(
                heads=iv.heads,
                mode=iv.mode,
                edits=[e for e in iv.edits if cache.length <= e.query < cache.length + chunk.shape[1]],
            )
            out = model(chunk, cache=cache, intervention=edits_here)
            cache = out.cache
            parts.append(out.logits)
        assert close(torch.cat(parts, dim=1), full)


# ----------------------------------------------------------------------------------------
# refused interventions


@pytest.mark.parametrize(
    "make_iv, fragment",
    [
        (lambda: Intervention(heads=[(2, 0)]), "layer 2 is out of range; the model has layers 0..1"),
        (lambda: Intervention(heads=[(0, 3)]), "head 3 is out of range; each layer has heads 0..2"),
        (lambda: Intervention(edits=[AttentionEdit(0, 0, 3, 5)]), "key 5 is masked for query 3"),
        (lambda: Intervention(edits=[AttentionEdit(0, 0, 9)]), "query 9 is out of range"),
        (lambda: Intervention(edits=[AttentionEdit(5, 0, 1)]), "layer 5 is out of range"),
        (lambda: Intervention(heads=[(0, 0)], edits=[AttentionEdit(0, 0, 1, 0)]), "both ablated"),
        (lambda: Intervention(edits=[AttentionEdit(0, 1, 1, 0)], heads=[(0, 1)], keep_only=True), None),
    ],
)
def test_refused_against_model(make_iv, fragment):
    model = make()
    ids = ids_for(model, T=9)
    iv = make_iv()
    if fragment is None:  # keep_only: the listed head is kept, so editing it is fine
        model(ids, intervention=iv)
        return
    with pytest.raises(ValueError, match=fragment):
        model(ids, intervention=iv)


@pytest.mark.parametrize(
    "build, fragment",
    [
        (
            lambda: Intervention(heads=[(0, 0)], mode="shuffle"),
            "ablation mode must be one of zero, mean, uniform",
        ),
        (lambda: Intervention(heads=[(0,)]), r"\(layer, head\) pair"),
        (lambda: Intervention(heads=[(0, -1)]), r"\(layer, head\) pair"),
        (lambda: Intervention(heads="0,1"), "list of"),
        (lambda: Intervention(heads=[(0, 1), (0, 1)]), "more than once"),
        (lambda: Intervention(keep_only="yes"), "keep_only must be true or false"),
        (lambda: Intervention(edits=[(0, 0, 1, 0)]), "AttentionEdit"),
        (lambda: AttentionEdit(0, 0, -1), "query must be a non-negative integer"),
        (lambda: AttentionEdit(0, 0, 1, key=1.5), "key must be a non-negative integer or None"),
        (lambda: Intervention(edits=[AttentionEdit(0, 0, 1, 0), AttentionEdit(0, 0, 1)]), "two edits"),
    ],
)
def test_refused_when_built(build, fragment):
    with pytest.raises(ValueError, match=fragment):
        build()


def test_refused_with_cache_and_bidirectional_key_range():
    model = make()
    ids = ids_for(model, T=6)
    out = model(ids[:, :4], cache=KVCache([]))
    with pytest.raises(ValueError, match="mean ablation .* key/value cache"):
        model(ids[:, 4:], cache=out.cache, intervention=Intervention(heads=[(0, 0)], mode="mean"))
    with pytest.raises(ValueError, match="query 2 is out of range: the text has positions 4..5"):
        model(ids[:, 4:], cache=out.cache, intervention=Intervention(edits=[AttentionEdit(0, 0, 2, 1)]))
    bi = make(mask="bidirectional")
    bi(ids, intervention=Intervention(edits=[AttentionEdit(0, 0, 1, 5)]))  # later key allowed here
    with pytest.raises(ValueError, match="key 6 is out of range"):
        bi(ids, intervention=Intervention(edits=[AttentionEdit(0, 0, 1, 6)]))
    with pytest.raises(ValueError, match="must be an Intervention"):
        model(ids, intervention={"heads": [(0, 0)]})


def test_validate_against_config_without_text():
    cfg = small()
    # without a text length only layers and heads are checked
    Intervention(heads=[(1, 2)], edits=[AttentionEdit(0, 0, 50, 40)]).validate(cfg)
    with pytest.raises(ValueError, match="layer 2"):
        Intervention(heads=[(2, 0)]).validate(cfg)
    others = {(0, 1), (0, 2), (1, 0), (1, 1), (1, 2)}
    assert Intervention(heads=[(0, 0)], keep_only=True).ablated_heads(cfg) == others


# ----------------------------------------------------------------------------------------
# logit lens


@pytest.mark.parametrize("pe", PE)
@pytest.mark.parametrize("norm,act", NORM_ACT)
@pytest.mark.parametrize("mask", MASKS)
def test_logit_lens_last_layer_is_the_models_logits_exactly(pe, norm, act, mask):
    model, ids = seeded_model(pe, norm, act, mask)
    with torch.no_grad():
        plain = model(ids)
        out = model(ids, return_residuals=True)
        assert plain.residuals is None
        assert torch.equal(out.logits, plain.logits)  # asking for residuals changes nothing
        assert len(out.residuals) == model.cfg.n_layers + 1
        lens = logit_lens(model, out.residuals)
        assert lens.shape == (3, 2, 9, 13)
        assert torch.equal(lens[-1], out.logits)
        # index 0 is the embedding (+ positions), read through the final norm and head
        assert close(lens[0].double(), model.head(model.norm_f(out.residuals[0])).double())
        assert logit_lens(model, out.residuals[1:]).shape[0] == model.cfg.n_layers
        # under an intervention the lens reads the intervened stream, still exact at the end
        iv = model(ids, return_residuals=True, intervention=Intervention(heads=[(0, 0)]))
        assert torch.equal(logit_lens(model, iv.residuals)[-1], iv.logits)


def test_logit_lens_residuals_follow_blocks():
    model = make(pos_encoding="rope")
    ids = ids_for(model)
    out = model(ids, return_residuals=True)
    # residual after block 0 equals the by-hand forward of a one-layer truncation
    one = DecoderLM(model.cfg.replace(n_layers=1)).double()
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("blocks.1.")}
    one.load_state_dict(state)
    assert close(one(ids, return_residuals=True).residuals[-1], out.residuals[1])
    lens = logit_lens(model, out.residuals)
    assert close(lens[1], one.head(one.norm_f(out.residuals[1])))
    with pytest.raises(ValueError, match="at least one"):
        logit_lens(model, ())
