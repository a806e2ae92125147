"""The training film in the app: recorded by every training in the Train tab, kept with
the model, saved inside its downloaded file and back on upload, and drawn frame by frame with
exactly the numbers the frame holds. Built-in models carry the film the CLI recorded."""

from __future__ import annotations

import json

import gradio as gr
import numpy as np
import plotly.graph_objects as go
import pytest
import torch

import viz
from lab.catalogue.models import BUILTIN_MODELS, BUILTINS
from lab.checks import UserError
from lab.session import Session
from model.checkpoint import load_checkpoint
from model.heads import head_scores
from ui.film import film_frame, next_frame, open_film, redraw_film
from tests.support.loops import run_alone

SORT_FORM = ("sort", "", None, "char", 2, 4, 64, 256, "learned", "pre", "gelu", 0.0, 40, 3e-3, 0)
QUANT = 0.0005 + 1e-9  # figures carry milli-units


def trained(session: Session, probe=None):
    for p in session.train(*SORT_FORM, probe=probe):
        pass
    return p


def model_attention(entry, ids) -> list[np.ndarray]:
    with torch.inference_mode():
        out = entry.model(torch.tensor([list(ids)]), return_attention=True)
    return [a[0].numpy() for a in out.attentions]


def test_a_training_in_the_app_records_a_film_whose_last_frame_is_the_model():
    s = Session()
    p = trained(s)
    film = s.film(p.run.name)
    steps = [f.step for f in film.frames]
    assert steps[0] == 0 and steps[-1] == 40 and steps == sorted(set(steps)) and len(steps) >= 30
    assert film.task == "sort" and "=" in film.probe_tokens  # a held-out sort example, answer included
    last = model_attention(s.entry_for(p.run.name), film.probe_ids)
    for a, b in zip(last, film.frames[-1].attention):
        np.testing.assert_allclose(a, b, atol=1e-6)
    # the download holds the film; uploading it brings the film back, equal
    back = load_checkpoint(p.download).film
    assert [f.step for f in back.frames] == steps
    for fa, fb in zip(film.frames, back.frames):
        for a, b in zip(fa.attention, fb.attention):
            np.testing.assert_allclose(a, b, atol=1e-7)
    other = Session()
    name = other.upload(str(p.download))
    assert [f.step for f in other.film(name).frames] == steps


def test_a_typed_probe_is_used_and_unknown_characters_are_refused():
    s = Session()
    p = trained(s, probe="112233=123123")
    assert "".join(s.film(p.run.name).probe_tokens) == "112233=123123"
    with pytest.raises(UserError, match="probe prompt"):
        next(iter(Session().train(*SORT_FORM, probe="hello")))


def test_a_frame_draws_exactly_what_it_holds():
    s = Session()
    p = trained(s)
    film = s.film(p.run.name)
    i = 7
    attention, loss, curves, phases, caption = film_frame(s, p.run.name, i, 1, "previous_token")
    fr = film.frames[i]
    drawn = viz.attention_panels(go.Figure(json.loads(attention.plot)))
    np.testing.assert_allclose(np.nan_to_num(drawn), fr.attention[1], atol=QUANT)
    assert f"Step {fr.step} of 40" in json.loads(attention.plot)["layout"]["title"]["text"]
    # the score curves are the head scores of every frame, recomputed here the plain way
    spec = json.loads(curves.plot)
    want = np.array([head_scores(f.attention, film.probe_ids)["previous_token"] for f in film.frames])
    lines = {t["name"]: np.asarray(viz.decode_array(t["y"]), dtype=float) for t in spec["data"]
             if str(t.get("name", "")).startswith("L")}
    for layer in range(2):
        for head in range(4):
            np.testing.assert_allclose(lines[f"L{layer} H{head}"], want[:, layer, head], atol=1e-6)
    assert f"step {fr.step} of 40" in caption and phases.startswith("**What changed")


def test_builtins_carry_their_film_and_the_player_wraps_around():
    s = Session()
    for name in BUILTIN_MODELS:
        film = s.film(name)
        assert film is not None and len(film.frames) >= 30, name
        last = model_attention(BUILTINS.get(name), film.probe_ids)
        for a, b in zip(last, film.frames[-1].attention):  # the last frame is the shipped model
            np.testing.assert_allclose(a, b, atol=1e-5)
    film = s.film("copy / induction (built-in)")
    n = len(film.frames)
    assert next_frame(s, "copy / induction (built-in)", n - 1)["value"] == 0
    assert next_frame(s, "copy / induction (built-in)", 3)["value"] == 4
    slider, layer, score = open_film(s, "copy / induction (built-in)")
    assert slider["maximum"] == n - 1 and slider["value"] == n - 1
    assert ("copy match", "match") in score["choices"]


