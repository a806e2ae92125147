"""Downloads of the current view (lab.export): every CSV and JSON read back finds the numbers the
model computed.

Each export is parsed back the way a learner's tool would (csv.reader; json.loads of json.dumps)
and held against values computed here from the model itself: a plain forward over the window
(`model(ids, return_attention=True)`), softmax of its logits, and the head scores by loops over
that forward's attention. Tokens with commas, quotes, spaces and line breaks must come back
exactly; masked cells are empty (CSV) or null (JSON); refusals change nothing.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re

import numpy as np
import pytest
import torch

from lab import export
from lab.catalogue.models import ModelEntry
from lab.checks import UserError
from lab.roles import GRAMMAR_NAMES
from lab.session import Session
from model.config import ModelConfig
from model.generate import Sampling
from model.heads import task_of, task_targets
from model.interventions import Intervention
from model.tokenizers import CharTokenizer
from model.transformer import DecoderLM

GREEDY = Sampling(temperature=0.0)
ATOL = 1e-6
GRAMMAR, SORT, COPY = "grammar (built-in)", "sort digits (built-in)", "copy / induction (built-in)"
SHAKESPEARE = "shakespeare (built-in)"
JULIET = "JULIET:\nO Romeo, 'Romeo'! wherefore"  # a line break, a comma, quotes, spaces
OWN = 'mine: Ωmega, "q"'  # a name with non-ASCII letters, a comma and quotes
OWN_PROMPT = 'a,"b c"\nab,"a" b'  # 16 characters: a block of 12 keeps the last 12 (the window slides)
STEM = re.compile(r"^[A-Za-z0-9_-]+$")


# ------------------------------------------------------------------------------ fixtures


def stepped(name: str, prompt: str, steps: int = 3) -> Session:
    s = Session()
    for _ in range(steps):
        s.step(name, prompt, GREEDY)
    return s


@pytest.fixture(scope="module")
def juliet() -> Session:
    return stepped(SHAKESPEARE, JULIET)


@pytest.fixture(scope="module")
def grammar() -> Session:
    return stepped(GRAMMAR, "anna found the key . she gave it to tom because he", 2)


def own_session(mask="causal", steps=3) -> Session:
    """An own model whose vocabulary holds a comma, a double quote, a space and a line break."""
    tok = CharTokenizer.train('ab,"c \n')
    cfg = ModelConfig(vocab_size=tok.vocab_size, block_size=12, n_layers=2, n_heads=2, d_model=16, mask=mask)
    torch.manual_seed(1)
    model = DecoderLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.4)
    s = Session()
    s._add_model(ModelEntry(OWN, model, tok, {"corpus": "text"}))
    for _ in range(steps):
        s.step(OWN, OWN_PROMPT, GREEDY)
    return s


@pytest.fixture(scope="module")
def own() -> Session:
    return own_session()


def test_the_prompts_encode_as_intended(juliet, own):
    pieces = [p for p, _ in juliet.tokens()]
    assert "<unk>" not in pieces and {",", "'", "⏎", "␣"} <= set(pieces)
    assert juliet.decoder.start == 0 and len(pieces) == 35 + 3
    own_pieces = [p for p, _ in own.tokens()]
    assert {",", '"', "⏎", "␣"} <= set(own_pieces) and "<unk>" not in own_pieces
    assert own.decoder.start == len(own.decoder.ids) - 12 > 0  # the window slid


# ------------------------------------------------------------------------------ reading back


def read_csv(e: export.Export) -> tuple[list[str], list[list[str]]]:
    rows = list(csv.reader(io.StringIO(e.csv, newline="")))
    return rows[0], rows[1:]


def read_json(e: export.Export) -> dict:
    text = json.dumps(e.json, allow_nan=False)  # refuses NaN and infinities: the JSON is standard
    assert json.loads(e.json_text()) == json.loads(text)
    return json.loads(text)


def num(cell: str) -> float | None:
    return None if cell == "" else float(cell)


def check_common(e: export.Export, what: str, session: Session | None = None, model: str | None = None):
    assert STEM.match(e.name), e.name
    data = read_json(e)
    assert data["what"] == what
    if session is not None:
        assert data["model"] == session.entry.name
        assert data["tokens"] == [p for p, _ in session.tokens()]  # exact, awkward characters and all
        assert data["token_ids"] == list(session.decoder.window)
        assert data["positions"] == list(range(len(session.decoder.window)))
        assert data["text_offset"] == session.decoder.start
    if model is not None:
        assert data["model"] == model
    return data


def forward(session: Session, ids=None):
    """The plain forward of the model over the window (or `ids`)."""
    ids = session.decoder.window if ids is None else ids
    with torch.inference_mode():
        return session.entry.model(torch.tensor([list(ids)]), return_attention=True)


# ------------------------------------------------------------------------------- attention


@pytest.mark.parametrize("fixture", ["juliet", "own", "grammar"])
@pytest.mark.parametrize("kind", ["weights", "scores"])
def test_attention_reads_back_as_the_model_computed_it(fixture, kind, request):
    s = request.getfixturevalue(fixture)
    out = forward(s)
    cfg = s.entry.model.cfg
    tokens = [p for p, _ in s.tokens()]
    T = len(tokens)
    for layer in range(cfg.n_layers):
        expect = (out.attentions if kind == "weights" else out.scores)[layer][0].float().numpy()  # (H, T, T)
        for head in (None, cfg.n_heads - 1):
            e = export.attention(s, layer, head, kind)
            heads = list(range(cfg.n_heads)) if head is None else [head]
            which = f"L{layer}H{head}" if head is not None else f"L{layer}-all-heads"
            assert e.name.endswith(f"_{which}_attention_{kind}_{T}tokens")
            data = check_common(e, "attention", s)
            assert (data["kind"], data["layer"], data["heads"]) == (kind, layer, heads)
            header, rows = read_csv(e)
            assert header == export.ATTENTION_COLUMNS
            assert len(rows) == len(heads) * T * T
            got = np.full((len(heads), T, T), np.nan)
            for r in rows:
                h, q, k = int(r[1]), int(r[2]), int(r[4])
                assert int(r[0]) == layer and (r[3], r[5]) == (tokens[q], tokens[k])
                masked = k > q
                assert (r[6] == "") == masked  # masked: empty; every other cell holds a number
                assert (data["values"][heads.index(h)][q][k] is None) == masked
                if not masked:
                    got[heads.index(h), q, k] = float(r[6])
                    assert float(r[6]) == data["values"][heads.index(h)][q][k]
            sel = expect[heads]
            visible = ~np.triu(np.ones((T, T), dtype=bool), 1)
            # the rows of the prompt come from a whole-window forward like this one; a generated
            # token's row from the Step's cached forward, whose scores (sums reaching ±15) round
            # differently in float32's last bits
            typed = np.arange(T)[:, None] < s.decoder.prompt_len - s.decoder.start
            for rows_, tol in ((typed, ATOL), (~typed, ATOL if kind == "weights" else 1e-5)):
                sel_ = visible & rows_
                np.testing.assert_allclose(got[:, sel_], sel[:, sel_], atol=tol, rtol=0)
            # and exactly the session's own numbers (float32 written at full precision)
            mine = (s.attention().weights if kind == "weights" else s.attention().scores)[layer][heads]
            assert np.array_equal(got[:, visible], mine[:, visible].astype(np.float64))
            if kind == "scores":
                assert np.all(np.isneginf(mine[:, ~visible]))  # the session holds -inf where the export has null
            else:
                assert np.all(mine[:, ~visible] == 0)


def test_bidirectional_attention_has_no_masked_cells():
    s = own_session(mask="bidirectional", steps=1)
    e = export.attention(s, 1, None, "scores")
    _, rows = read_csv(e)
    assert all(r[6] != "" for r in rows)
    expect = forward(s).scores[1][0].float().numpy()
    got = np.array(read_json(e)["values"], dtype=np.float64)
    np.testing.assert_allclose(got, expect, atol=ATOL, rtol=1e-6)
    assert read_json(e)["causal"] is False


def as_array(values) -> np.ndarray:
    """JSON [head][query][key] values (null where masked) as floats, NaN where masked."""
    return np.array([[[np.nan if v is None else v for v in row] for row in h] for h in values], dtype=np.float64)


@pytest.mark.parametrize("change", ["ablation", "edit"])
@pytest.mark.parametrize("kind", ["weights", "scores"])
def test_attention_under_the_head_tools_is_what_the_figure_draws(grammar, change, kind):
    """While heads are ablated or a row edited, the download holds the attention drawn (the model's
    forward under that change), says so, and keeps the model's own attention beside it, labelled."""
    from ui import explore, share
    from viz import attention_panels

    T = len(grammar.decoder.window)
    if change == "ablation":
        grammar.heads.set_ablation(["L0H0", "L0H1"], "zero", False)
        iv, mark = Intervention(((0, 0), (0, 1)), "zero"), "L0H0, L0H1 ablated (zero)"
    else:
        grammar.heads.set_edit(1, 2, T - 1, 1)
        iv, mark = grammar.heads.settings.intervention().within(grammar.decoder.start, 0, T), f"L1H2 row {T - 1} edited"
    try:
        layers = [(layer, export.attention(grammar, layer, None, kind)) for layer in (1, 2)]
        figures = [attention_panels(explore.attention_spec(grammar, layer, "all", kind)) for layer in (1, 2)]
        downloaded = [share.export_numbers(grammar, kind, "json", GRAMMAR, layer, "all") for layer in (1, 2)]
    finally:
        grammar.heads.clear_probe()
    with torch.inference_mode():
        out = grammar.entry.model(torch.tensor([grammar.decoder.window]), return_attention=True, intervention=iv)
    plain = forward(grammar)
    visible = ~np.triu(np.ones((T, T), dtype=bool), 1)
    moved = 0.0
    for (layer, e), seen, path in zip(layers, figures, downloaded):
        assert e.name.endswith(f"_L{layer}-all-heads_changed_attention_{kind}_{T}tokens")
        data = check_common(e, "attention", grammar)
        assert json.loads(open(path, encoding="utf-8").read()) == data  # the page's download (/export_numbers)
        assert (data["drawn"], data["change"]) == ("changed", mark) and mark in data["values_are"]
        got, own = as_array(data["values"]), as_array(data["unchanged_values"])
        expect = (out.attentions if kind == "weights" else out.scores)[layer][0].double().numpy()
        before = (plain.attentions if kind == "weights" else plain.scores)[layer][0].double().numpy()
        np.testing.assert_allclose(got[:, visible], expect[:, visible], atol=1e-5, rtol=0)  # the changed forward
        np.testing.assert_allclose(own[:, visible], before[:, visible], atol=1e-5, rtol=0)  # the model's own
        assert np.array_equal(np.isnan(seen), ~np.broadcast_to(visible, seen.shape))
        assert np.abs(seen[:, visible] - got[:, visible]).max() <= 0.0005 + 1e-6  # drawn in milli-units
        moved = max(moved, float(np.abs(got[:, visible] - own[:, visible]).max()))
        header, rows = read_csv(e)
        assert header == export.ATTENTION_COLUMNS + export.CHANGED_COLUMNS and {r[8] for r in rows} == {mark}
        for r in rows[:: 7]:
            h, q, k = int(r[1]), int(r[2]), int(r[4])
            assert (num(r[6]), num(r[7])) == (data["values"][h][q][k], data["unchanged_values"][h][q][k])
    assert moved > 0.01  # the change moves the attention of a later layer (or the edited row)
    plain_export = check_common(export.attention(grammar, 1, None, kind), "attention", grammar)
    assert plain_export["drawn"] == "unchanged" and plain_export["change"] == "" and "unchanged_values" not in plain_export


