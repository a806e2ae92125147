"""Head roles under grouped-query attention: scores stay per query head (each has its own attention map),
and the table and the labels name the key/value head each reads and the query heads sharing it."""

from __future__ import annotations

import numpy as np
import torch

from lab.catalogue.models import ModelEntry
from lab.roles import compute_head_roles
from model.config import ModelConfig
from model.transformer import DecoderLM


def entry_of(cfg: ModelConfig) -> ModelEntry:
    torch.manual_seed(0)
    return ModelEntry(name="t", model=DecoderLM(cfg).eval(), tokenizer=None, meta={})


def roles_of(cfg: ModelConfig):
    entry = entry_of(cfg)
    ids = [3, 5, 7, 3, 5, 7, 9, 3]
    with torch.no_grad():
        att = entry.model(torch.tensor([ids]), return_attention=True).attentions
    return compute_head_roles(entry, ids, [a[0].numpy() for a in att], [str(i) for i in ids])


def test_grouped_heads_name_their_shared_key_value_head():
    roles = roles_of(ModelConfig(vocab_size=16, n_layers=2, n_heads=4, n_kv_heads=2, d_model=16, pos_encoding="rope"))
    assert roles.grouped and roles.columns()[:3] == ["layer", "head", "kv_head"]
    rows = roles.rows()
    assert [r[2] for r in rows[:4]] == [0, 0, 1, 1]  # heads 0-1 read key/value head 0, heads 2-3 head 1
    assert roles.sharing(3) == "key/value head 1, shared by heads 2–3"
    assert all(roles.scores[k].shape == (2, 4) for k in roles.scores)  # one score per query head
    for layer in range(2):
        for head in range(4):
            label = roles.label(layer, head)
            assert label == "" or label.endswith(f"({roles.sharing(head)})")


def test_without_grouping_nothing_changes():
    roles = roles_of(ModelConfig(vocab_size=16, n_layers=2, n_heads=4, d_model=16))
    assert not roles.grouped and "kv_head" not in roles.columns() and roles.sharing(1) == ""
    assert len(roles.rows()[0]) == len(roles.columns())
    assert np.isfinite(roles.scores["previous_token"]).all()
