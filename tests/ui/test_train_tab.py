"""The Train tab: recipes as defaults, progress with time left, a loss axis for the whole run,
the overfitting hint, keep-best weights, the model removed to make room, and refused uploads cleared.

Real torch, real gradio components; the live-server test uses gradio_client.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import gradio as gr
import numpy as np
import pytest

import app
import viz
from lab.catalogue.models import BUILTINS
from lab.checks import check_sampling
from lab.limits import MAX_USER_MODELS, TRAIN_CORPORA, TRAIN_LIMITS
from lab.session import Session, TrainingRun, removed_note
from lab.training import probe_ids
from model.corpora import build_corpus
from lab.recipe import TAB_CORPUS_PRESETS, train_tab_defaults, train_tab_recipe
from model.presets import PRESETS
from model.train import evaluate, well_above_best
from ui.train import RECIPE_KEYS, corpus_defaults, loss_figure, progress_html, upload_refused

ROOT = Path(__file__).resolve().parents[2]
SHAKESPEARE = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"
# ~1.5 k characters of real text: a 2-layer model memorises it within a few hundred steps (seconds)
SMALL_TEXT = (SHAKESPEARE.read_text(encoding="utf-8")[:1500] if SHAKESPEARE.exists() else
              ("First Citizen:\nBefore we proceed any further, hear me speak.\nAll:\nSpeak, speak.\n" * 20))
TOY = dict(corpus_name="toy", pasted="", upload=None, tokenizer_kind="word", layers=1, heads=1, d_model=8, d_ff=0,
           pos="learned", norm="pre", activation="gelu", dropout=0.0, steps=2, lr=3e-3, seed=0)


def overfit_run(session: Session, keep_best: bool = True, steps: int = 300):
    """A run that overfits: a 2-layer model on 1.5 k characters, evaluated every 30 steps."""
    return list(session.train("text", SMALL_TEXT, None, "char", 2, 4, 64, 256, "learned", "pre", "gelu", 0.0,
                              steps, 3e-3, 0, keep_best))


def text_of(html: str) -> str:
    return re.sub(r"<[^>]+>", "", html)


# ------------------------------------------------------------------------------- defaults


def test_the_recipe_of_each_corpus_is_its_built_in_models():
    for corpus in TRAIN_CORPORA:
        form = train_tab_defaults(corpus, TRAIN_LIMITS)
        preset = PRESETS[TAB_CORPUS_PRESETS[corpus]]
        assert preset.corpus == corpus or (corpus == "text" and preset.name == "shakespeare")
        assert form["tokenizer"] == preset.tokenizer
        assert form["layers"] == preset.model["n_layers"] and form["heads"] == preset.model["n_heads"]
        assert form["lr"] == preset.train.lr
        for label, key in (("layers", "layers"), ("heads", "heads"), ("d_model", "d_model"), ("d_ff", "d_ff"),
                           ("steps", "steps"), ("learning rate", "lr"), ("dropout", "dropout")):
            lo, hi = TRAIN_LIMITS[label]
            assert lo <= form[key] <= hi, (corpus, key)
    grammar = train_tab_defaults("grammar", TRAIN_LIMITS)
    assert grammar == dict(tokenizer="word", layers=3, heads=4, d_model=96, d_ff=384, pos_encoding="learned",
                           norm="pre", activation="gelu", dropout=0.0, steps=1000, lr=2e-3)
    assert train_tab_defaults("sort")["steps"] == PRESETS["sort"].train.steps
    assert train_tab_defaults("toy")["d_model"] == 4 and train_tab_defaults("toy", TRAIN_LIMITS)["d_model"] == 8
    text = train_tab_defaults("text", TRAIN_LIMITS)  # own text: the Shakespeare character model, fewer steps
    assert (text["tokenizer"], text["layers"], text["d_model"], text["steps"]) == ("char", 4, 128, 1000)
    with pytest.raises(ValueError, match="no Train-tab recipe"):
        train_tab_defaults("nope")


@pytest.mark.parametrize("corpus_name", list(TRAIN_CORPORA))
def test_every_recipe_fits_its_corpus_examples_and_probe(corpus_name):
    """The context of every corpus's recipe holds each of its examples whole (input and answer, <EOS> included),
    the film's default probe and every example prompt: no token falls off the front."""
    form = Session.train_defaults(corpus_name)
    own = corpus_name in ("grammar", "text")
    corpus = build_corpus(corpus_name, form["tokenizer"] if own else None, text=SMALL_TEXT if corpus_name == "text"
                          else None)
    mcfg, _ = train_tab_recipe(corpus, max_seconds=None, seed=0,
                               **{k: v for k, v in form.items() if k != "tokenizer"})
    block = mcfg.block_size
    if corpus.kind == "examples":
        for split in (corpus.train, corpus.val):
            whole = split.x.shape[1] + 1  # the input row and its last target, <EOS>
            assert whole <= block, (corpus_name, whole, block)
        preset_block = PRESETS[TAB_CORPUS_PRESETS[corpus_name]].model["block_size"]
        assert block == max(preset_block, corpus.train.x.shape[1] + 1)  # the built-in model's context
    probe = probe_ids(corpus, corpus_name, None, block)
    held_out = corpus.val.x[0] if corpus.val.x.dim() == 2 else corpus.val.x
    assert probe == held_out[:len(probe)].tolist() and len(probe) <= block  # the example from its first token
    if corpus.kind == "examples":
        assert len(probe) == corpus.val.x.shape[1]  # the whole held-out example
    for prompt in corpus.sample_prompts:
        assert len(corpus.tokenizer.encode(prompt)) <= block
    assert {"copy": 20, "sort": 16, "toy": 20}.get(corpus_name, block) == block