# --------------------------------------------------------------------------- probabilities


def check_distribution(s: Session, index: int):
    e = export.probabilities(s, index)
    data = check_common(e, "probabilities", s)
    ids = s.decoder.window
    pos, block = s.decoder.start + index, s.entry.model.cfg.block_size
    context = s.decoder.ids[max(0, pos - block):pos]  # what it was predicted from (before the window slid)
    with torch.inference_mode():
        logits = s.entry.model(torch.tensor([context])).logits[0, -1]
    expect = torch.softmax(logits.float(), -1).numpy()
    header, rows = read_csv(e)
    assert header == export.PROBABILITY_COLUMNS
    V = s.entry.tokenizer.vocab_size
    assert len(rows) == V and sorted(int(r[1]) for r in rows) == list(range(V))  # every token once
    assert [int(r[0]) for r in rows] == list(range(1, V + 1))
    probs = [float(r[3]) for r in rows]
    assert probs == sorted(probs, reverse=True)  # most probable first
    tok = s.entry.tokenizer
    for r in rows:
        i = int(r[1])
        assert r[2] == tok.piece(i)  # the display piece, exact
        assert float(r[3]) == pytest.approx(float(expect[i]), abs=ATOL)
        assert r[5] == ("true" if i == ids[index] else "false")
    assert [int(r[1]) for r in rows] == [row[1] for row in data["rows"]]
    assert [float(r[3]) for r in rows] == [row[3] for row in data["rows"]]
    assert (data["index"], data["token_id"], data["token"]) == (index, ids[index], tok.piece(ids[index]))
    return e, rows, data


