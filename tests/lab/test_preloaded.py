"""The README's `preload_from_hub` repos are what the app offers when no model is named (lab.catalogue.preloaded):
each one in the hub cache at its line's commit, as `owner/name@commit` through DECODER_LAB_MODELS' own path, and
each one absent left out with one log line. Offline: a fake hub cache in a temporary folder holds a tiny random
GPT-2 laid out as a cached snapshot (models--owner--name/snapshots/<commit>/), checked against transformers.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lab.catalogue import external, preloaded
from lab.catalogue.external import ExternalModels, Source, sources_from
from lab.catalogue.preloaded import parse_line, preloaded_sources, preloads
from tests.support.families import save_reference

import transformers  # noqa: F401 - the reference: a missing package fails collection, never skips

ROOT = Path(__file__).resolve().parents[2]
COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER = "89abcdef0123456789abcdef0123456789abcdef"
REPO, ABSENT = "tiny/gpt2", "nobody/absent"
FILES = "config.json,model.safetensors,tokenizer.json,tokenizer_config.json,README.md"
VOCAB = 300


def readme(folder: Path, lines: list[str]) -> Path:
    """A README whose front matter preloads `lines`, with a body that holds a `---` of its own."""
    items = "".join(f"  - {line}\n" for line in lines)
    path = folder / "README.md"
    path.write_text(f"---\ntitle: t\nsdk: gradio\npreload_from_hub:\n{items}---\n\n# Body\n\n---\nnot: yaml\n",
                    encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A hub cache holding tiny/gpt2 at COMMIT (no refs: a build pinned to a commit writes none), and the
    transformers model its files were saved from."""
    from transformers import GPT2Config, GPT2LMHeadModel

    tmp = tmp_path_factory.mktemp("preloaded")
    torch.manual_seed(0)
    cfg = GPT2Config(n_positions=32, vocab_size=VOCAB, n_embd=16, n_layer=2, n_head=2, bos_token_id=1,
                     eos_token_id=0, attn_implementation="eager")
    ref = GPT2LMHeadModel(cfg).eval()
    snapshot = tmp / "hub" / f"models--{REPO.replace('/', '--')}" / "snapshots" / COMMIT
    save_reference(ref, snapshot, VOCAB)
    (snapshot / "README.md").write_text("---\nlicense: mit\n---\n# A tiny random GPT-2\n", encoding="utf-8")
    return tmp / "hub", ref


@pytest.fixture
def hub(cache, monkeypatch):
    """The fake cache as huggingface_hub's (read at import from HF_HUB_CACHE, so set where it was read)."""
    from huggingface_hub import constants

    folder, _ = cache
    monkeypatch.setenv("HF_HUB_CACHE", str(folder))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(folder))
    return folder


def test_a_line_is_repo_files_and_commit():
    assert parse_line(f"{REPO} {FILES} {COMMIT}") == preloaded.Preload(REPO, tuple(FILES.split(",")), COMMIT)
    assert parse_line(REPO).source == f"{REPO}@main"  # every file at main, as the hub reads it
    for bad in ("", "a b c d", 3, None):
        with pytest.raises(ValueError, match="preload_from_hub"):
            parse_line(bad)


def test_a_cached_repo_is_offered_and_the_absent_ones_named_in_one_line(hub, tmp_path, caplog):
    path = readme(tmp_path, [f"{REPO} {FILES} {COMMIT}", f"{ABSENT} {FILES} {COMMIT}",
                             f"{REPO} {FILES} {OTHER}"])  # the right repo at a commit the cache lacks
    with caplog.at_level(logging.INFO, logger=preloaded.__name__):
        assert preloaded_sources(path) == [f"{REPO}@{COMMIT}"]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and f"{ABSENT}@{COMMIT}" in lines[0] and f"{REPO}@{OTHER}" in lines[0]
    assert "not in this machine's Hugging Face cache" in lines[0]
    assert not any(hub.rglob(f"*{OTHER}*"))  # only looked at: nothing was fetched or made