@pytest.mark.parametrize("name", list(BUILTIN_MODELS))
def test_each_film_opens_on_the_head_and_score_that_change_most(name):
    """The layer and score a film opens on are those of the head whose score moves most over its frames
    (recomputed here from the frames); that head is drawn thick and badged; a task model offers its own role."""
    s = Session()
    film = s.film(name)
    _, layer, score = open_film(s, name)
    scores = film.scores()
    spread = {}  # each head's highest minus lowest score over the frames, NaN frames left out (-1: never defined)
    for k, v in scores.items():
        if k != "entropy":
            ok = np.isfinite(v)
            spread[k] = np.where(ok.any(axis=0), np.where(ok, v, -9).max(axis=0) - np.where(ok, v, 9).min(axis=0), -1)
    best = max(float(v.max()) for v in spread.values())
    chosen = spread[score["value"]][layer["value"]]
    assert chosen.max() == pytest.approx(best)
    head = int(np.argmax(chosen))
    if name.startswith("copy"):
        assert layer["value"] == 0 and score["value"] == "match"  # the copying heads are in layer 0
    if name.startswith("grammar"):  # the default model: its own task role, the pronoun head of Explore's first view
        assert ("pronoun → name", "match") in score["choices"] and (layer["value"], score["value"]) == (1, "match")
        assert head == 0
    attention, _, curves, _, _ = film_frame(s, name, len(film.frames) - 1, layer["value"], score["value"])
    assert json.loads(curves.plot)["layout"]["meta"]["highlight"] == [layer["value"], head]
    title = json.loads(attention.plot)["layout"]["annotations"]
    role = film.role(score["value"]).name
    value = scores[score["value"]][-1, layer["value"], head]
    assert any(f"head {head} · {role} {value:.2f}" in a.get("text", "") for a in title)


def test_the_copy_model_film_names_its_induction_phase():
    s = Session()
    film = s.film("copy / induction (built-in)")
    sentences = [p.sentence() for p in film.phases()]
    assert any("induction" in t or "task" in t for t in sentences), sentences


@pytest.mark.parametrize("frame, layer, score", [(-1, 0, "induction"), (10_000, 0, "induction"), (0, 9, "induction"),
                                                 (0, 0, "nope"), ("x", 0, "induction")])
def test_bad_film_requests_are_refused(frame, layer, score):
    with pytest.raises(ValueError):
        film_frame(Session(), "copy / induction (built-in)", frame, layer, score)


def test_a_control_still_at_another_films_frame_or_layer_draws_nothing_and_junk_is_refused():
    """Opening another model's film sets the frame, layer and score; the page sends each one's change, one of
    them while the slider (or the layer) still holds the last film's value. The page's redraw leaves that one
    out (the opening draws the new film right after), where /film refuses it; any other value is drawn or
    refused as /film draws or refuses it."""
    s = Session()
    name = "copy / induction (built-in)"
    film = s.film(name)
    n, layers = len(film.frames), len(film.frames[0].attention)
    for frame, layer in ((n + 29, 0), (0, layers), (-1, 0)):
        assert redraw_film(s, name, frame, layer, "induction") == gr.skip()
        with pytest.raises(ValueError):
            film_frame(s, name, frame, layer, "induction")
    drawn, shown = redraw_film(s, name, 3, 0, "induction"), film_frame(s, name, 3, 0, "induction")
    assert [d.plot for d in drawn[:3]] == [d.plot for d in shown[:3]] and drawn[3:] == shown[3:]
    for frame, layer, score in (("x", 0, "induction"), (2.5, 0, "induction"), (0, 0, "nope"), (True, 0, "induction")):
        with pytest.raises(gr.Error):
            redraw_film(s, name, frame, layer, score)


def test_the_film_grows_while_the_model_trains():
    s = Session()
    progress = s.train(*SORT_FORM)
    seen = []
    for p in progress:
        if p.done:
            break
        film = s.film(p.run.name)  # a run's model is in the list at once, with the frames so far
        seen.append((p.run.step, len(film.frames), film.frames[-1].step if film.frames else None))
    assert seen and seen[0][1] >= 1 and seen[-1][1] > seen[0][1]
    assert all(last is None or last <= step for step, _, last in seen)
    assert s.film(p.run.name).frames[-1].step == 40