@pytest.mark.parametrize("fixture", ["juliet", "own"])
def test_generated_token_distribution_reads_back(fixture, request):
    s = request.getfixturevalue(fixture)
    last = len(s.decoder.window) - 1
    e, rows, data = check_distribution(s, last)
    assert e.name.endswith(f"_pos{last}_probabilities_{last + 1}tokens")
    assert data["typed"] is False
    adjusted = {int(r[1]): float(r[4]) for r in rows}  # greedy: all of it on the chosen token
    assert adjusted[s.decoder.window[last]] == 1.0 and sum(adjusted.values()) == 1.0
    assert rows[0][5] == "true"  # greedy chose the most probable token
    assert export.probabilities(s).csv == e.csv  # default: the last token


@pytest.mark.parametrize("fixture", ["juliet", "own"])
def test_typed_token_distribution_reads_back(fixture, request):
    s = request.getfixturevalue(fixture)
    index = 7 if fixture == "juliet" else 3
    assert s.decoder.start + index < s.decoder.prompt_len
    _, rows, data = check_distribution(s, index)
    assert data["typed"] is True
    assert all(r[4] == "" for r in rows) and all(row[4] is None for row in data["rows"])  # nothing was sampled


def chart_bars(plot_json: str) -> tuple[list[int], np.ndarray, np.ndarray]:
    """The probability chart as the page receives it: token ids of its bars, top first, and the
    before / after values (float32 arrays in plotly's base64 form)."""
    import base64

    traces = [t for t in json.loads(plot_json)["data"] if t["type"] == "bar"]
    ids = [int(re.search(r"\(id (\d+)\)$", h).group(1)) for h in traces[0]["hovertext"]]
    values = [np.frombuffer(base64.b64decode(t["x"]["bdata"]), dtype=t["x"]["dtype"]) for t in traces]
    return ids, values[0], values[1] if len(values) > 1 else None  # a typed token has no "after" bars


