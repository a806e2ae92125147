"""The transformer itself: config validation, attention exactness, cache, positional tables."""

import math

import pytest
import torch
import torch.nn.functional as F

from model.config import ModelConfig
from model.attention import causal_mask
from model.transformer import DecoderLM, KVCache, sinusoidal_table

PE = ["sinusoidal", "learned", "rope", "none"]


def small(**kw) -> ModelConfig:
    base = dict(vocab_size=13, block_size=24, n_layers=2, n_heads=2, d_model=16)
    return ModelConfig(**{**base, **kw})


@pytest.mark.parametrize(
    "kw, fragment",
    [
        (dict(d_model=30, n_heads=4), "divisible by n_heads"),
        (dict(pos_encoding="alibi"), "pos_encoding must be one of"),
        (dict(norm="peri"), "norm must be one of"),
        (dict(activation="tanh"), "activation must be one of"),
        (dict(mask="sliding"), "mask must be one of"),
        (dict(n_layers=0), "n_layers must be a positive integer"),
        (dict(vocab_size=-3), "vocab_size must be a positive integer"),
        (dict(block_size=2.5), "block_size must be a positive integer"),
        (dict(d_model=12, n_heads=4, pos_encoding="rope"), "head size"),
        (dict(dropout=1.5), "dropout"),
        (dict(d_ff=-1), "d_ff"),
        (dict(bias="yes"), "bias must be true or false"),
    ],
)
def test_invalid_config_says_what_to_change(kw, fragment):
    with pytest.raises(ValueError, match=fragment):
        small(**kw)


def test_config_round_trip_and_unknown_fields():
    cfg = small(pos_encoding="rope", activation="swiglu", tie_weights=True)
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="unknown config fields"):
        ModelConfig.from_dict({**cfg.to_dict(), "n_experts": 8})
    with pytest.raises(ValueError):
        ModelConfig.from_dict([1, 2])


@pytest.mark.parametrize("pe", PE)
@pytest.mark.parametrize("norm,act", [("pre", "gelu"), ("post", "relu"), ("none", "swiglu")])
def test_param_count_from_config_matches_model(pe, norm, act):
    for tie in (False, True):
        cfg = small(pos_encoding=pe, norm=norm, activation=act, tie_weights=tie, bias=not tie, head_bias=tie)
        assert cfg.n_params() == DecoderLM(cfg).n_params()


@pytest.mark.parametrize("pe", PE)
@pytest.mark.parametrize("mask", ["causal", "bidirectional"])
def test_fused_and_explicit_paths_agree(pe, mask):
    torch.manual_seed(0)
    model = DecoderLM(small(pos_encoding=pe, mask=mask)).eval()
    ids = torch.randint(0, 13, (3, 20))
    fast = model(ids)
    slow = model(ids, return_attention=True)
    assert fast.attentions is None and fast.scores is None
    assert torch.allclose(fast.logits, slow.logits, atol=1e-5)
    assert len(slow.attentions) == 2 and slow.attentions[0].shape == (3, 2, 20, 20)


@pytest.mark.parametrize("pe", PE)
def test_attention_is_causal_rows_sum_to_one(pe):
    torch.manual_seed(1)
    model = DecoderLM(small(pos_encoding=pe)).eval()
    out = model(torch.randint(0, 13, (2, 17)), return_attention=True)
    future = torch.triu(torch.ones(17, 17, dtype=torch.bool), diagonal=1)
    for att, sc in zip(out.attentions, out.scores):
        assert torch.all(att[..., future] == 0.0)  # exactly zero, not merely small
        assert torch.all(att[..., ~future] > 0)
        assert torch.allclose(att.sum(-1), torch.ones(2, 2, 17), atol=1e-6)
        assert torch.all(torch.isneginf(sc[..., future])) and torch.all(torch.isfinite(sc[..., ~future]))
        assert torch.allclose(torch.softmax(sc, -1), att)


def test_future_tokens_do_not_change_the_past():
    torch.manual_seed(2)
    model = DecoderLM(small()).eval()
    ids = torch.randint(0, 13, (1, 12))
    changed = ids.clone()
    changed[0, 8:] = (changed[0, 8:] + 1) % 13
    a, b = model(ids, return_attention=True), model(changed, return_attention=True)
    assert torch.allclose(a.logits[:, :8], b.logits[:, :8], atol=1e-6)
    assert torch.allclose(a.attentions[1][:, :, :8, :8], b.attentions[1][:, :, :8, :8], atol=1e-6)


def test_bidirectional_mask_sees_the_future():
    model = DecoderLM(small(mask="bidirectional")).eval()
    att = model(torch.randint(0, 13, (1, 9)), return_attention=True).attentions[0]
    assert torch.all(att > 0)
    with pytest.raises(ValueError, match="cache"):
        cache = model(torch.tensor([[1]]), cache=KVCache([])).cache
        model(torch.tensor([[2]]), cache=cache)


