"""The README's front matter, read as the hub reads a Space's: the YAML between its first two `---` lines.

What makes the Space findable and its build repeatable: every repo the build preloads is listed under `models:`
(what puts the Space on that model's page) and pinned to a commit, with the files the app reads; the thumbnail
is a PNG in the repository at the link card's size; the short description is at most 60 characters; the
gradio the Space installs (`sdk_version`) is the one pinned here. The app reads the same lines
(lab.catalogue.preloaded) to offer what was preloaded, so its reading is held to this one.
"""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import yaml
from PIL import Image

from lab.catalogue.preloaded import preloads

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
THUMBNAIL_SIZE = (1200, 630)  # the hub documents no size; the common link-card size (tests/browser/make_thumbnail.py)
THUMBNAIL_MAX_BYTES = 300_000
SHORT_DESCRIPTION_MAX = 60  # what this project holds it to; the hub's configuration reference states no limit
# what the app reads from a model folder (model/families, model/hf_tokenizer.py), and the card for its licence
APP_FILES = {"config.json", "tokenizer.json", "tokenizer_config.json", "README.md"}
WEIGHTS = ({"model.safetensors"}, {"model.safetensors.index.json"})


def front_matter(text: str) -> dict:
    """The YAML block between the first line `---` and the next one, as a mapping."""
    lines = text.splitlines()
    assert lines and lines[0].strip() == "---", "the README does not start with a front matter"
    end = next(i for i, line in enumerate(lines[1:], 1) if line.strip() == "---")
    data = yaml.safe_load("\n".join(lines[1:end]))
    assert isinstance(data, dict)
    return data


def lines() -> list[list[str]]:
    """Each `preload_from_hub` entry split into its parts."""
    entries = META["preload_from_hub"]
    assert isinstance(entries, list) and entries
    return [entry.split() for entry in entries]


META = front_matter(README.read_text(encoding="utf-8"))


def test_the_front_matter_reads_the_same_as_huggingface_hubs_reader():
    from huggingface_hub.repocard import metadata_load

    assert metadata_load(README) == META


def test_every_preloaded_repo_is_listed_under_models():
    models = META["models"]
    assert isinstance(models, list) and all(isinstance(m, str) for m in models)
    preloaded = [parts[0] for parts in lines()]
    assert len(set(preloaded)) == len(preloaded)  # one line per repo
    assert set(preloaded) <= set(models), "a preloaded repo the model pages would not link to the Space"


def test_every_preload_line_is_pinned_with_the_files_the_app_reads():
    for parts in lines():
        assert len(parts) == 3, f"{parts[0]}: 'repo files commit'"
        repo, files, commit = parts
        assert re.fullmatch(r"[0-9a-f]{40}", commit), f"{repo}: the commit is not a full 40-hex hash"
        names = set(files.split(","))
        assert "" not in names and APP_FILES <= names, f"{repo}: lacks {sorted(APP_FILES - names)}"
        assert any(w <= names for w in WEIGHTS), f"{repo}: no weights"


def test_the_app_reads_the_lines_as_the_hub_does():
    """What lab.catalogue.preloaded offers (owner/name@commit) is what the build downloaded."""
    assert [(p.repo, ",".join(p.files), p.commit) for p in preloads(README)] == [tuple(parts) for parts in lines()]
    assert [p.source for p in preloads(README)] == [f"{repo}@{commit}" for repo, _, commit in lines()]


def test_the_thumbnail_is_a_png_at_the_link_cards_size():
    name = META["thumbnail"]
    assert isinstance(name, str)
    # a path in the repository, or that file's address in a Space (.../resolve/<revision>/<path>)
    path = ROOT / re.sub(r"^https://huggingface\.co/spaces/[^/]+/[^/]+/resolve/[^/]+/", "", name)
    assert path.is_file() and ROOT in path.resolve().parents, f"no file {name} in the repository"
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size == THUMBNAIL_SIZE
    assert path.stat().st_size <= THUMBNAIL_MAX_BYTES


def test_the_short_description_fits():
    text = META["short_description"]
    assert isinstance(text, str) and 0 < len(text) <= SHORT_DESCRIPTION_MAX


def test_the_space_installs_the_gradio_pinned_here():
    assert str(META["sdk_version"]) == importlib.metadata.version("gradio")
    assert META["sdk"] == "gradio" and (ROOT / META["app_file"]).is_file()