def test_the_selected_tokens_download_is_the_distribution_the_chart_shows():
    """Click a token of the text (the page's select_token), then download "next-token probabilities
    (selected token)": the file holds that token's distribution, the one the chart draws, not the last's."""
    import gradio as gr

    from ui import explore, share

    s = Session()
    for _ in range(4):
        s.step(SORT, "503124=", Sampling(temperature=1.0, seed=4))
    n = len(s.tokens())
    for index in (8, 3, n - 1):  # a generated token, a typed one, the last
        chart = explore.select_token(s, 1.0, 0, 1.0, gr.SelectData(None, {"index": index, "value": "", "selected": True}))
        path = share.export_numbers(s, "probabilities", "json", SORT, 0, "all")
        data = json.loads(open(path, encoding="utf-8").read())
        assert data["index"] == index and data["token_id"] == s.decoder.window[index]
        ids, before, after = chart_bars(chart.plot)
        rows = {row[1]: row for row in data["rows"]}
        assert [row[1] for row in data["rows"][:10]] == ids[:10]  # the chart's top ten (the chosen token may follow)
        np.testing.assert_array_equal(np.array([rows[i][3] for i in ids], dtype=np.float32), before)
        if data["typed"]:
            assert after is None and all(row[4] is None for row in data["rows"])
        else:
            np.testing.assert_array_equal(np.array([rows[i][4] for i in ids], dtype=np.float32), after)


