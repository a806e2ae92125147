"""The training film (model/film.py): frame steps, exact recording, storage in checkpoints, validation, phases."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.support.safetensors_bytes import safetensors_join, safetensors_split
from model.checkpoint import checkpoint_bytes, load_checkpoint, parse_checkpoint, save_checkpoint
from model.config import ModelConfig
from model.corpora import Corpus, Split, build_corpus
from model.film import (
    FILM_FRAMES, MAX_FILM_FRAMES, MAX_PROBE_TOKENS, MIN_PHASE_CHANGE, Film, Frame, Phase, default_probe_ids,
    film_from_tensors, film_to_tensors, frame_steps,
)
from model.heads import TASK_ROLES, head_scores, task_score
from model.cli import train_main, train_parser
from model.train import TrainConfig, evaluate, probe, train
from model.transformer import DecoderLM


@pytest.fixture(scope="module")
def sort_corpus():
    return build_corpus("sort")


def tiny_model(corpus, seed: int = 0, **kw) -> DecoderLM:
    torch.manual_seed(seed)
    cfg = dict(vocab_size=corpus.tokenizer.vocab_size, block_size=16, n_layers=2, n_heads=2, d_model=32)
    return DecoderLM(ModelConfig(**{**cfg, **kw}))


def quick(**kw) -> TrainConfig:
    base = dict(steps=30, batch_size=16, lr=3e-3, warmup=3, eval_every=0, eval_batches=2, film_frames=10)
    return TrainConfig(**{**base, **kw})


def weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# ------------------------------------------------------------------------------- frame steps


@pytest.mark.parametrize("total", [0, 1, 2, 5, 38, 39, 40, 41, 100, 999, 2000, 100_000])
@pytest.mark.parametrize("n", [2, 3, 10, FILM_FRAMES, 60, MAX_FILM_FRAMES])
def test_frame_steps_properties(total, n):
    s = frame_steps(total, n)
    assert s == sorted(set(s)) and all(isinstance(x, int) for x in s)
    assert s[0] == 0 and s[-1] == total
    assert len(s) == min(n, total + 1)
    if total >= 4 * n and n >= 10:  # denser early: half of the frames in the first third of the run
        assert s[len(s) // 2] < total / 3
        gaps = np.diff(s)
        assert gaps[: len(gaps) // 2].mean() < gaps[len(gaps) // 2 :].mean()


def test_frame_steps_default_is_forty_frames():
    assert len(frame_steps(2000)) == FILM_FRAMES == 40 and 30 <= FILM_FRAMES <= 60


@pytest.mark.parametrize("total, n", [(-1, 10), (10, 1), (10, 0), (10, MAX_FILM_FRAMES + 1), (1.5, 10), (True, 10)])
def test_frame_steps_refuses_bad_arguments(total, n):
    with pytest.raises(ValueError):
        frame_steps(total, n)


@pytest.mark.parametrize("value", [1, -1, MAX_FILM_FRAMES + 1, 2.5, True, "40", None])
def test_train_config_refuses_bad_film_frames(value):
    with pytest.raises(ValueError, match="film_frames"):
        TrainConfig(film_frames=value)


# ------------------------------------------------------------------------------- recording


def test_film_events_and_shape(sort_corpus):
    cfg = quick()
    events = list(train(tiny_model(sort_corpus), sort_corpus, cfg))
    film = events[-1].film
    assert isinstance(film, Film) and events[-1].frame is None
    assert all(e.film is None for e in events[:-1])
    assert [f.step for f in film.frames] == frame_steps(30, 10)
    handed = [e.frame for e in events[:-1] if e.frame is not None]
    assert handed == film.frames[: len(handed)] and len(handed) >= len(film.frames) - 2
    assert all(e.frame.step <= e.step for e in events[:-1] if e.frame is not None)
    T = len(film.probe_ids)
    assert film.probe_ids == default_probe_ids(sort_corpus, 16) and T == 13  # one held-out example: 6 digits = 6 digits
    assert "".join(film.probe_tokens) == sort_corpus.tokenizer.decode(film.probe_ids)
    assert film.task == "sort" and film.total_steps == 30 and film.kept_step is None
    for fr in film.frames:
        assert len(fr.attention) == 2 and all(a.shape == (2, T, T) and a.dtype == np.float32 for a in fr.attention)
        assert math.isfinite(fr.train_loss) and math.isfinite(fr.val_loss)
    # the loss falls over the film
    assert film.frames[-1].val_loss < film.frames[0].val_loss - 0.3
    sc = film.scores()
    assert set(sc) == {"previous_token", "first_token", "self_attention", "induction", "entropy", "match"}
    assert all(v.shape == (len(film.frames), 2, 2) for v in sc.values())
    for f, fr in enumerate(film.frames):
        hs = head_scores(fr.attention, film.probe_ids)
        np.testing.assert_array_equal(sc["previous_token"][f], hs["previous_token"])


def test_no_film_by_default(sort_corpus):
    events = list(train(tiny_model(sort_corpus), sort_corpus, quick(film_frames=0, steps=5)))
    assert all(e.frame is None and e.film is None for e in events)


def test_training_with_a_film_is_bit_identical(sort_corpus):
    # dropout on: any random number drawn by the recording would change the weights
    runs = []
    for frames in (0, 10):
        model = tiny_model(sort_corpus, dropout=0.1)
        evs = list(train(model, sort_corpus, quick(film_frames=frames, eval_every=10)))
        runs.append((weights(model), [e.train_loss for e in evs]))
    (w0, l0), (w1, l1) = runs
    assert w0.keys() == w1.keys() and all(torch.equal(w0[k], w1[k]) for k in w0)
    assert l0 == l1


def test_frames_are_exactly_the_weights_at_their_steps(sort_corpus):
    """Exactness: the attention of frame N is what the weights after N steps compute on the probe."""
    cfg = quick()
    film = list(train(tiny_model(sort_corpus), sort_corpus, cfg))[-1].film
    for index in (0, 3, 6):
        fr = film.frames[index]
        # a second identical run without a film, stopped after fr.step steps, holds the weights of that step
        model = tiny_model(sort_corpus)
        seen = []
        for ev in train(model, sort_corpus, quick(film_frames=0), should_stop=lambda: len(seen) >= fr.step):
            seen.append(ev)
        assert seen[-1].step == fr.step
        again = probe(model, tuple(film.probe_ids))
        for a, b in zip(again, fr.attention):
            assert np.abs(a - b).max() <= 1e-6
        assert evaluate(model, sort_corpus.val, 2, cfg.batch_size, 16, cfg.seed + 1) == pytest.approx(fr.val_loss, abs=1e-6)


def test_last_frame_is_the_final_model(sort_corpus):
    model = tiny_model(sort_corpus)
    film = list(train(model, sort_corpus, quick()))[-1].film
    for a, b in zip(probe(model, tuple(film.probe_ids)), film.frames[-1].attention):
        assert np.abs(a - b).max() <= 1e-6


def _worsening_corpus(sort_corpus) -> Corpus:
    """Training targets never "0", validation targets always "0": the validation loss only rises,
    so keep_best brings back the weights of the first evaluation."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 10, (256, 12), generator=g)
    y_train = torch.randint(1, 10, (256, 12), generator=g)
    return Corpus("worse", sort_corpus.tokenizer, Split(x, y_train), Split(x.clone(), torch.zeros_like(x)),
                  ["1"], "examples")