@pytest.mark.parametrize("pe", PE)
@pytest.mark.parametrize("chunk", [1, 3])
def test_cache_equals_full_forward(pe, chunk):
    torch.manual_seed(3)
    model = DecoderLM(small(pos_encoding=pe, activation="swiglu")).eval()
    ids = torch.randint(0, 13, (2, 18))
    full = model(ids, return_attention=True)
    cache = KVCache([])
    for t in range(0, 18, chunk):
        out = model(ids[:, t : t + chunk], return_attention=True, cache=cache)
        cache = out.cache
        n = out.logits.shape[1]
        assert torch.allclose(out.logits, full.logits[:, t : t + n], atol=1e-5)
        for layer in range(2):
            rows = out.attentions[layer]
            assert rows.shape[-1] == t + n
            assert torch.allclose(rows, full.attentions[layer][:, :, t : t + n, : t + n], atol=1e-5)
        # the fused path with a cache gives the same logits too
    assert cache.length == 18
    fast = KVCache([])
    for t in range(0, 18, chunk):
        out = model(ids[:, t : t + chunk], cache=fast)
        fast = out.cache
        assert torch.allclose(out.logits, full.logits[:, t : t + out.logits.shape[1]], atol=1e-5)


def test_context_limit_is_enforced():
    model = DecoderLM(small(block_size=8)).eval()
    with pytest.raises(ValueError, match="exceed the context"):
        model(torch.zeros(1, 9, dtype=torch.long))
    cache = model(torch.zeros(1, 8, dtype=torch.long), cache=KVCache([])).cache
    with pytest.raises(ValueError, match="exceed the context"):
        model(torch.zeros(1, 1, dtype=torch.long), cache=cache)


def test_sinusoidal_matches_article_001_worked_values():
    table = sinusoidal_table(20, 4)
    assert table[0].tolist() == [0.0, 1.0, 0.0, 1.0]  # "how" at position 0
    for pos in (1, 3, 7, 19):
        for i in range(2):
            angle = pos / 10000 ** (2 * i / 4)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)
    assert table[1].tolist() == pytest.approx([math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)], abs=1e-6)