# ------------------------------------------------------------------------------ head roles


def reference_scores(weights: np.ndarray, ids: list[int]) -> dict[str, np.ndarray]:
    """The scores of model.heads.ROLES by loops over (L, H, T, T) weights (float64)."""
    L, H, T, _ = weights.shape
    keys = ("previous_token", "first_token", "self_attention", "induction", "entropy")
    out = {k: np.full((L, H), np.nan) for k in keys}
    pairs = []
    for i in range(T):
        earlier = [j for j in range(i - 1) if ids[j] == ids[i]]
        if earlier:
            pairs.append((i, max(earlier) + 1))
    for layer in range(L):
        for h in range(H):
            a = weights[layer, h]
            out["previous_token"][layer, h] = np.mean([a[i, i - 1] for i in range(1, T)])
            out["first_token"][layer, h] = np.mean([a[i, 0] for i in range(1, T)])
            out["self_attention"][layer, h] = np.mean([a[i, i] for i in range(1, T)])
            out["entropy"][layer, h] = np.mean([-sum(w * math.log2(w) for w in a[i] if w > 0) for i in range(1, T)])
            if pairs:
                out["induction"][layer, h] = np.mean([a[i, k] for i, k in pairs])
    return out


@pytest.mark.parametrize("fixture", ["juliet", "grammar", "sort"])
def test_head_roles_read_back_as_the_attention_scores(fixture, request):
    s = stepped(SORT, "503124=", 3) if fixture == "sort" else request.getfixturevalue(fixture)
    e = export.head_roles(s)
    data = check_common(e, "head_roles", s)
    weights = np.stack([a[0].double().numpy() for a in forward(s).attentions])
    ids = list(s.decoder.window)
    expect = reference_scores(weights, ids)
    roles = s.heads.head_roles()
    if "match" in [r.key for r in roles.roles]:
        task = task_of(s.entry.meta.get("corpus"))
        q, k = task_targets(task, [s.entry.tokenizer.piece(i) for i in ids], GRAMMAR_NAMES)
        pick = max if task == "grammar" else np.mean  # grammar: the clearest pronoun
        expect["match"] = np.array([[pick([weights[li, h, i, j] for i, j in zip(q, k)]) if len(q) else np.nan
                                     for h in range(weights.shape[1])] for li in range(weights.shape[0])])
    header, rows = read_csv(e)
    assert header == roles.columns() == data["columns"]
    L, H = weights.shape[:2]
    assert len(rows) == L * H
    assert [(int(r[0]), int(r[1])) for r in rows] == [(li, h) for li in range(L) for h in range(H)]
    for r, jr, page in zip(rows, data["rows"], roles.rows()):
        layer, head = int(r[0]), int(r[1])
        for col, key in enumerate(header[2:-1], start=2):
            want = expect[key][layer, head]
            if np.isnan(want):
                assert r[col] == "" and jr[col] is None
            else:
                assert float(r[col]) == pytest.approx(want, abs=ATOL)
                assert jr[col] == float(r[col])
                assert round(float(r[col]), 4) == page[col]  # the page's table, rounded
        assert r[-1] == jr[-1] == page[-1]  # the role the page names
    assert set(data["thresholds"]) == set(header[2:-1]) and data["formulas"]["previous_token"]
    assert all(role["formula"] for role in data["roles"])


# ---------------------------------------------------------------------------- loss history


@pytest.fixture(scope="module")
def trained():
    s = Session()
    progress = list(s.train("sort", "", None, "char", 1, 2, 32, 64, "learned", "pre", "gelu", 0.0, 20, 3e-3, 0))
    assert progress[-1].done and s.run.done
    yield s
    s.close()