def test_a_tab_trained_copy_model_keeps_a_whole_example_in_view():
    """Explore on a copy model trained with the tab's recipe: a whole example (prompt, copy, <EOS>) stays in
    the window, its first letter included."""
    s = Session()
    form = Session.train_defaults("copy")
    for p in s.train("copy", "", None, form["tokenizer"], 1, 1, 16, 32, "learned", "pre", "gelu", 0.0, 10,
                     form["lr"], 0):
        pass
    entry = s.entry_for(p.run.name)
    example = "abcdefgh|abcdefgh"
    s.step(p.run.name, example, check_sampling(1.0, 0, 1.0, 0), force=entry.tokenizer.eos_id)
    assert s.decoder.start == 0 and len(s.decoder.window) == len(example) + 1
    assert [t for t, _ in s.tokens()][0] == "a" and "oldest token was dropped" not in s.status()


def test_the_tab_starts_as_the_recipe_of_its_first_corpus():
    demo = app.build_demo()
    by_id = {b.elem_id: b for b in demo.blocks.values() if getattr(b, "elem_id", None)}
    corpus = by_id["corpus"].value
    form = Session.train_defaults(corpus)
    shown = {"tokenizer": by_id["tokenizer"].value, "layers": by_id["layers"].value, "heads": by_id["heads"].value,
             "d_model": by_id["d_model"].value, "d_ff": by_id["d_ff"].value, "pos_encoding": by_id["pos"].value,
             "norm": by_id["norm"].value, "activation": by_id["activation"].value,
             "dropout": by_id["dropout"].value, "steps": by_id["steps"].value, "lr": by_id["lr"].value}
    assert shown == form
    assert by_id["keep_best"].value is True
    assert by_id["tokenizer"].interactive is (corpus in ("grammar", "text"))
    # the empty loss plot already spans the default run
    empty = json.loads(by_id["loss"].value["plot"] if isinstance(by_id["loss"].value, dict) else by_id["loss"].value.plot)
    assert empty["layout"]["xaxis"]["range"] == [0, form["steps"]]
    assert "No training yet" in text_of(by_id["train_progress"].value)