def test_last_frame_shows_the_weights_keep_best_brought_back(sort_corpus):
    corpus = _worsening_corpus(sort_corpus)
    model = tiny_model(corpus)
    cfg = quick(steps=40, eval_every=4, keep_best=True, lr=1e-2, warmup=0)
    last = list(train(model, corpus, cfg))[-1]
    film = last.film
    assert last.kept_step == 4 and film.kept_step == 4 and film.frames[-1].step == 40
    final = probe(model, tuple(film.probe_ids))
    for a, b in zip(final, film.frames[-1].attention):
        assert np.abs(a - b).max() <= 1e-6
    at4 = next(f for f in film.frames if f.step == 4)  # step 4 is a frame: the same weights
    for a, b in zip(at4.attention, film.frames[-1].attention):
        assert np.abs(a - b).max() <= 1e-6
    assert film.task is None  # not a sort or copy corpus
    assert "match" not in film.scores()


def test_early_stop_ends_the_film_at_the_last_step_run(sort_corpus):
    seen = []
    model = tiny_model(sort_corpus)
    events = []
    for ev in train(model, sort_corpus, quick(steps=1000), should_stop=lambda: len(seen) >= 7):
        seen.append(ev)
        events.append(ev)
    film = events[-1].film
    assert events[-1].stop_reason == "stopped" and film.frames[-1].step == 7 and film.total_steps == 1000
    assert [f.step for f in film.frames] == [s for s in frame_steps(1000, 10) if s < 7] + [7]
    for a, b in zip(probe(model, tuple(film.probe_ids)), film.frames[-1].attention):
        assert np.abs(a - b).max() <= 1e-6
    # stopped before the first step: one frame, the untrained model
    film = list(train(tiny_model(sort_corpus), sort_corpus, quick(), should_stop=lambda: True))[-1].film
    assert [f.step for f in film.frames] == [0]