def test_loss_history_of_the_training_run(trained):
    run = trained.run
    e = export.loss_history(trained, run.name)
    data = check_common(e, "loss_history", model=run.name)
    assert data["source"] == "training run"
    header, rows = read_csv(e)
    assert header == export.LOSS_COLUMNS == data["columns"]
    # the filled cells of each column, in order, are exactly the run's lists
    assert [int(r[0]) for r in rows if r[1] != ""] == run.steps
    assert [float(r[1]) for r in rows if r[1] != ""] == run.train_loss
    assert [int(r[0]) for r in rows if r[2] != ""] == run.val_steps
    assert [float(r[2]) for r in rows if r[2] != ""] == run.val_loss
    assert (data["steps"], data["train_loss"], data["val_steps"], data["val_loss"]) == (
        run.steps, run.train_loss, run.val_steps, run.val_loss)
    assert [int(r[0]) for r in rows] == sorted(int(r[0]) for r in rows)
    assert len(run.steps) >= 20 and run.val_loss
    assert e.name == f"my-sort-model_loss_history_{run.steps[-1]}steps"


@pytest.mark.parametrize("name", [GRAMMAR, SHAKESPEARE])
def test_loss_history_of_a_builtin_film(name):
    s = Session()
    film = s.film(name)
    e = export.loss_history(s, name)
    data = check_common(e, "loss_history", model=name)
    assert data["source"] == "training film"
    _, rows = read_csv(e)
    assert [int(r[0]) for r in rows] == [f.step for f in film.frames]
    assert [float(r[1]) for r in rows] == [float(f.train_loss) for f in film.frames]
    assert [num(r[2]) for r in rows] == [None if f.val_loss is None else float(f.val_loss) for f in film.frames]
    assert data["rows"] == [[int(r[0]), float(r[1]), num(r[2])] for r in rows]
    assert e.name.startswith(export.model_stem(name) + "_loss_history_")


def test_loss_history_refuses_a_model_without_one(own):
    with pytest.raises(UserError, match="no loss history"):
        export.loss_history(own, OWN)
    with pytest.raises(UserError, match="Unknown model"):
        export.loss_history(own, "no such model")


# ------------------------------------------------------------------- logit lens, effect, compare


def test_logit_lens_reads_back_as_the_residual_stream(juliet):
    model = juliet.entry.model
    index = 20
    with torch.inference_mode():
        out = model(torch.tensor([juliet.decoder.window]), return_residuals=True)
        logits = torch.stack([model.read_out(r) for r in out.residuals])[:, 0, index]  # (L + 1, V)
        expect = torch.softmax(logits.double(), -1).numpy()
        own_logits = out.logits[0, index]
    # the last row is the model's own distribution
    np.testing.assert_allclose(expect[-1], torch.softmax(own_logits.double(), -1).numpy(), atol=ATOL)
    e = export.lens_export(juliet, index, top=7)
    data = check_common(e, "logit_lens", juliet)
    header, rows = read_csv(e)
    assert header == export.LENS_COLUMNS
    labels = ["embedding"] + [f"after layer {i}" for i in range(model.cfg.n_layers)]
    assert len(rows) == 7 * len(labels) == len(data["rows"]) and data["stages"] == labels
    tok = juliet.entry.tokenizer
    for stage, label in enumerate(labels):
        part = rows[stage * 7:(stage + 1) * 7]
        top = np.argsort(-expect[stage], kind="stable")[:7]
        assert [r[0] for r in part] == [label] * 7 and [int(r[1]) for r in part] == list(range(1, 8))
        assert [int(r[2]) for r in part] == top.tolist()
        assert [r[3] for r in part] == [tok.piece(int(i)) for i in top]
        np.testing.assert_allclose([float(r[4]) for r in part], expect[stage][top], atol=ATOL, rtol=0)
    assert data["index"] == index and data["token"] == juliet.tokens()[index][0]
    assert juliet.query is None  # exporting selects nothing