def test_picking_a_corpus_sets_the_form_to_its_recipe():
    out = corpus_defaults("grammar")
    assert len(out) == 1 + len(RECIPE_KEYS)
    assert "Generated English" in out[0]
    assert out[1]["value"] == "word" and out[1]["interactive"] is True
    assert list(out[2:]) == [Session.train_defaults("grammar")[k] for k in RECIPE_KEYS[1:]]
    sort = corpus_defaults("sort")
    assert sort[1]["value"] == "char" and sort[1]["interactive"] is False
    toy = corpus_defaults("toy")
    assert toy[1]["value"] == "word" and toy[RECIPE_KEYS.index("d_model") + 1] == 8
    for junk in ("nope", None, 3, ["grammar"]):  # a raw call is refused in words (and changes nothing)
        with pytest.raises(gr.Error) as info:
            corpus_defaults(junk)
        assert info.value.message.startswith("corpus must be one of grammar, sort, copy, toy, text; got ")


def test_the_defaults_train_the_recipe_through_the_session():
    """Defaults of the grammar corpus reach the engine unchanged (a run stopped at once)."""
    s = Session()
    form = Session.train_defaults("grammar")
    progress = s.train("grammar", "", None, form["tokenizer"], form["layers"], form["heads"], form["d_model"],
                       form["d_ff"], form["pos_encoding"], form["norm"], form["activation"], form["dropout"], 20,
                       form["lr"], 0)
    first = next(progress)
    s.training.stop()
    last = list(progress)[-1]
    cfg = s.models[last.run.name].model.cfg
    assert (cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.d_ff) == (3, 4, 96, 384)
    assert s.models[last.run.name].tokenizer.kind == "word"
    assert first.message.startswith("step 1/20")


# ------------------------------------------------------------------------------- progress


def test_progress_bar_says_steps_elapsed_and_an_honest_time_left():
    run = TrainingRun("r", total_steps=300, step=100, elapsed=10.0, max_seconds=180.0)
    assert run.seconds_left() == pytest.approx(10.0 / 100 * 200)
    html = progress_html(run)
    assert '<progress value="100" max="300"' in html
    assert text_of(html).endswith("step 100 / 300 · 10 s elapsed · about 20 s left")
    slow = TrainingRun("r", total_steps=2000, step=100, elapsed=20.0, max_seconds=180.0)
    assert slow.seconds_left() == pytest.approx(160.0)  # 380 s by the rate, but the limit ends it at 180 s
    assert "about 2 min 40 s left (the 180 s time limit ends it first)" in text_of(progress_html(slow))
    assert "preparing" in text_of(progress_html(TrainingRun("r", total_steps=50)))
    done = TrainingRun("r", total_steps=300, step=120, elapsed=12.3, done=True, kept_step=90)
    assert text_of(progress_html(done)).endswith("120 / 300 steps in 12 s (ended early); weights kept from step 90")
    assert "<script" not in progress_html(TrainingRun("<script>", total_steps=3, step=1, elapsed=1.0))


def test_the_stream_carries_the_progress_bar():
    s = Session()
    outs = list(app.train_model(s, *{**TOY, "steps": 10}.values()))
    assert all(len(o) == 6 for o in outs)
    last = outs[-1]
    assert last[1].startswith("Training finished after 10 steps")
    assert '<progress value="10" max="10"' in last[5] and "10 / 10 steps in" in text_of(last[5])


# ------------------------------------------------------------------------------- loss axis