def test_probe_is_cut_to_its_last_tokens(sort_corpus):
    long = tuple(sort_corpus.tokenizer.encode("5031245031245031245"))
    film = list(train(tiny_model(sort_corpus), sort_corpus, quick(steps=3, probe_ids=long)))[-1].film
    assert film.probe_ids == list(long[-16:])  # the block size (16) is below MAX_PROBE_TOKENS
    model = tiny_model(sort_corpus, block_size=64)
    text = build_corpus("grammar")
    model = tiny_model(text, block_size=64)
    film = list(train(model, text, quick(steps=2)))[-1].film
    assert film.probe_ids == [int(i) for i in text.val.x[:MAX_PROBE_TOKENS]]
    assert film.task == "grammar"  # its pronoun → name score is known
    with pytest.raises(ValueError, match="probe"):
        list(train(tiny_model(sort_corpus), sort_corpus, quick(steps=2, probe_ids=(99,))))


# ------------------------------------------------------------------------------- storage


@pytest.fixture(scope="module")
def trained(sort_corpus):
    model = tiny_model(sort_corpus)
    last = list(train(model, sort_corpus, quick()))[-1]
    return model, last.film


def assert_same_film(a: Film, b: Film) -> None:
    assert (a.probe_ids, a.probe_tokens, a.total_steps, a.task, a.kept_step) == \
        (b.probe_ids, b.probe_tokens, b.total_steps, b.task, b.kept_step)
    assert len(a.frames) == len(b.frames)
    for x, y in zip(a.frames, b.frames):
        assert (x.step, x.train_loss, x.val_loss) == (y.step, y.train_loss, y.val_loss)
        for p, q in zip(x.attention, y.attention):
            np.testing.assert_array_equal(p, q)


def test_film_round_trip_through_a_checkpoint(tmp_path, sort_corpus, trained):
    model, film = trained
    path = save_checkpoint(tmp_path / "m", model, sort_corpus.tokenizer, {"corpus": "sort"}, film=film)
    ck = load_checkpoint(path)
    assert_same_film(film, ck.film)
    for k, v in model.state_dict().items():
        assert torch.equal(v, ck.model.state_dict()[k])
    # a file without a film loads as before
    plain = save_checkpoint(tmp_path / "plain", model, sort_corpus.tokenizer)
    assert load_checkpoint(plain).film is None
    header, _ = safetensors_split(plain.read_bytes())
    assert not any(k.startswith("film.") for k in header) and "film" not in header["__metadata__"]


