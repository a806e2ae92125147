"""Activation patching in the engine (`DecoderLM.forward(patch=, record=)`, model/patching.py).

Nothing patched is the normal forward bit for bit; a recording is the forward's own activations; each
kind of patch (a head's output at all or some positions, the residual stream after the embedding or a
block, a block's attention or MLP output) equals a float64 forward written out from the weights with that
slice replaced (tests/support/patch_reference.py), on every positional encoding, norm, residual layout,
grouped keys, local windows and on random folders of the real families; many patched runs in one batch
equal their single forwards.
"""

from __future__ import annotations

import pytest
import torch

from model.config import ModelConfig
from model.interventions import AttentionEdit, Intervention
from model.patching import Patch, PatchSite
from model.transformer import DecoderLM, KVCache
from model.families import open_folder
from tests.support.patch_reference import FAMILIES, FAMILY_VOCAB, family_folder, one_thread, reference  # noqa: F401 (fixture)



TOL = 2e-5  # float32 forward against the float64 reference
CONFIGS = {
    "learned": dict(),
    "sinusoidal": dict(pos_encoding="sinusoidal"),
    "rope": dict(pos_encoding="rope"),
    "none": dict(pos_encoding="none"),
    "post-norm": dict(norm="post"),
    "no-norm-relu": dict(norm="none", activation="relu"),
    "no-ffn-no-proj": dict(d_ff=0, attn_out_proj=False),
    "neox": dict(pos_encoding="rope", rope_fraction=0.5, parallel_residual=True, gelu_approximate="tanh"),
    "llama": dict(pos_encoding="rope", norm_kind="rmsnorm", activation="swiglu", n_kv_heads=2, bias=False),
    "neo": dict(attn_window=(3, 0), attn_scale="none"),
    "bidirectional": dict(mask="bidirectional"),
    # the 2024-26 families' options: four norms per layer with (1 + w), GeGLU, the embedding's scale, heads
    # narrower or wider than d / heads, the query_pre_attn_scalar scale, soft-caps, q/k norms, a local layer
    # with its own rotary base, scaled rotary, norms after each branch, llama3 frequencies, a NoPE layer, ReLU²
    "gemma2": dict(pos_encoding="rope", norm="sandwich", norm_kind="rmsnorm", norm_offset=1.0, bias=False,
                   activation="geglu", gelu_approximate="tanh", embed_scale=4.0, n_kv_heads=1, head_size=6,
                   query_scale_dim=10, attn_softcap=3.0, logit_softcap=5.0, attn_window=(3, 0)),
    "gemma3": dict(pos_encoding="rope", norm="sandwich", norm_kind="rmsnorm", norm_offset=1.0, bias=False,
                   activation="geglu", qk_norm="head", n_kv_heads=2, head_size=10, query_scale_dim=12,
                   attn_window=(3, 0), local_rope_base=100.0, rope_scaling=("linear", 4.0)),
    "olmo2": dict(pos_encoding="rope", norm="post_branch", norm_kind="rmsnorm", bias=False, qkv_bias=True,
                  activation="swiglu", qk_norm="whole", n_kv_heads=2, head_size=6),
    "llama3-nope-relu2": dict(pos_encoding="rope", norm_kind="rmsnorm", norm_bias=False, activation="relu2",
                              pe_base=500000.0, rope_scaling=("llama3", 8.0, 1.0, 4.0, 256), rope_off_layers=(1,)),
}
A = [1, 2, 3, 4, 5, 6, 7]
B = [1, 9, 3, 4, 10, 6, 7]  # differs at positions 1 and 4; same last token


def make(name: str, seed: int = 0) -> DecoderLM:
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=16, block_size=16, n_layers=2, n_heads=4, d_model=16, **CONFIGS[name])
    model = DecoderLM(cfg).eval()
    with torch.no_grad():  # weights large enough that attention is far from uniform
        for p in model.parameters():
            p.mul_(4.0 if p.dim() > 1 else 1.0)
    return model


def run(model, ids, **kw):
    with torch.no_grad():
        return model(torch.tensor([ids] if isinstance(ids[0], int) else ids), **kw)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_nothing_patched_is_the_normal_forward_bit_for_bit(name):
    model = make(name)
    plain = run(model, B, return_attention=True, return_residuals=True)
    for kw in (dict(patch=None), dict(patch=Patch()), dict(record=True), dict(patch=Patch(), record=True)):
        out = run(model, B, return_attention=True, return_residuals=True, **kw)
        assert torch.equal(out.logits, plain.logits)
        assert all(torch.equal(a, b) for a, b in zip(out.attentions, plain.attentions))
        assert all(torch.equal(a, b) for a, b in zip(out.residuals, plain.residuals))
    # with an intervention and a cache too
    iv = Intervention(heads=[(0, 1)], mode="mean", edits=[AttentionEdit(1, 2, 3, 0)])
    assert torch.equal(run(model, B, intervention=iv, patch=Patch()).logits, run(model, B, intervention=iv).logits)
    if model.cfg.mask == "causal":  # a cache needs the causal mask
        c1 = run(model, B[:4], cache=KVCache([]))
        c2 = run(model, B[:4], cache=KVCache([]), patch=Patch())
        later = run(model, B[4:], cache=c2.cache, patch=Patch()).logits
        assert torch.equal(run(model, B[4:], cache=c1.cache).logits, later)
    assert plain.activations is None