def test_loss_axis_spans_the_whole_run_and_stays_still():
    first = viz.loss_curve(np.array([1]), np.array([2.1]), total_steps=300).to_plotly().to_dict()
    assert list(first["layout"]["xaxis"]["range"]) == [0, 300]
    top = first["layout"]["yaxis"]["range"][1]
    assert top == pytest.approx(2.1 * 1.05)
    steps = np.arange(1, 151)
    later = viz.loss_curve(steps, 2.1 / np.sqrt(steps), steps[::30], 2.2 / np.sqrt(steps[::30]),
                           total_steps=300).to_plotly().to_dict()
    assert list(later["layout"]["xaxis"]["range"]) == [0, 300]
    assert later["layout"]["yaxis"]["range"][0] == 0
    assert later["layout"]["yaxis"]["range"][1] == pytest.approx(2.2 * 1.05)  # the highest point so far
    kept = viz.loss_curve(steps, 2.1 / np.sqrt(steps), total_steps=300, kept_step=60).to_plotly().to_dict()
    assert kept["layout"]["shapes"][0]["x0"] == 60 and "kept: step 60" in kept["layout"]["annotations"][0]["text"]
    for bad in (0, -3, 2.5, True, "300"):
        with pytest.raises(ValueError, match="total_steps"):
            viz.loss_curve(steps, steps * 1.0, total_steps=bad)


# ------------------------------------------------------------------------------- overfitting


def test_the_tab_draws_a_loss_that_falls_by_orders_of_magnitude_on_a_log_axis():
    """A run whose loss falls from 2.8 to 0.001 (a task learned: copy, sort) gets a log axis, titled so;
    one that falls by less than LOG_RATIO keeps the still linear axis from 0."""
    steps = list(range(1, 301))
    run = TrainingRun("my copy model", steps=steps, train_loss=[2.8 * np.exp(-s / 30) + 1e-3 for s in steps],
                      val_steps=steps[::30], val_loss=[2.9 * np.exp(-s / 30) + 1e-3 for s in steps[::30]],
                      total_steps=300, step=300)
    y = json.loads(loss_figure(run).plot)["layout"]["yaxis"]
    assert y["type"] == "log" and y["title"]["text"] == "loss (log scale)"
    assert 10 ** y["range"][0] <= min(run.train_loss) and 10 ** y["range"][1] >= max(run.val_loss)
    run.train_loss = [2.0 - s / 300 for s in steps]
    run.val_loss = [2.1 - s / 300 for s in run.val_steps]
    y = json.loads(loss_figure(run).plot)["layout"]["yaxis"]
    assert y.get("type", "linear") == "linear" and y["range"][0] == 0 and y["title"]["text"] == "loss"


def test_well_above_best_is_more_than_a_tenth_or_ten_percent():
    assert not well_above_best(2.86, 2.6) and well_above_best(2.87, 2.6)  # 10 % of 2.6 = 0.26
    assert not well_above_best(0.6, 0.5) and well_above_best(0.61, 0.5)  # at least 0.1
    assert not well_above_best(2.6, 2.6) and not well_above_best(2.0, 2.6)
    assert well_above_best(4.66, 2.60)


def test_overfitting_hint_in_plain_words():
    run = TrainingRun("r", val_steps=[60, 120, 180], val_loss=[2.9, 2.60, 4.66], keep_best=True)
    assert run.overfitting() == (
        "Validation loss 4.66 is well above its best 2.60 (step 120): the model is memorising the training text "
        "(overfitting). Fewer steps, dropout, or a smaller model help; 'keep best' keeps the weights from step 120.")
    run.keep_best = False
    assert run.overfitting().endswith("tick 'keep best' to keep the weights from step 120.")
    assert TrainingRun("r", val_steps=[60, 120], val_loss=[2.6, 2.8]).overfitting() == ""
    assert TrainingRun("r", val_steps=[60], val_loss=[2.6]).overfitting() == ""


needs_real_text = pytest.mark.skipif(not SHAKESPEARE.exists(), reason="overfitting needs real text: "
                                     "../shared/data/tinyshakespeare.txt (the fallback repeats itself, so its "
                                     "held-out part is its training part)")


