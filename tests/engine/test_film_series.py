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
                120)
    for key, series_scores in film.scores().items():
        expect = np.stack([head_scores(att, ids)[key] for att, _ in want])
        np.testing.assert_allclose(series_scores, expect, atol=1e-4, equal_nan=True)
    phases = film.phases()
    assert phases and [p.sentence() for p in phases] == [p.sentence() for p in hand.phases()]
    assert (phases[0].layer, phases[0].score) == (1, "induction") and phases[0].after > phases[0].before
    for p in phases[:5]:
        assert p.sentence() in done.stdout
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