def test_effect_reads_back_as_two_forwards(grammar):
    grammar.heads.set_ablation(["L1H0"], "zero", False)
    try:
        e = export.effect_export(grammar)
    finally:
        grammar.heads.clear_probe()
    ids = torch.tensor([grammar.decoder.window])
    with torch.inference_mode():
        before = torch.softmax(grammar.entry.model(ids).logits[0, -1].double(), -1).numpy()
        after = torch.softmax(grammar.entry.model(ids, intervention=Intervention(((1, 0),), "zero")).logits[0, -1]
                              .double(), -1).numpy()
    assert np.abs(before - after).max() > 1e-5  # the ablation changes something
    check_common(e, "effect", grammar)
    header, rows = read_csv(e)
    assert header == export.EFFECT_COLUMNS and len(rows) == grammar.entry.tokenizer.vocab_size
    for r in rows:
        i = int(r[2])
        assert float(r[4]) == pytest.approx(before[i], abs=ATOL) and float(r[5]) == pytest.approx(after[i], abs=ATOL)
    assert [int(r[0]) for r in rows] == list(range(1, len(rows) + 1))


def test_comparison_reads_back_as_two_plain_forwards(juliet):
    a, b = JULIET, "ROMEO:\nO Juliet, 'Juliet'! wherefore"
    e = export.comparison(juliet, SHAKESPEARE, a, b)
    data = check_common(e, "comparison", model=SHAKESPEARE)
    assert (data["prompt_a"], data["prompt_b"]) == (a, b)  # a line break and quotes, exactly
    tok = juliet.entry.tokenizer
    ids = [tok.encode_verbose(p).ids for p in (a, b)]
    assert data["tokens_a"] == [tok.piece(i) for i in ids[0]] and data["tokens_b"] == [tok.piece(i) for i in ids[1]]
    outs = [forward(juliet, x) for x in ids]
    weights = [np.stack([w[0].double().numpy() for w in o.attentions]) for o in outs]
    ref = [reference_scores(w, x) for w, x in zip(weights, ids)]
    header, rows = read_csv(e)
    assert header == data["columns"]
    for r in rows:
        layer, head = int(r[0]), int(r[1])
        for col, name in enumerate(header[2:], start=2):
            key, side = name.rsplit(" ", 1)
            va, vb = ref[0][key][layer, head], ref[1][key][layer, head]
            want = {"A": va, "B": vb, "B−A": vb - va}[side]
            assert (r[col] == "") == bool(np.isnan(want))
            if r[col]:
                assert float(r[col]) == pytest.approx(want, abs=ATOL)
    n = data["common"]
    assert n == min(map(len, ids))
    for layer, per_head in enumerate(data["attention_diff"]):
        for h, m in enumerate(per_head):
            for q in range(n):
                for k in range(n):
                    if k > q:
                        assert m[q][k] is None
                    else:
                        want = weights[1][layer, h, q, k] - weights[0][layer, h, q, k]
                        assert m[q][k] == pytest.approx(want, abs=ATOL)
    for i, piece, pa, pb in data["next_token"]["rows"]:
        assert piece == tok.piece(i)
        assert pa == pytest.approx(float(torch.softmax(outs[0].logits[0, -1].double(), -1)[i]), abs=ATOL)
        assert pb == pytest.approx(float(torch.softmax(outs[1].logits[0, -1].double(), -1)[i]), abs=ATOL)


# ------------------------------------------------------------------------------ csv, names


AWKWARD = ['a,b', 'say "hi"', "two\nlines", "cr\r\nlf", " lead", "trail ", "'", '"', ",", "", "␣", "⏎", "=1+1",
           "Ω"]


def test_to_csv_round_trips_awkward_text():
    rows = [[i, piece, 0.1, None, True, float("nan"), float("-inf"), np.float32(1 / 3)]
            for i, piece in enumerate(AWKWARD)]
    text = export.to_csv(["id", "piece, with comma", "p", "none", "flag", "nan", "inf", "f32"], rows)
    back = list(csv.reader(io.StringIO(text, newline="")))
    assert back[0] == ["id", "piece, with comma", "p", "none", "flag", "nan", "inf", "f32"]
    assert [r[1] for r in back[1:]] == AWKWARD
    assert all(r[3] == r[5] == r[6] == "" and r[4] == "true" for r in back[1:])
    assert float(back[1][7]) == float(np.float32(1 / 3))  # the float32 exactly