@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_recording_is_the_forwards_own_activations(name):
    model = make(name)
    out = run(model, A, record=True, return_residuals=True)
    acts = out.activations
    assert all(torch.equal(a, b) for a, b in zip(acts.residuals, out.residuals))
    _, ref = reference(model, A)
    cfg = model.cfg
    assert acts.shape == (1, len(A))
    for layer in range(cfg.n_layers):
        assert acts.heads[layer].shape == (1, cfg.n_heads, len(A), cfg.head_dim)
        for h in range(cfg.n_heads):
            assert torch.allclose(acts.heads[layer][0, h].double(), ref["head"][layer][h], atol=TOL, rtol=0)
        assert torch.allclose(acts.attn[layer][0].double(), ref["attn"][layer], atol=TOL, rtol=0)
        if cfg.ff_dim:
            assert torch.allclose(acts.mlp[layer][0].double(), ref["mlp"][layer], atol=TOL, rtol=0)
        else:
            assert acts.mlp[layer] is None
    for i, r in enumerate(acts.residuals):
        assert torch.allclose(r[0].double(), ref["resid"][i], atol=TOL, rtol=0)


def sites_for(cfg: ModelConfig):
    """One site of each kind and shape: (kind, layer, head, positions)."""
    out = [("head", 0, 1, None), ("head", 1, 3, (4, 6)), ("resid", 0, None, (1,)), ("resid", 1, None, (4,)),
           ("resid", 2, None, (6,)), ("attn", 0, None, (1,)), ("attn", 1, None, None)]
    if cfg.ff_dim:
        out += [("mlp", 0, None, (4,)), ("mlp", 1, None, (1, 6))]
    return out


@pytest.mark.parametrize("name", list(CONFIGS))
def test_each_patch_equals_the_float64_forward_with_that_slice_replaced(name):
    model = make(name)
    cfg = model.cfg
    source = run(model, A, record=True).activations
    _, ref_source = reference(model, A)
    base_logits, _ = reference(model, B)
    for kind, layer, head, positions in sites_for(cfg):
        got = run(model, B, patch=Patch(source, [PatchSite(kind, layer, head, positions)])).logits[0].double()
        want, _ = reference(model, B, [(kind, layer, head, positions)], ref_source)
        assert torch.allclose(got, want, atol=TOL, rtol=0), (kind, layer, head, positions)
        if kind != "resid" or layer < cfg.n_layers:  # a patch that changes something moves the logits
            assert (want - base_logits).abs().max() > 1e-4, (kind, layer, head, positions)
    # several sites at once
    every = sites_for(cfg)[:3]
    got = run(model, B, patch=Patch(source, [PatchSite(*s) for s in every])).logits[0].double()
    assert torch.allclose(got, reference(model, B, every, ref_source)[0], atol=TOL, rtol=0)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_head_everywhere_or_the_last_residual_gives_the_clean_run(name):
    """With the same last token, the last position's logits are A's when every head's output in every
    layer comes from A (the MLPs there read what the heads wrote) or when the residual stream after the
    last block does; the other positions keep B's tokens."""
    model = make(name)
    cfg = model.cfg
    clean = run(model, A, record=True)
    source = clean.activations
    heads = [PatchSite("head", l, h) for l in range(cfg.n_layers) for h in range(cfg.n_heads)]
    last = [PatchSite("resid", cfg.n_layers, positions=(len(A) - 1,))]
    for sites in (heads, last):
        got = run(model, B, patch=Patch(source, sites)).logits[0, -1]
        assert torch.allclose(got, clean.logits[0, -1], atol=1e-5, rtol=0)
    assert not torch.allclose(run(model, B).logits[0, -1], clean.logits[0, -1], atol=1e-3)


@pytest.mark.parametrize("name", ["learned", "llama", "neox"])
def test_rows_of_a_batch_are_their_own_single_forwards(name):
    model = make(name)
    source = run(model, A, record=True).activations
    sites = [PatchSite("head", 1, 2), PatchSite("resid", 1, positions=(1,)), PatchSite("attn", 0, positions=(4,)),
             PatchSite("mlp", 1, positions=(6,)), PatchSite("head", 0, 0, positions=(1, 2))]
    batch = [PatchSite(s.kind, s.layer, s.head, s.positions, row=i) for i, s in enumerate(sites)]
    got = run(model, [B] * len(sites), patch=Patch(source, batch)).logits
    for i, s in enumerate(sites):
        alone = run(model, B, patch=Patch(source, [s])).logits[0]
        assert torch.allclose(got[i], alone, atol=1e-6, rtol=0), s
    # a source with the forward's own batch: each row takes its own
    both = run(model, [A, B], record=True).activations
    swapped = run(model, [B, A], patch=Patch(both, [PatchSite("resid", 0)])).logits
    assert torch.allclose(swapped, run(model, [A, B]).logits, atol=1e-6, rtol=0)
    assert torch.equal(both.row(1).residuals[0], both.residuals[0][1:])