@pytest.mark.slow  # 300 steps of a 2-layer model on real text
@needs_real_text
def test_an_overfitting_run_is_told_so_and_keeps_the_best_weights():
    s = Session()
    progress = overfit_run(s, keep_best=True)
    hints = [p for p in progress if not p.done and "well above its best" in p.message]
    assert hints, [p.message for p in progress][-3:]
    assert hints[0].message.startswith("step ")  # the step line stays first
    done = progress[-1]
    run = done.run
    best_i = int(np.argmin(run.val_loss))
    best_step = run.val_steps[best_i]
    assert run.kept_step == best_step < run.step == 300
    assert f"it kept the weights from step {best_step}, whose validation loss" in done.message
    assert "'keep best' kept the weights" in done.message
    # the curve ends where the run ended (the last weights' loss); the kept model is the best one
    entry = s.models[run.name]
    from lab.recipe import TAB_BATCH_SIZE, TAB_EVAL_BATCHES

    corpus_val = _text_corpus().val
    kept_val = evaluate(entry.model, corpus_val, TAB_EVAL_BATCHES, TAB_BATCH_SIZE, entry.model.cfg.block_size, 1)
    assert kept_val == pytest.approx(run.val_loss[best_i], abs=1e-4)
    assert run.val_loss[-1] > kept_val
    figure = json.loads(loss_figure(run).plot)
    assert figure["layout"]["shapes"][0]["x0"] == best_step


@pytest.mark.slow  # 300 steps of a 2-layer model on real text
@needs_real_text
def test_without_keep_best_the_last_weights_stay():
    s = Session()
    done = overfit_run(s, keep_best=False)[-1]
    assert done.run.kept_step == done.run.step == 300
    assert "it kept the weights" not in done.message
    assert "tick 'keep best' to keep the weights from step" in done.message


def _text_corpus():
    from model.corpora import build_corpus

    return build_corpus("text", "char", seed=0, text=SMALL_TEXT)


def test_keep_best_is_checked_by_name():
    s = Session()
    for junk in ("yes", 1, None, [True]):
        with pytest.raises(gr.Error, match="keep best must be true or false"):
            list(app.train_model(s, *TOY.values(), junk))
    assert s.models == {} and s.run is None


# ------------------------------------------------------------------------------- room for a model


def test_the_model_removed_to_make_room_is_named():
    assert removed_note(["sort (2)"]) == (
        f"Your oldest model 'sort (2)' was removed to make room ({MAX_USER_MODELS} own models at most).")
    assert removed_note([]) == ""
    s = Session()
    names = [list(app.train_model(s, *TOY.values()))[-1][3]["value"] for _ in range(MAX_USER_MODELS)]
    assert not any("removed to make room" in n for n in names)
    outs = list(app.train_model(s, *{**TOY, "steps": 3}.values()))
    note = f"Your oldest model '{names[0]}' was removed to make room ({MAX_USER_MODELS} own models at most)."
    assert all(note in o[1] for o in outs)  # every update of the run says it, the last one too
    assert outs[0][1].startswith("step ") and outs[-1][1].startswith("Training finished")
    assert names[0] not in s.models and len(s.models) == MAX_USER_MODELS


def test_an_upload_names_the_model_it_pushed_out(tmp_path):
    from model.checkpoint import save_checkpoint

    s = Session()
    names = [list(app.train_model(s, *TOY.values()))[-1][3]["value"] for _ in range(MAX_USER_MODELS)]
    e = BUILTINS.get("sort digits (built-in)")
    good = save_checkpoint(tmp_path / "mine.safetensors", e.model, e.tokenizer, e.meta)
    _, status, dd = app.upload_model(s, str(good))
    assert status == (f"Loaded 'uploaded: mine'. It is now in the Explore model list. Your oldest model "
                      f"'{names[0]}' was removed to make room ({MAX_USER_MODELS} own models at most).")
    assert dd["value"] == "uploaded: mine" and names[0] not in s.models


# ------------------------------------------------------------------------------- refused uploads