def test_names_are_ascii_stems(own, juliet):
    for e in (export.attention(own, 0, 0), export.probabilities(own), export.head_roles(own),
              export.lens_export(own), export.effect_export(own), export.comparison(own, OWN, "ab", "ba")):
        assert STEM.match(e.name), e.name
        assert e.name.startswith("mine-mega-q_")
        assert read_json(e)["model"] == OWN
    assert export.attention(juliet, 1, 0).name == "shakespeare_L1H0_attention_weights_38tokens"
    assert export.model_stem(COPY) == "copy-induction"
    assert export.model_stem("ΩΩΩ") == "model"


def test_write_puts_both_files_in_a_folder(juliet, tmp_path):
    e = export.attention(juliet, 0, 1, "scores")
    csv_path, json_path = e.write(tmp_path / "out")
    assert csv_path.name == f"{e.name}.csv" and json_path.name == f"{e.name}.json"
    with open(csv_path, encoding="utf-8-sig", newline="") as f:
        assert list(csv.reader(f)) == list(csv.reader(io.StringIO(e.csv, newline="")))
    assert json.loads(json_path.read_text(encoding="utf-8")) == read_json(e)


# -------------------------------------------------------------------------------- refusals


def snapshot(s: Session):
    d = s.decoder
    return (None if d is None else (list(d.ids), d.start), s.query, s.heads.settings, len(s.drawn), s.model_name)


REFUSALS = [
    (lambda s: export.attention(s, 9, 0), "layer must be a whole number between 0 and 3"),
    (lambda s: export.attention(s, -1, 0), "layer"),
    (lambda s: export.attention(s, 0, 4), "head must be a whole number between 0 and 3"),
    (lambda s: export.attention(s, 0, "x"), "head"),
    (lambda s: export.attention(s, 0, 0, "values"), "kind must be one of weights, scores"),
    (lambda s: export.attention(s, 0, 0, "all layers"), "kind must be one of"),
    (lambda s: export.probabilities(s, 0), "first token"),
    (lambda s: export.probabilities(s, 38), "token index must be a whole number between 0 and 37"),
    (lambda s: export.probabilities(s, 1.5), "token index"),
    (lambda s: export.lens_export(s, 99), "token position"),
    (lambda s: export.lens_export(s, None, 0), "top must be a whole number between 1 and 1000"),
    (lambda s: export.effect_export(s, -1), "token position"),
    (lambda s: export.loss_history(s, SHAKESPEARE + "x"), "Unknown model"),
    (lambda s: export.loss_history(s, None), "model must be given by its name"),
    (lambda s: export.comparison(s, SHAKESPEARE, "", "abc"), "prompt is empty"),
    (lambda s: export.comparison(s, SHAKESPEARE, "abc", "a\"b"), "does not know"),
]


@pytest.mark.parametrize("call, fragment", REFUSALS)
def test_refusals_change_nothing(juliet, call, fragment):
    before = snapshot(juliet)
    with pytest.raises(UserError, match=re.escape(fragment)):
        call(juliet)
    assert snapshot(juliet) == before


@pytest.mark.parametrize("call", [
    lambda s: export.attention(s, 0, 0), lambda s: export.attention(s, 0, None, "scores"),
    lambda s: export.probabilities(s), lambda s: export.head_roles(s), lambda s: export.lens_export(s),
    lambda s: export.effect_export(s),
])
def test_exports_of_the_text_need_a_text(call):
    s = Session()
    with pytest.raises(UserError, match="Press Step first"):
        call(s)
    assert snapshot(s) == (None, None, s.heads.settings, 0, None)
    # a model without a text: the comparison and the film's losses need none
    assert export.comparison(s, GRAMMAR, "tom met anna . he", "anna met tom . she").json["common"] == 5
    assert export.loss_history(s, GRAMMAR).json["source"] == "training film"