def first_block_input(model: DecoderLM, ids: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
    """What the model feeds its first block (embeddings plus positions), caught by a pre-hook."""
    seen = []
    handle = model.blocks[0].register_forward_pre_hook(lambda module, args: seen.append(args[0].detach().clone()))
    try:
        with torch.no_grad():
            model(ids, cache=cache)
    finally:
        handle.remove()
    return seen[0]


@pytest.mark.parametrize("pe", ["sinusoidal", "learned"])
def test_positional_table_is_what_the_model_adds(pe):
    torch.manual_seed(5)
    model = DecoderLM(small(pos_encoding=pe, d_model=16)).eval()
    ids = torch.tensor([[3, 3, 3, 3, 7, 1]])
    kind, table = model.positional_table()
    assert kind == pe and table.shape == (24, 16)
    with torch.no_grad():
        tok = model.tok_emb(ids)
    x = first_block_input(model, ids)
    assert torch.allclose(x, tok + table[:6], atol=1e-6)
    assert not torch.allclose(x[0, 0], x[0, 1])  # same token, different positions
    # after a 2-token cache, the new tokens get positions 2.. of the table, not 0..
    cache = model(ids[:, :2], cache=KVCache([])).cache
    assert torch.allclose(first_block_input(model, ids[:, 2:], cache), tok[:, 2:] + table[2:6], atol=1e-6)
    # without the table the input is the token embeddings alone: the table is really used
    with torch.no_grad():
        (model.pos_emb.weight if pe == "learned" else model.pe_table).zero_()
    zeroed = first_block_input(model, ids)
    assert torch.equal(zeroed, tok) and not torch.allclose(zeroed, x)


def test_no_positional_encoding_adds_nothing():
    model = DecoderLM(small(pos_encoding="none")).eval()
    assert model.positional_table() == ("none", None)
    ids = torch.tensor([[3, 3, 5]])
    with torch.no_grad():
        assert torch.equal(first_block_input(model, ids), model.tok_emb(ids))


def test_rope_table_is_the_rotation_the_attention_applies():
    torch.manual_seed(6)
    model = DecoderLM(small(pos_encoding="rope", n_layers=1)).eval()
    kind, angles = model.positional_table()
    assert kind == "rope" and angles.shape == (24, 4)  # (block_size, head_dim / 2)
    assert angles[5, 0].item() == pytest.approx(5.0)  # the first pair turns one radian per position
    ids = torch.tensor([[4, 9, 4, 2, 11]])
    T, H, hd = 5, 2, 8
    x = first_block_input(model, ids)
    assert torch.equal(x, model.tok_emb(ids).detach())  # RoPE adds nothing to the input
    with torch.no_grad():
        blk = model.blocks[0]
        q, k, _ = blk.attn.qkv(blk.norm1(x)).view(1, T, 3, H, hd).permute(2, 0, 3, 1, 4)  # each (1, H, T, hd)
        cos, sin = angles[:T].cos(), angles[:T].sin()  # (T, hd/2)

        def rotate(v):  # each pair (v[2i], v[2i+1]) turned by its angle, written out
            out = torch.empty_like(v)
            out[..., 0::2] = v[..., 0::2] * cos - v[..., 1::2] * sin
            out[..., 1::2] = v[..., 0::2] * sin + v[..., 1::2] * cos
            return out

        by_hand = rotate(q) @ rotate(k).transpose(-2, -1) / math.sqrt(hd)  # (1, H, T, T)
        scores = model(ids, return_attention=True).scores[0]
    lower = torch.tril(torch.ones(T, T, dtype=torch.bool))
    assert torch.allclose(scores[..., lower], by_hand[..., lower], atol=1e-5)


def test_rope_attention_depends_only_on_relative_position():
    torch.manual_seed(4)
    model = DecoderLM(small(pos_encoding="rope", n_layers=1)).eval()
    a = model(torch.tensor([[5, 6, 7]]), return_attention=True).scores[0]
    b = model(torch.tensor([[1, 1, 5, 6, 7]]), return_attention=True).scores[0]
    # the first layer's score between "7" and "5" is the same at any absolute offset
    assert torch.allclose(a[0, :, 2, 0], b[0, :, 4, 2], atol=1e-5)


def post_norm_log_probs_by_hand(model: DecoderLM, ids: torch.Tensor) -> torch.Tensor:
    """The article 004 model written out with plain tensor operations and the model's weights."""
    cfg = model.cfg
    B, T = ids.shape
    C, H, hd = cfg.d_model, cfg.n_heads, cfg.head_dim
    pos = torch.arange(T, dtype=torch.float64)[:, None]
    freq = 10000 ** (torch.arange(0, C, 2, dtype=torch.float64) / C)
    pe = torch.stack((torch.sin(pos / freq), torch.cos(pos / freq)), dim=-1).flatten(1).float()  # (T, C)
    x = model.tok_emb.weight[ids] + pe  # (B, T, C)
    future = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    for blk in model.blocks:
        a, f = blk.attn, blk.ffn
        q, k, v = (x @ a.qkv.weight.T + a.qkv.bias).split(C, dim=-1)
        q, k, v = (t.view(B, T, H, hd).transpose(1, 2) for t in (q, k, v))  # (B, H, T, hd)
        w = ((q @ k.transpose(-2, -1)) / math.sqrt(hd)).masked_fill(future, float("-inf")).softmax(-1)
        y = (w @ v).transpose(1, 2).reshape(B, T, C) @ a.proj.weight.T + a.proj.bias
        x = F.layer_norm(x + y, (C,), blk.norm1.weight, blk.norm1.bias)  # post-norm: after the residual add
        h = torch.relu(x @ f.up.weight.T + f.up.bias) @ f.down.weight.T + f.down.bias
        x = F.layer_norm(x + h, (C,), blk.norm2.weight, blk.norm2.bias)
    return F.log_softmax(x @ model.head.weight.T, dim=-1)  # no final norm, no head bias


def test_article_004_configuration_gives_the_log_probs_of_its_equations():
    cfg = ModelConfig(vocab_size=10000, block_size=64, n_layers=6, n_heads=8, d_model=512, d_ff=2048,
                      norm="post", activation="relu", dropout=0.1, pos_encoding="sinusoidal")
    torch.manual_seed(7)
    model = DecoderLM(cfg).eval()  # eval: dropout off
    ids = torch.randint(0, 10000, (2, 64))
    with torch.no_grad():
        logp = F.log_softmax(model(ids).logits, dim=-1)
        want = post_norm_log_probs_by_hand(model, ids)
    assert logp.shape == (2, 64, 10000)
    assert torch.allclose(logp, want, atol=1e-4)


def test_article_004_mask_is_the_models_mask():
    words = "Orange is my favorite fruit".split()
    # article 004's table: 1 where a word may look, rows = words
    article = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    assert torch.equal(~causal_mask(len(words), len(words)), article.bool())
    model = DecoderLM(small(n_layers=1)).eval()
    att = model(torch.arange(5).unsqueeze(0), return_attention=True).attentions[0][0]
    assert torch.equal(att > 0, article.bool().expand(2, 5, 5))