def test_a_refused_upload_clears_the_file_and_says_why(tmp_path):
    s = Session()
    list(app.train_model(s, *TOY.values()))
    before = (list(s.models), s.run, s.decoder)
    bad = tmp_path / "broken.safetensors"
    bad.write_bytes(b"\x80\x04\x95" + bytes(300))
    with pytest.raises(gr.Error) as info:
        app.upload_model(s, str(bad))
    cleared, status = upload_refused(s)
    assert cleared is None  # the file box empties
    assert status == f"{info.value.message} Nothing was loaded."
    assert "Decoder Lab model" in status
    assert (list(s.models), s.run, s.decoder) == before
    with pytest.raises(gr.Error):  # a wrong suffix is refused in words too
        app.upload_model(s, {"path": str(bad), "orig_name": "notes.txt"})
    assert upload_refused(s)[1] == "Choose a .safetensors file. Nothing was loaded."
    assert upload_refused(s)[1] == "The file was not loaded. Nothing was loaded."  # told once


def test_the_refused_upload_event_is_wired_and_private():
    demo = app.build_demo()
    by_id = {b.elem_id: b for b in demo.blocks.values() if getattr(b, "elem_id", None)}
    upload, status = by_id["upload"], by_id["upload_status"]
    failure = [fn for fn in demo.fns.values() if fn.name == "upload_refused"]
    assert len(failure) == 1
    fn = failure[0]
    assert [o._id for o in fn.outputs] == [upload._id, status._id] and fn.api_visibility == "private"
    assert fn.trigger_only_on_failure


# ------------------------------------------------------------------------------- live API


@pytest.mark.slow
def test_train_endpoint_returns_the_progress_and_takes_keep_best(app_server):
    from gradio_client import Client

    c = Client(app_server.url, verbose=False)
    params = c.view_api(return_format="dict", print_info=False)["named_endpoints"]["/train"]
    keep, probe = params["parameters"][-2:]
    assert keep["parameter_name"] == "keep_best" and keep["parameter_has_default"] and keep["parameter_default"]
    assert probe["parameter_name"] == "probe" and probe["parameter_has_default"] and probe["parameter_default"] == ""
    args = ("toy", "", None, "word", 1, 1, 8, 0, "learned", "pre", "gelu", 0.0, 10, 0.003, 0)
    status, loss, dd, download, progress = c.predict(*args, api_name="/train")  # keep_best left out: on
    assert status.startswith("Training finished after 10 steps") and "10 / 10 steps in" in text_of(progress)
    assert json.loads(loss["plot"])["layout"]["xaxis"]["range"] == [0, 10]
    status, *_ = c.predict(*args, False, api_name="/train")
    assert status.startswith("Training finished after 10 steps")


def test_a_hugging_face_model_safetensors_is_refused_with_the_command_that_converts_it(tmp_path):
    """save_pretrained's model.safetensors is weights without a Decoder Lab description: the refusal names
    `python -m model.convert` and what to give it; the file that command writes from the folder then uploads."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from model.convert import main as convert
    from tests.support.families import write_tokenizer

    folder = tmp_path / "gpt2-tiny"
    write_tokenizer(folder, 300)
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=32, vocab_size=300, bos_token_id=1,
                               eos_token_id=0)).save_pretrained(folder)
    s = Session()
    before = list(s.models)
    with pytest.raises(gr.Error) as info:
        app.upload_model(s, str(folder / "model.safetensors"))
    said = info.value.message
    assert "not a Decoder Lab model" in said and "python -m model.convert FOLDER --out FILE.safetensors" in said
    assert "config.json" in said and len(said) < 400 and list(s.models) == before
    out = tmp_path / "gpt2-tiny.safetensors"
    assert convert([str(folder), "--out", str(out)]) == 0  # the command as the refusal gives it
    _, status, dd = app.upload_model(s, str(out))
    assert status.startswith("Loaded 'uploaded: gpt2-tiny'") and dd["value"] == "uploaded: gpt2-tiny"