def test_film_tensors_are_lower_triangles(trained):
    _, film = trained
    tensors, meta = film_to_tensors(film, causal=True)
    T, F = len(film.probe_ids), len(film.frames)
    assert set(tensors) == {"film.attention.0", "film.attention.1"}
    assert all(t.dtype == torch.float32 and tuple(t.shape) == (F, 2, T * (T + 1) // 2) for t in tensors.values())
    json.dumps(meta, allow_nan=False)
    assert meta["steps"] == [f.step for f in film.frames] and meta["task"] == "sort"


def test_film_size_for_a_4x4_model_and_a_32_token_probe():
    """40 frames × 4 layers × 4 heads × 528 lower-triangle values × 4 bytes ≈ 1.35 MB (60 frames: ≈ 2.0 MB)."""
    corpus = build_corpus("grammar")
    model = DecoderLM(ModelConfig(vocab_size=corpus.tokenizer.vocab_size, block_size=64, n_layers=4, n_heads=4,
                                  d_model=32))
    ids = default_probe_ids(corpus, 64)
    att = probe(model, tuple(ids))
    film = Film(ids, [corpus.tokenizer.piece(i) for i in ids],
                [Frame(s, att, 1.0, 1.0) for s in frame_steps(1000)], 1000)
    plain = len(checkpoint_bytes(model, corpus.tokenizer))
    extra = len(checkpoint_bytes(model, corpus.tokenizer, film=film)) - plain
    assert 40 * 16 * 528 * 4 <= extra <= 40 * 16 * 528 * 4 + 8_000
    ck = parse_checkpoint(checkpoint_bytes(model, corpus.tokenizer, film=film))
    assert_same_film(film, ck.film)


def _valid(trained):
    model, film = trained
    tensors, meta = film_to_tensors(film, causal=True)
    return tensors, meta, model.cfg, model.cfg.vocab_size


def _square(film: Film, layer: int) -> torch.Tensor:
    return torch.from_numpy(np.stack([f.attention[layer] for f in film.frames]).copy())


def test_valid_film_tensors_load(trained):
    tensors, meta, cfg, vocab = _valid(trained)
    assert_same_film(trained[1], film_from_tensors(tensors, meta, cfg, vocab))
    # full squares are accepted too
    sq = {k: _square(trained[1], i) for i, k in enumerate(sorted(tensors))}
    assert_same_film(trained[1], film_from_tensors(sq, meta, cfg, vocab))


def _mutations(film: Film):
    """(what is wrong, change(tensors, meta), expected message): one per validation rule."""
    T = len(film.probe_ids)
    F = len(film.frames)

    def meta_set(key, value):
        return lambda t, m: m.__setitem__(key, value)

    def tensor_set(fn):
        def change(t, m):
            t["film.attention.0"] = fn(t["film.attention.0"].clone())
        return change

    def too_many(t, m):
        n = MAX_FILM_FRAMES + 1
        m.update(steps=list(range(n)), train_loss=[1.0] * n, val_loss=[1.0] * n)
        for k in t:
            t[k] = t[k][:1].repeat(n, 1, 1)

    def above_diagonal(t, m):
        sq = _square(film, 0)
        sq[:, :, 0, :] = 1.0 / T  # the first query looks at every token, later ones too
        t["film.attention.0"] = sq

    def rows_off(a):
        a[:, :, 0] = 0.5  # the first row (one key) sums to 0.5
        return a

    return [
        ("metadata not an object", lambda t, m: m.clear() or m.update(x=1), "lacks"),
        ("extra metadata", meta_set("extra", 1), "unexpected"),
        ("no frames", lambda t, m: m.update(steps=[], train_loss=[], val_loss=[]), "frames"),
        ("too many frames", too_many, "frames"),
        ("steps not increasing", meta_set("steps", [0, 0] + film.steps().tolist()[2:]), "strictly increasing"),
        ("steps decreasing", meta_set("steps", film.steps().tolist()[::-1]), "strictly increasing"),
        ("step past total", meta_set("total_steps", int(film.steps()[-1]) - 1), "within"),
        ("negative step", meta_set("steps", [-1] + film.steps().tolist()[1:]), "within"),
        ("step not an int", meta_set("steps", [0.5] + film.steps().tolist()[1:]), "whole numbers"),
        ("loss NaN", meta_set("train_loss", [float("nan")] * F), "train_loss"),
        ("loss infinite", meta_set("val_loss", [float("inf")] * F), "val_loss"),
        ("loss missing", meta_set("train_loss", [1.0] * (F - 1)), "train_loss"),
        ("probe id past vocab", meta_set("probe_ids", film.probe_ids[:-1] + [10**6]), "vocabulary"),
        ("negative probe id", meta_set("probe_ids", [-1] + film.probe_ids[1:]), "vocabulary"),
        ("probe too long", meta_set("probe_ids", [0] * 17), "probe has 17 tokens"),
        ("probe empty", meta_set("probe_ids", []), "probe has 0 tokens"),
        ("pieces mismatch", meta_set("probe_tokens", ["a"] * (T - 1)), "probe_tokens"),
        ("piece too long", meta_set("probe_tokens", ["a" * 1000] * T), "probe_tokens"),
        ("unknown task", meta_set("task", "translate"), "task"),
        ("kept step outside", meta_set("kept_step", 10**6), "kept_step"),
        ("total not an int", meta_set("total_steps", "30"), "total_steps"),
        ("missing layer", lambda t, m: t.pop("film.attention.1"), "layers"),
        ("extra tensor", lambda t, m: t.__setitem__("film.attention.9", t["film.attention.0"]), "layers"),
        ("wrong heads", tensor_set(lambda a: a[:, :1]), "shape"),
        ("wrong frames", tensor_set(lambda a: a[:-1]), "shape"),
        ("wrong tokens", tensor_set(lambda a: a[..., :-1]), "shape"),
        ("float64", tensor_set(lambda a: a.double()), "float32"),
        ("NaN attention", tensor_set(lambda a: a.index_fill_(2, torch.tensor([3]), float("nan"))), "NaN"),
        ("negative attention", tensor_set(lambda a: a.index_fill_(2, torch.tensor([3]), -0.5)), r"\[0, 1\]"),
        ("attention above 1", tensor_set(lambda a: a.index_fill_(2, torch.tensor([3]), 2.0)), r"\[0, 1\]"),
        ("rows do not sum to 1", tensor_set(rows_off), "sum to 1"),
        ("looks ahead", above_diagonal, "above the diagonal"),
    ]


def test_every_hostile_film_is_refused(trained):
    _, film = trained
    for what, change, message in _mutations(film):
        tensors, meta, cfg, vocab = _valid(trained)
        change(tensors, meta)
        with pytest.raises(ValueError, match=message) as info:
            film_from_tensors(tensors, meta, cfg, vocab)
        assert str(info.value).startswith("film: "), what


def test_film_metadata_must_be_an_object(trained):
    tensors, _, cfg, vocab = _valid(trained)
    for meta in (None, [], "x", 3):
        with pytest.raises(ValueError, match="JSON object"):
            film_from_tensors(tensors, meta, cfg, vocab)


def _file_with(trained, sort_corpus, change) -> bytes:
    model, film = trained
    header, body = safetensors_split(checkpoint_bytes(model, sort_corpus.tokenizer, film=film))
    return change(header, body)


def test_a_hostile_film_refuses_the_whole_file(trained, sort_corpus):
    def bad_meta(header, body):
        meta = json.loads(header["__metadata__"]["film"])
        meta["probe_ids"][0] = 10**6
        header["__metadata__"]["film"] = json.dumps(meta)
        return safetensors_join(header, body)

    def no_meta(header, body):
        del header["__metadata__"]["film"]
        return safetensors_join(header, body)

    def no_tensors(header, body):
        for k in [k for k in header if k.startswith("film.")]:
            del header[k]
        return safetensors_join(header, body)

    def nan_meta(header, body):
        header["__metadata__"]["film"] = header["__metadata__"]["film"].replace('"train_loss": [', '"train_loss": [NaN, ', 1)
        return safetensors_join(header, body)

    def not_json(header, body):
        header["__metadata__"]["film"] = "{not json"
        return safetensors_join(header, body)

    def nan_attention(header, body):
        start, _ = header["film.attention.0"]["data_offsets"]
        body = bytearray(body)
        body[start : start + 4] = np.float32("nan").tobytes()
        return safetensors_join(header, bytes(body))

    def lying_offsets(header, body):
        header["film.attention.0"]["data_offsets"][1] += 4
        return safetensors_join(header, body)

    def wrong_dtype(header, body):
        header["film.attention.0"]["dtype"] = "F16"
        return safetensors_join(header, body)

    cases = [(bad_meta, "vocabulary"), (no_meta, "no film metadata"), (no_tensors, "no film tensors"),
             (nan_meta, "not valid JSON"), (not_json, "not valid JSON"), (nan_attention, "NaN"),
             (lying_offsets, "outside the file"), (wrong_dtype, "float32")]
    for change, message in cases:
        with pytest.raises(ValueError, match=message) as info:
            parse_checkpoint(_file_with(trained, sort_corpus, change))
        assert str(info.value).startswith("film: ")


def test_saving_an_inconsistent_film_is_refused(tmp_path, trained, sort_corpus):
    model, film = trained
    bad = Film(film.probe_ids, film.probe_tokens, film.frames, total_steps=1)  # frames past total_steps
    with pytest.raises(ValueError, match="film: "):
        save_checkpoint(tmp_path / "bad", model, sort_corpus.tokenizer, film=bad)
    assert not (tmp_path / "bad.safetensors").exists()


# ------------------------------------------------------------------------------- phases


def _uniform(T: int) -> np.ndarray:
    a = np.tril(np.ones((T, T), np.float32))
    return a / a.sum(-1, keepdims=True)


def _previous(T: int) -> np.ndarray:
    a = np.zeros((T, T), np.float32)
    a[0, 0] = 1
    a[np.arange(1, T), np.arange(T - 1)] = 1
    return a


def _synthetic_film(jump_at: int, falls: bool = False, task=None, tokens=None) -> Film:
    """2 layers × 2 heads on 8 tokens, 21 frames over 1000 steps: every head uniform, except
    layer 1 · head 0, which becomes (or, with falls, stops being) a previous-token head at `jump_at`."""
    T = 8
    steps = list(range(0, 1001, 50))
    frames = []
    for s in steps:
        layers = [np.stack([_uniform(T)] * 2) for _ in range(2)]
        on = (s >= jump_at) != falls
        if on:
            layers[1][0] = _previous(T)
        frames.append(Frame(s, layers, 2.0 - s / 1000, 2.1 - s / 1000))
    tokens = tokens or [str(i) for i in range(T)]
    return Film(list(range(T)), tokens, frames, 1000, task=task)


def test_phase_of_a_head_that_becomes_a_previous_token_head():
    film = _synthetic_film(400)
    phases = film.phases()
    assert len(phases) == 1  # the uniform heads never change
    p = phases[0]
    assert (p.layer, p.head, p.score, p.step) == (1, 0, "previous_token", 400)
    assert p.before < 0.5 <= p.after == 1.0
    # the window: 2 frames (100 steps) here, more than 5 % of the run; the first one holding the jump
    assert p.loss_before == pytest.approx(2.1 - 0.3) and p.loss_after == pytest.approx(2.1 - 0.4)
    assert p.sentence() == ("layer 1 · head 0 becomes a previous-token head around step 400, "
                            f"as the loss falls from {p.loss_before:.2f} to {p.loss_after:.2f}")


def test_phase_of_a_head_that_stops():
    p = _synthetic_film(600, falls=True).phases()[0]
    assert (p.layer, p.head, p.score, p.step) == (1, 0, "previous_token", 600)
    assert p.sentence().startswith("layer 1 · head 0 stops being a previous-token head around step 600, as the loss")


def test_phase_of_a_rise_that_stays_below_the_threshold():
    film = _synthetic_film(10_000)  # never jumps
    T = 8
    for fr in film.frames:  # layer 0 · head 1 moves 30 % towards its previous token at step 550
        w = 0.0 if fr.step < 550 else 0.3
        fr.attention[0][1] = (1 - w) * _uniform(T) + w * _previous(T)
    p = film.phases()[0]
    assert (p.layer, p.head, p.score, p.step) == (0, 1, "previous_token", 550)
    uniform = np.mean([1 / (i + 1) for i in range(1, T)])  # a uniform head's previous-token score
    assert p.after - p.before == pytest.approx(0.3 * (1 - uniform), abs=1e-6) and p.after < 0.5
    assert f"layer 0 · head 1: its previous-token score rises from {p.before:.2f} to {p.after:.2f} around step 550" \
        in p.sentence()


def test_small_changes_are_not_phases():
    film = _synthetic_film(10_000)
    T = 8
    for fr in film.frames:
        w = 0.0 if fr.step < 500 else MIN_PHASE_CHANGE * 0.8 / (1 - 1 / 7)  # a rise below the minimum
        fr.attention[0][1] = (1 - w) * _uniform(T) + w * _previous(T)
    assert film.phases() == []


def test_phases_rank_by_change_relative_to_the_threshold():
    film = _synthetic_film(400)
    T = 8
    for fr in film.frames:  # layer 0 · head 0: a smaller rise, later
        w = 0.0 if fr.step < 800 else 0.5
        fr.attention[0][0] = (1 - w) * _uniform(T) + w * _previous(T)
    phases = film.phases()
    assert [(p.layer, p.head, p.step) for p in phases] == [(1, 0, 400), (0, 0, 800)]
    assert all(isinstance(p, Phase) for p in phases)


def test_match_score_and_its_phase_for_the_sort_task():
    tokens = list("310=013")  # 7 tokens: the answer's queries 3, 4, 5 should read 2, 1, 0 ("0", "1", "3")
    T = len(tokens)
    steps = list(range(0, 1001, 50))
    frames = []
    for s in steps:
        a = np.stack([_uniform(T)])
        if s >= 300:
            a = np.zeros((1, T, T), np.float32)
            a[0, np.arange(T), np.arange(T)] = 1
            for q, k in ((3, 2), (4, 1), (5, 0)):
                a[0, q] = 0
                a[0, q, k] = 1
        frames.append(Frame(s, [a], 1.0, None))
    film = Film(list(range(T)), tokens, frames, 1000, task="sort")
    sc = film.scores()
    assert sc["match"][0, 0, 0] == pytest.approx(np.mean([1 / 4, 1 / 5, 1 / 6]))
    assert sc["match"][-1, 0, 0] == 1.0
    p = film.phases()[0]
    assert (p.score, p.step) == ("match", 300)
    assert "starts to follow the task's ideal pattern around step 300" in p.sentence()
    assert film.loss_at(300) == 1.0  # no validation loss: the train loss


def _brute_largest_change(film: Film) -> tuple[str, int, int, float]:
    """The plain loop: every role score (one with a threshold), every head, highest minus lowest over the frames."""
    best = None
    for key, s in film.scores().items():
        if key == "entropy":
            continue
        L, H = s.shape[1:]
        for layer in range(L):
            for head in range(H):
                series = [v for v in s[:, layer, head] if math.isfinite(v)]
                if series and (best is None or max(series) - min(series) > best[3] + 1e-12):
                    best = (key, layer, head, max(series) - min(series))
    return best


def test_largest_change_is_the_head_and_score_that_move_most():
    film = _synthetic_film(400)  # only layer 1 · head 0 changes: it becomes a previous-token head
    key, layer, head, change = film.largest_change()
    assert (key, layer, head) == ("previous_token", 1, 0)
    assert change == pytest.approx(_brute_largest_change(film)[3])
    assert film.head_of_largest_change("previous_token", 1) == 0
    T = 8
    for fr in film.frames:  # layer 0 · head 1 now moves further: from its previous token to itself
        fr.attention[0][1] = _previous(T) if fr.step < 700 else np.eye(T, dtype=np.float32)
    found = film.largest_change()
    assert found[1:3] == (0, 1) and found[3] == pytest.approx(1.0)  # both its scores move by 1: the first wins
    assert found[:3] == ("previous_token", 0, 1) == _brute_largest_change(film)[:3]
    assert film.head_of_largest_change("self_attention", 0) == 1
    assert film.head_of_largest_change("previous_token", 1) == 0  # per layer and score
    assert Film([0], ["a"], [], 10).largest_change() is None


@pytest.mark.parametrize("name", ["grammar", "sort", "copy", "toy", "shakespeare"])
def test_each_shipped_film_opens_where_it_changes_most(name):
    film = load_checkpoint(Path(__file__).resolve().parents[2] / "assets" / f"{name}.safetensors").film
    found = film.largest_change()
    assert found[:3] == _brute_largest_change(film)[:3]
    assert found[3] == pytest.approx(_brute_largest_change(film)[3])
    if name == "copy":  # the copying heads are in layer 0 (learned positions let them read i − 9 directly)
        assert found[0] == "match" and found[1] == 0 and found[3] > 0.8
    if name == "grammar":  # its own task role: pronoun → name, in the head the Explore tab opens on
        assert film.task == "grammar" and film.role("match").name == "pronoun → name"
        assert found[:3] == ("match", 1, 0)


def test_the_grammar_film_scores_pronoun_to_name():
    tokens = "tom met anna . she saw him".split()  # she (4) → anna (2), him (6) → tom (0)
    T = len(tokens)
    a = np.tile(_uniform(T), (1, 2, 1, 1))[0]  # (2, T, T): head 0 uniform
    a[1] = _previous(T)
    a[1, 4], a[1, 6] = 0, 0
    a[1, 4, 2], a[1, 6, 0] = 1, 1  # head 1 links each pronoun to its name
    film = Film(list(range(T)), tokens, [Frame(0, [a], 1.0, None)], 10, task="grammar")
    assert film.match_keys()[0].tolist() == [4, 6] and film.match_keys()[1].tolist() == [2, 0]
    sc = film.scores()["match"][0, 0]
    assert sc[1] == 1.0 and sc[0] == pytest.approx(max(1 / 5, 1 / 7))  # the larger of its two links
    np.testing.assert_allclose(sc, task_score("grammar", a[None], [4, 6], [2, 0])[0])
    assert film.role("match") == TASK_ROLES["grammar"]
    with pytest.raises(ValueError, match="no task"):
        Film([0], ["a"], [], 10).role("match")


def test_film_helpers():
    film = _synthetic_film(400)
    assert film.steps().tolist() == list(range(0, 1001, 50))
    assert film.loss_at(420) == pytest.approx(2.1 - 0.4) and film.loss_at(-5) == pytest.approx(2.1)
    assert film.frame_index(420) == 8


# ------------------------------------------------------------------------------- CLI


def test_cli_records_a_film_into_the_checkpoint(tmp_path, capsys):
    assert train_main(["--preset", "sort", "--steps", "20", "--film", "8", "--out", str(tmp_path / "s"), "--quiet"]) == 0
    ck = load_checkpoint(tmp_path / "s.safetensors")
    film = ck.film
    assert [f.step for f in film.frames] == frame_steps(20, 8) and film.task == "sort"
    assert "=" in film.probe_tokens and len(film.probe_ids) == 13  # a held-out example: prompt and answer
    meta = json.loads((tmp_path / "s.json").read_text())
    assert meta["film_frames"] == 8 and "=" in meta["film_probe"]
    for a, b in zip(probe(ck.model, tuple(film.probe_ids)), film.frames[-1].attention):
        assert np.abs(a - b).max() <= 1e-6
    # --probe: the typed text; --film 0: no film
    assert train_main(["--preset", "copy", "--steps", "5", "--film", "4", "--probe", "abcd|abcd",
                 "--out", str(tmp_path / "c"), "--quiet"]) == 0
    film = load_checkpoint(tmp_path / "c.safetensors").film
    assert "".join(film.probe_tokens) == "abcd|abcd" and film.task == "copy" and len(film.frames) == 4
    assert train_main(["--preset", "toy", "--steps", "5", "--film", "0", "--out", str(tmp_path / "t"), "--quiet"]) == 0
    assert load_checkpoint(tmp_path / "t.safetensors").film is None
    assert "film_frames" not in json.loads((tmp_path / "t.json").read_text())


def test_cli_film_defaults_and_refusals(capsys):
    args = train_parser().parse_args([])
    assert args.film == FILM_FRAMES and args.probe is None
    assert train_main(["--preset", "toy", "--steps", "5", "--film", "1"]) == 2
    assert "film_frames" in capsys.readouterr().err
    assert train_main(["--preset", "toy", "--steps", "5", "--probe", ""]) == 2
