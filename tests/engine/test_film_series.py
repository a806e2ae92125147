"""A film from a series of checkpoints (model/film_series.py, `python -m model.film`): one frame per
revision of a GPT-2 trained here and saved at several steps, each frame equal to the attention
transformers computes on the probe with that checkpoint; its loss the checkpoint's loss on the probe;
the file a Decoder Lab checkpoint holding the last revision's weights and the film, which the app's
upload opens. The same series read from a hub cache gives the same film; bad series are one sentence
and write nothing.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from model.checkpoint import DEFAULT_LIMITS, load_checkpoint
from model.film import Film, Frame
from model.heads import head_scores
from tests.support.series import PROBE, VOCAB, build_neox_series, build_series, fake_hub_series, revisions

ROOT = Path(__file__).resolve().parents[2]
ATTN_TOL, LOSS_TOL = 1e-6, 1e-5


def run_film(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "model.film", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}, timeout=600)


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    root = tmp_path_factory.mktemp("series")
    return root, build_series(root / "gpt2")


def by_hand(folders: dict[str, Path], probe: str):
    """Per revision: (attention per layer (H, T, T), loss on the probe) from transformers, and the ids."""
    from transformers import AutoTokenizer, GPT2LMHeadModel

    ids = AutoTokenizer.from_pretrained(next(iter(folders.values())))(probe)["input_ids"]
    x = torch.tensor([ids])
    out = []
    for folder in folders.values():
        ref = GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager").eval()
        with torch.no_grad():
            res = ref(x, labels=x, output_attentions=True)
        out.append(([a[0].numpy() for a in res.attentions], float(res.loss)))
    return out, ids


def test_a_series_film_holds_each_checkpoints_attention_on_the_probe(series, tmp_path):
    root, folders = series
    out = tmp_path / "film.safetensors"
    done = run_film(str(root / "gpt2"), "--revisions", ",".join(revisions()), "--probe", PROBE, "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert f"wrote {out}: 7 frames (steps 0 … 120)" in done.stdout
    assert "upload will not take it" not in done.stdout
    ck = load_checkpoint(out, DEFAULT_LIMITS)  # what the app's upload opens
    film = ck.film
    want, ids = by_hand(folders, PROBE)
    assert film.probe_ids == ids and len(ids) > 10
    assert [f.step for f in film.frames] == [0, 5, 10, 20, 40, 80, 120] and film.total_steps == 120
    assert film.task is None and film.kept_step is None
    for frame, (attention, loss) in zip(film.frames, want):
        assert len(frame.attention) == 2
        for a, b in zip(frame.attention, attention):
            assert a.shape == b.shape == (4, len(ids), len(ids))
            assert np.abs(a - b).max() <= ATTN_TOL
        assert abs(frame.train_loss - loss) <= LOSS_TOL and frame.val_loss is None
    losses = [loss for _, loss in want]
    assert losses[-1] < losses[0] - 0.5  # the series did learn: the frames differ
    assert not np.allclose(film.frames[0].attention[0], film.frames[-1].attention[0], atol=0.05)
    # scores and phases come from those frames exactly as from a training film's
    hand = Film(ids, film.probe_tokens, [Frame(f.step, att, loss, None) for f, (att, loss) in zip(film.frames, want)],
                120, loss_source="probe")
    for key, series_scores in film.scores().items():
        expect = np.stack([head_scores(att, ids)[key] for att, _ in want])
        np.testing.assert_allclose(series_scores, expect, atol=1e-4, equal_nan=True)
    phases = film.phases()
    assert phases and [p.sentence() for p in phases] == [p.sentence() for p in hand.phases()]
    assert (phases[0].layer, phases[0].score) == (1, "induction") and phases[0].after > phases[0].before
    for p in phases[:5]:
        assert p.sentence() in done.stdout
    # the loss is the probe's own, and is named so: never "train" (no training batch was seen)
    assert film.loss_source == "probe" and film.loss_names() == ("loss on the probe", "held-out loss")
    assert all("as the loss on the probe" in p.sentence() for p in phases)
    assert f"loss on the probe {want[0][1]:.2f} -> {want[-1][1]:.2f}" in done.stdout and "--heldout" in done.stdout
    # the weights are the last revision's
    from transformers import GPT2LMHeadModel

    ref = GPT2LMHeadModel.from_pretrained(folders["step120"]).eval()
    with torch.no_grad():
        torch.testing.assert_close(ck.model(torch.tensor([ids])).logits, ref(torch.tensor([ids])).logits,
                                   atol=1e-5, rtol=0)
    assert ck.meta["revisions"] == revisions() and ck.meta["examples"] == [PROBE]


def test_a_series_in_the_hub_cache_gives_the_same_film(series, tmp_path):
    root, folders = series
    fake_hub_series(tmp_path / "hub", "tiny/series", folders)
    local, hub = tmp_path / "local.safetensors", tmp_path / "hub.safetensors"
    revs = ",".join(revisions((0, 40, 120)))
    assert run_film(str(root / "gpt2"), "--revisions", revs, "--probe", PROBE, "--out", str(local)).returncode == 0
    done = run_film("tiny/series", "--revisions", revs, "--probe", PROBE, "--out", str(hub),
                    env={"HF_HUB_CACHE": str(tmp_path / "hub")})
    assert done.returncode == 0, done.stderr
    a, b = load_checkpoint(local).film, load_checkpoint(hub).film
    assert [f.step for f in a.frames] == [f.step for f in b.frames] == [0, 40, 120]
    for fa, fb in zip(a.frames, b.frames):
        for x, y in zip(fa.attention, fb.attention):
            np.testing.assert_array_equal(x, y)


def test_pythia_shaped_revisions_in_the_hub_cache_make_a_film_as_transformers_computes(tmp_path):
    """The README's Pythia command on a small GPT-NeoX of Pythia's shape (padded vocabulary: the loss is over
    the tokenizer's rows only), three revisions of random weights in a hub cache under Pythia's name."""
    from transformers import GPTNeoXForCausalLM

    folders = build_neox_series(tmp_path / "neox")
    fake_hub_series(tmp_path / "hub", "EleutherAI/pythia-14m", folders)
    out = tmp_path / "pythia.safetensors"
    done = run_film("EleutherAI/pythia-14m", "--revisions", "step0,step1000,step143000", "--probe", PROBE,
                    "--out", str(out), env={"HF_HUB_CACHE": str(tmp_path / "hub")})
    assert done.returncode == 0, done.stderr
    ck = load_checkpoint(out, DEFAULT_LIMITS)
    film = ck.film
    assert ck.model.cfg.vocab_size == VOCAB + 20 and ck.model.cfg.vocab_used == VOCAB
    assert [f.step for f in film.frames] == [0, 1000, 143000] and film.total_steps == 143000
    ids = film.probe_ids
    for frame, folder in zip(film.frames, folders.values()):
        ref = GPTNeoXForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
        with torch.no_grad():
            res = ref(torch.tensor([ids]), output_attentions=True)
        for a, b in zip(frame.attention, res.attentions):
            assert np.abs(a - b[0].numpy()).max() <= ATTN_TOL
        logits = res.logits[0, :-1, :VOCAB].double()  # the 20 padded rows are never a token
        loss = float(torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:])))
        assert abs(frame.train_loss - loss) <= LOSS_TOL


def test_bad_series_are_one_sentence_and_write_nothing(series, tmp_path):
    root, folders = series
    other = build_series(tmp_path / "other", steps=(0, 2), n_head=2)
    for name, folder in other.items():
        os.symlink(folder, root / "gpt2" / f"mixed{name}")
    out = tmp_path / "film.safetensors"
    cases = [
        ((str(root / "gpt2"), "--revisions", "step0,step99"), r"has no folder step99"),
        ((str(root / "gpt2"), "--revisions", "step0,../other"), r"not a plain folder name"),
        ((str(root / "gpt2"), "--revisions", "step0,mixedstep2"), r"revision mixedstep2 is not the same model as step0"),
        ((str(root / "gpt2"), "--revisions", "step0,step0"), r"named twice"),
        ((str(root / "gpt2"), "--revisions", "step40,step10"), r"revision step10 is step 10, not after step 40"),
        (("nobody/absent", "--revisions", "step0"), r"not in the local Hugging Face cache .*hf download nobody/absent"),
    ]
    for args, message in cases:
        done = run_film(*args, "--probe", PROBE, "--out", str(out), env={"HF_HUB_CACHE": str(tmp_path / "empty")})
        assert done.returncode == 2, done.stdout
        assert "Traceback" not in done.stderr
        assert re.search(message, done.stderr), done.stderr
        assert not out.exists()
    done = run_film(str(root / "gpt2"), "--revisions", "step0", "--probe", "a", "--out", str(out))
    assert done.returncode == 2 and "at least 2 tokens" in done.stderr and not out.exists()
    done = run_film(str(root / "gpt2"), "--revisions", "step0", "--probe", PROBE, "--out", str(tmp_path / "f.pt"))
    assert done.returncode == 2 and "must end in .safetensors" in done.stderr


def test_a_frames_step_is_the_number_its_revision_ends_with_else_its_place():
    from model.film_series import revision_steps

    assert revision_steps(["step0", "step512", "step143000"]) == [0, 512, 143000]
    assert revision_steps(["early", "step512", "main"]) == [0, 1, 2]
    with pytest.raises(ValueError, match="training order"):
        revision_steps(["step2000", "step1000"])


HELD_OUT = ("A bear and a fox sat by the river. The bear said the wood was green, and the fox ran home. "
            "Later that day the little fox met the bear again by the water.\n") * 3


def held_out_by_hand(folders: dict[str, Path], text: str) -> tuple[list[float], int]:
    """Per revision, transformers' mean next-token loss on `text` read in windows of the context (64 tokens),
    each starting at the last token of the one before; and the number of tokens."""
    from transformers import AutoTokenizer, GPT2LMHeadModel

    ids = AutoTokenizer.from_pretrained(next(iter(folders.values())))(text)["input_ids"]
    out = []
    for folder in folders.values():
        ref = GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager").eval()
        total = count = 0
        for start in range(0, len(ids) - 1, 63):
            x = torch.tensor([ids[start:start + 64]])
            with torch.no_grad():
                total += float(ref(x, labels=x).loss) * (x.shape[1] - 1)
            count += x.shape[1] - 1
        out.append(total / count)
    return out, len(ids)


def test_a_held_out_text_gives_each_frame_a_held_out_loss_that_the_phases_quote(series, tmp_path):
    """--heldout FILE: each frame's second loss is the checkpoint's loss on that text, over windows of its
    context (the text is longer than one), as transformers computes it; the phases then quote that loss,
    the file keeps what the losses were measured on, and a bad held-out file is one sentence."""
    root, folders = series
    held = tmp_path / "held.txt"
    held.write_text(HELD_OUT, encoding="utf-8")
    out = tmp_path / "film.safetensors"
    done = run_film(str(root / "gpt2"), "--revisions", ",".join(revisions()), "--probe", PROBE, "--heldout",
                    str(held), "--out", str(out))
    assert done.returncode == 0, done.stderr
    film = load_checkpoint(out, DEFAULT_LIMITS).film
    want, n_tokens = held_out_by_hand(folders, HELD_OUT)
    assert n_tokens > 64  # more than one window
    for frame, loss in zip(film.frames, want):
        assert abs(frame.val_loss - loss) <= LOSS_TOL
    assert abs(want[-1] - want[0]) > 0.5  # (it rises: 121 steps on one paragraph learn that paragraph)
    assert film.loss_source == "probe" and np.allclose(film.losses(), want, atol=LOSS_TOL)
    phases = film.phases()
    assert phases and all("as the held-out loss" in p.sentence() for p in phases)
    assert f"held-out loss {want[0]:.2f} -> {want[-1]:.2f}" in done.stdout
    # refused in one sentence, nothing written
    out.unlink()
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait".encode("latin-1"))
    (tmp_path / "blank.txt").write_text("  \n")
    (tmp_path / "one.txt").write_text("a")
    for name, message in (("absent.txt", "cannot read the held-out text"), ("latin1.txt", "not UTF-8 text"),
                          ("blank.txt", "held-out text .* is empty"), ("one.txt", "at least 2 tokens")):
        done = run_film(str(root / "gpt2"), "--revisions", "step0,step5", "--probe", PROBE, "--heldout",
                        str(tmp_path / name), "--out", str(out))
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert re.search(message, done.stderr), done.stderr
        assert not out.exists()


def test_the_probe_loss_label_survives_the_file_and_a_training_film_is_written_as_before():
    from model.film import film_from_tensors, film_to_tensors
    from model.config import ModelConfig

    att = [np.tril(np.ones((1, 3, 3), dtype=np.float32)) / np.arange(1, 4, dtype=np.float32)[:, None]]
    frames = [Frame(0, att, 3.0, None), Frame(5, att, 2.0, 2.5)]
    cfg = ModelConfig(vocab_size=10, block_size=8, n_layers=1, n_heads=1, d_model=4, d_ff=8)
    for source in ("probe", "training"):
        tensors, meta = film_to_tensors(Film([1, 2, 3], ["a", "b", "c"], frames, 5, loss_source=source))
        assert ("loss_source" in meta) is (source == "probe")  # a training film's file is as it was
        assert film_from_tensors(tensors, meta, cfg, 10).loss_source == source
    with pytest.raises(ValueError, match="loss_source must be training or probe"):
        film_from_tensors(tensors, {**meta, "loss_source": "bogus"}, cfg, 10)