def test_the_probe_shown_in_the_caption_stays_text():
    from ui.film import plain

    shown = plain('<img src=x onerror=alert(1)> [a](javascript:x) *b*')
    assert "<img" not in shown and "](" not in shown and "\\*b\\*" in shown


def test_opening_the_film_list_never_takes_back_a_model_picked_meanwhile():
    """The list's focus handler answers after the person may have picked another model: it offers the
    session's models and leaves the value as the page has it (else a slow answer reverted the pick);
    a model that left the list is replaced by the first one."""
    from ui.film import film_choices, follow_model

    s = Session()
    names = s.model_names()
    picked = next(n for n in names if n.startswith("sort"))
    update = film_choices(s, picked)
    assert update["choices"] == names and "value" not in update
    gone = film_choices(s, "a model that left the list")
    assert gone["value"] == names[0] and gone["choices"] == names
    assert follow_model(s, picked)["value"] == picked  # Explore's model changed: the film follows it


def test_a_model_without_a_film_says_so_in_one_line_and_clears_the_figures(tmp_path):
    """A `--model` source has no film: picking it in "Film of" (or in Explore, which the menu follows) keeps
    the controls valid for gradio (a slider of one frame, 0 … 0, is refused as it is built), says so in one
    line, and the three figures leave the page instead of the last film's staying under the new name."""
    import asyncio

    import app
    from tests.support.sessions import TWELVE, offered, twelve_heads
    from ui.film import NO_FILM

    s = offered(twelve_heads(tmp_path))
    assert s.film(TWELVE) is None
    demo = app.build_demo()
    [fn] = [f for f in demo.fns.values() if f.name == "open_film"]
    for name in (TWELVE, "copy / induction (built-in)", TWELVE):  # there, back to a film, and there again
        update = open_film(s, name)
        sent = run_alone(demo.postprocess_data(fn, list(update), None))  # what gradio sends the page
        slider, layer, score = sent
        assert slider["minimum"] < slider["maximum"] and slider["minimum"] <= slider["value"] <= slider["maximum"]
        assert [v for _, v in layer["choices"]].count(layer["value"]) == 1
        assert score["value"] in [v for _, v in score["choices"]]
        assert slider["interactive"] is (name != TWELVE) and layer["interactive"] is (name != TWELVE)
        drawn = film_frame(s, name, slider["value"], layer["value"], score["value"])
        if name == TWELVE:
            assert drawn == (None, None, None, "", NO_FILM) and "\n" not in NO_FILM
            assert redraw_film(s, name, slider["value"], layer["value"], score["value"]) == drawn
        else:
            assert all(d is not None for d in drawn[:3]) and drawn[4].startswith("Frame ")
    with pytest.raises(gr.Error, match="no training film"):
        from ui.film import save_film_page

        save_film_page(s, TWELVE, 0)


def test_a_series_film_names_its_losses_by_what_they_were_measured_on(tmp_path):
    """A film whose losses are the probe's own and a held-out text's (`python -m model.film --heldout`) is never
    drawn or captioned as "train" and "validation": the loss figure, the caption and the saved page name them."""
    import dataclasses

    from model.checkpoint import save_checkpoint
    from model.film import Film
    from ui.film import save_film_page

    entry = BUILTINS.get("copy / induction (built-in)")
    shipped = Session().film(entry.name)
    for held in (False, True):
        frames = [dataclasses.replace(f, val_loss=(f.train_loss + 1 if held else None)) for f in shipped.frames]
        film = Film(shipped.probe_ids, shipped.probe_tokens, frames, shipped.total_steps, loss_source="probe")
        s = Session()
        name = s.upload(str(save_checkpoint(tmp_path / f"series{held}.safetensors", entry.model, entry.tokenizer,
                                            film=film)))
        assert s.film(name).loss_source == "probe"
        fr = frames[4]
        _, loss, _, phases, caption = film_frame(s, name, 4, 0, "induction")
        traces = {t["name"]: t["hovertemplate"] for t in json.loads(loss.plot)["data"]}
        assert "train" not in traces and "validation" not in traces
        assert "loss on the probe" in traces["loss on the probe"]
        assert f"loss on the probe {fr.train_loss:.2f}" in caption and "train" not in caption
        assert ("held-out loss" in caption) is held and ("held-out loss" in traces) is held
        assert not held or f"held-out loss {fr.val_loss:.2f}" in caption
        said = "the held-out loss" if held else "the loss on the probe"
        lines = phases.splitlines()[1:]
        assert lines and all(f"as {said} " in line for line in lines), phases
        page = open(save_film_page(s, name, 0), encoding="utf-8").read()
        assert "loss on the probe" in page and "train loss" not in page