def test_every_listed_file_must_be_there(hub, tmp_path, caplog):
    path = readme(tmp_path, [f"{REPO} {FILES},generation_config.json,merges.txt {COMMIT}"])
    with caplog.at_level(logging.INFO, logger=preloaded.__name__):
        assert preloaded_sources(path) == []
    assert [r.getMessage().count("merges.txt") for r in caplog.records] == [1]  # the first missing file named
    assert preloaded_sources(readme(tmp_path, [f"{REPO} config.json {COMMIT}"])) == [f"{REPO}@{COMMIT}"]
    assert preloaded_sources(readme(tmp_path, [f"{REPO}"])) == []  # at main: no refs/main in this cache


def test_a_line_without_a_commit_is_offered_at_main_when_the_cache_names_it(cache, tmp_path):
    folder, _ = cache
    hub = shutil.copytree(folder, tmp_path / "hub")
    refs = hub / f"models--{REPO.replace('/', '--')}" / "refs"
    refs.mkdir()
    (refs / "main").write_text(COMMIT)
    assert preloaded_sources(readme(tmp_path, [REPO]), cache_dir=hub) == [f"{REPO}@main"]


def test_no_model_named_means_the_readmes_preloads_through_the_variables_path(hub, tmp_path, monkeypatch, cache):
    monkeypatch.setattr(preloaded, "README", readme(tmp_path, [f"{REPO} {FILES} {COMMIT}", f"{ABSENT} {FILES}"]))
    offered = sources_from([], None)
    assert offered == sources_from([], f"{REPO}@{COMMIT}") == [Source("hub", repo=REPO, revision=COMMIT)]
    assert sources_from([], "") == offered and sources_from(None, " ; ") == offered  # a blank variable names none
    # any model named replaces the README's list
    assert sources_from([], "other/model@main") == [Source("hub", repo="other/model", revision="main")]
    assert [s.repo for s in sources_from(["other/model@main"], None)] == ["other/model"]
    # and the source opens as any hub source does: the snapshot's files, checked against transformers
    models = ExternalModels(offered, tmp_path / "hashes.json")
    name = models.names[0]
    entry = models.get(name)
    assert entry.source == f"{REPO}@{COMMIT}" and entry.licence == "mit"
    assert external.hub_folder(offered[0]) == hub / f"models--{REPO.replace('/', '--')}" / "snapshots" / COMMIT
    _, ref = cache
    ids = entry.tokenizer.encode("the cat sat on the mat")
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits
        got = entry.model(torch.tensor([ids])).logits
    torch.testing.assert_close(got, want[..., : got.shape[-1]], atol=1e-5, rtol=0)


def test_an_unreadable_front_matter_offers_nothing_with_one_line(tmp_path, caplog):
    bad = tmp_path / "README.md"
    bad.write_text("---\npreload_from_hub: [unclosed\n---\n", encoding="utf-8")
    with caplog.at_level(logging.INFO, logger=preloaded.__name__):
        assert preloaded_sources(bad) == []
    assert len(caplog.records) == 1 and "front matter" in caplog.records[0].getMessage()
    assert preloaded_sources(tmp_path / "missing.md") == []  # no README: nothing preloaded, nothing said
    (tmp_path / "plain.md").write_text("# no front matter\n", encoding="utf-8")
    assert preloads(tmp_path / "plain.md") == []


def test_the_app_reads_HF_HUB_CACHE_as_huggingface_hub_does(cache, tmp_path):
    """In a fresh process, as `python app.py` starts: the cache is where HF_HUB_CACHE points."""
    folder, _ = cache
    path = readme(tmp_path, [f"{REPO} {FILES} {COMMIT}"])
    code = ("import sys; from lab.catalogue import preloaded, external; preloaded.README = __import__('pathlib')"
            f".Path({str(path)!r}); print([s.label for s in external.sources_from([], None)])")
    env = {**os.environ, "HF_HUB_CACHE": str(folder), "HF_HUB_OFFLINE": "1"}
    env.pop("DECODER_LAB_MODELS", None)
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == repr([f"{REPO}@{COMMIT}"])