def test_refusals_say_what_is_wrong():
    model = make("learned")
    source = run(model, A, record=True).activations
    bad = {
        "kind": lambda: PatchSite("neuron", 0),
        "needs a head": lambda: PatchSite("head", 0),
        "take none": lambda: PatchSite("resid", 0, head=1),
        "non-negative": lambda: PatchSite("attn", -1),
        "positions": lambda: PatchSite("attn", 0, positions=()),
        "Activations": lambda: Patch(None, [PatchSite("attn", 0)]),
    }
    for words, build in bad.items():
        with pytest.raises(ValueError, match=words):
            build()
    refused = {
        "out of range 0..1": [PatchSite("head", 2, 0)],
        "residual index 3": [PatchSite("resid", 3)],
        "head 4": [PatchSite("head", 0, 4)],
        "position 7": [PatchSite("attn", 0, positions=(7,))],
        "row 1": [PatchSite("attn", 0, row=1)],
    }
    for words, sites in refused.items():
        with pytest.raises(ValueError, match=words):
            run(model, B, patch=Patch(source, sites))
    with pytest.raises(ValueError, match="same length"):
        run(model, B[:5], patch=Patch(source, [PatchSite("attn", 0)]))
    with pytest.raises(ValueError, match="key/value cache"):
        run(model, B[:3], cache=run(model, B[:3], cache=KVCache([])).cache, patch=Patch(source, [PatchSite("attn", 0)]))
    with pytest.raises(ValueError, match="must be a Patch"):
        run(model, B, patch=[PatchSite("attn", 0)])
    no_ffn = make("no-ffn-no-proj")
    src = run(no_ffn, A, record=True).activations
    with pytest.raises(ValueError, match="no feed-forward"):
        run(no_ffn, B, patch=Patch(src, [PatchSite("mlp", 0)]))


@pytest.mark.slow  # transformers builds and saves each folder
@pytest.mark.parametrize("family", list(FAMILIES))
def test_patches_on_random_folders_of_the_real_families(family, tmp_path):
    model, tok = open_folder(family_folder(family, tmp_path))
    a, b = tok.encode("Once upon a time the fox"), tok.encode("Once upon a time the bear")
    if len(a) != len(b):  # keep the same length: replace one token of A in place
        b = a[:-2] + [(a[-2] + 7) % FAMILY_VOCAB] + a[-1:]
    source = run(model, a, record=True).activations
    _, ref_source = reference(model, a)
    for kind, layer, head, positions in sites_for(model.cfg):
        got = run(model, b, patch=Patch(source, [PatchSite(kind, layer, head, positions)])).logits[0].double()
        want, _ = reference(model, b, [(kind, layer, head, positions)], ref_source)
        assert torch.allclose(got, want, atol=1e-4, rtol=0), (family, kind, layer, head, positions)


@pytest.mark.parametrize("name", ["learned", "post-norm", "neox", "llama"])
def test_a_patch_with_its_inputs_own_run_skips_the_blocks_it_does_not_change(name):
    """With `base` (the recording of the patched input itself) a plain forward starts at the first block a
    site changes; the logits are those of the whole forward. Asked for more (attention, residuals, a
    recording, an intervention), the forward runs every block as usual."""
    model = make(name)
    source, own = run(model, A, record=True).activations, run(model, B, record=True).activations
    for sites in ([PatchSite("head", 1, 2)], [PatchSite("resid", 2, positions=(6,))], [PatchSite("mlp", 1, row=1)],
                  [PatchSite("attn", 1, positions=(4,)), PatchSite("resid", 1, positions=(1,), row=0)]):
        whole = run(model, [B, B], patch=Patch(source, sites)).logits
        skipped = run(model, [B, B], patch=Patch(source, sites, base=own)).logits
        assert torch.allclose(skipped, whole, atol=1e-6, rtol=0), sites
        full = run(model, [B, B], patch=Patch(source, sites, base=own), return_attention=True, return_residuals=True)
        assert torch.allclose(full.logits, whole, atol=1e-5, rtol=0)  # the written-out attention path
        assert len(full.attentions) == model.cfg.n_layers and len(full.residuals) == model.cfg.n_layers + 1
    # a base of the wrong length is refused like a source
    with pytest.raises(ValueError, match="base run has 5 positions"):
        run(model, B, patch=Patch(source, [PatchSite("head", 1, 2)], base=run(model, B[:5], record=True).activations))
