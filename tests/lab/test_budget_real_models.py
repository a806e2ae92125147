"""The memory budget on real models (lab/server/budget.py, lab.text.text_bytes): a text on a GPT-2-shaped model is
reserved with its (layers × heads × T × T) attention and scores, its key/value cache and a distribution over
a 50k vocabulary per token, so a burst of sessions stepping on one shared big model is refused with the
budget's sentence before the memory it counts passes the bound.

In process, on real lab Sessions and a random GPT-2 folder built with transformers (nothing downloaded);
the budget is a `ModelBudget` with small numbers, given to lab.session in place of the server's.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from lab import session as session_mod
from lab.catalogue.external import ExternalModels, parse_source
from lab.catalogue.models import encode_prompt
from lab.checks import UserError
from lab.server import budget
from lab.session import Session
from lab.text import text_bytes
from model.config import ModelConfig
from model.generate import Sampling, rows_held
from tests.support.families import save_reference

GPT2_VOCAB = 50_257
FULL = "The server is full right now"


def test_a_gpt2_small_text_reserves_its_attention_cache_and_50k_distributions():
    cfg = ModelConfig(vocab_size=GPT2_VOCAB, block_size=1024, n_layers=12, n_heads=12, d_model=768)
    entry = SimpleNamespace(cfg=cfg, tokenizer=SimpleNamespace(vocab_size=GPT2_VOCAB))
    rows = rows_held(64, 1024)
    attention = 12 * 12 * rows * rows * 4 * 2  # weights and scores, float32, with room for the rows to come
    cache = 2 * 12 * 64 * 768 * 4  # keys and values of 64 tokens in 12 layers
    distributions = 2 * GPT2_VOCAB * 4 * 64  # before and after sampling, per token
    logits = GPT2_VOCAB * 4  # the next token's, float32
    sampler = 5056 * 64  # the sampler's state kept for undo (torch's CPU generator), per token
    streams = 13 * 768 * 4  # the last token's residual streams (embedding and 12 blocks), for the logit lens
    total = attention + cache + distributions + logits + streams + sampler
    assert rows == 96 and text_bytes(entry, 64) == total == 41_631_556
    # a vocabulary padded past the tokenizer's (nanoGPT's 50,304) is counted by the model's rows
    padded = ModelConfig(vocab_size=50_304, block_size=1024, n_layers=12, n_heads=12, d_model=768)
    entry.cfg = padded
    assert text_bytes(entry, 64) == attention + cache + 2 * 50_304 * 4 * 64 + 50_304 * 4 + streams + sampler


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A random GPT-2 with 12 heads and GPT-2's 50,257-row output (a small tokenizer: the rest is padding),
    opened once and shared by every session, as the app shares a --model."""
    from transformers import GPT2Config, GPT2LMHeadModel

    tmp = tmp_path_factory.mktemp("big")
    torch.manual_seed(0)
    ref = GPT2LMHeadModel(GPT2Config(n_positions=128, vocab_size=GPT2_VOCAB, n_embd=48, n_layer=2, n_head=12,
                                     bos_token_id=1, eos_token_id=0, attn_implementation="eager")).eval()
    folder = save_reference(ref, tmp / "gpt2-12-heads", 300)
    external = ExternalModels([parse_source(str(folder))], tmp / "hashes.json")
    return external, external.names[0]


def sessions(external, n: int) -> list[Session]:
    out = []
    for _ in range(n):
        s = Session()
        s.external = external
        out.append(s)
    return out


def test_sessions_stepping_on_a_big_model_are_refused_before_the_budget_is_exceeded(big, monkeypatch):
    external, name = big
    entry = external.get(name)
    prompt = "Once upon a time there was a little fox"
    first = text_bytes(entry, len(encode_prompt(prompt, entry)[0]) + 1)  # what a first Step reserves
    limit = 3 * first + first // 2
    b = budget.ModelBudget(limit_bytes=limit, client_limit_bytes=limit)
    monkeypatch.setattr(session_mod, "MODEL_BUDGET", b)
    crowd = sessions(external, 6)
    greedy = Sampling(temperature=0.0)
    stepped, refused = [], []
    for round_ in range(4):  # every session steps, round after round, until the budget says no
        for s in crowd:
            before, held = s.tokens(), b.held(s)
            try:
                s.step(name, prompt, greedy)
            except UserError as exc:
                refused.append((s, str(exc)))
                assert s.tokens() == before and b.held(s) == held  # a refusal changes nothing
                continue
            stepped.append(s)
            # what each text really holds (attention, scores, cache, distributions) is within its reservation,
            # and the reservations within the bound
            assert all(x.text.nbytes() <= b.held(x) for x in crowd)
            assert sum(x.text.nbytes() for x in crowd) <= b.total <= limit
    assert entry.model.cfg.vocab_size == GPT2_VOCAB and entry.model.cfg.n_heads == 12
    assert len({id(s) for s in stepped}) == 3  # three texts fit, never a fourth
    assert refused and all(FULL in msg for _, msg in refused), refused[:1]
    assert all(not s.tokens() for s in crowd[3:])  # the sessions refused from the start hold no text


def test_one_address_is_refused_at_its_share_and_another_address_still_steps(big, monkeypatch):
    external, name = big
    entry = external.get(name)
    prompt = "Once upon a time"
    first = text_bytes(entry, len(encode_prompt(prompt, entry)[0]) + 1)
    b = budget.ModelBudget(limit_bytes=10 * first, client_limit_bytes=2 * first + first // 2)
    monkeypatch.setattr(session_mod, "MODEL_BUDGET", b)
    crowd = sessions(external, 4)
    for s in crowd[:3]:
        s.client = "203.0.113.66"
    crowd[3].client = "198.51.100.7"
    greedy = Sampling(temperature=0.0)
    crowd[0].step(name, prompt, greedy)
    crowd[1].step(name, prompt, greedy)
    # the shared model is loaded once and charged to no session (like the built-ins): each holds its text only
    assert crowd[0].entry is crowd[1].entry is entry and b.held(crowd[0]) == b.held(crowd[1]) == first
    with pytest.raises(UserError, match="The sessions from your address would hold"):
        crowd[2].step(name, prompt, greedy)
    assert not crowd[2].tokens() and b.held(crowd[2]) == 0
    crowd[3].step(name, prompt, greedy)  # another address is not refused for what the first one holds
    assert len(crowd[3].tokens()) == len(crowd[0].tokens()) and b.total <= b.limit_bytes
