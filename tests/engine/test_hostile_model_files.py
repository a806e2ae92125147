"""Hostile model files through every entrance, each refused with one sentence before it is read.

One table (CASES) of hostile sources, each made from a good tiny GPT-2 folder or nanoGPT run: a
config.json number of 400 digits or nesting 100,000 deep, safetensors tensors that share their
bytes, a source name of 3,000 characters, a ckpt.pt whose model_args declare 10^6 layers, tokenizer
files the checks of model/hf_tokenizer_checks.py refuse (a padding of 1,000,000, a vocabulary of
1,000,000 tokens for 300 rows, a regex Replace normalizer, a regex Split pre-tokenizer, a WordPiece
model), a config.json that is a link out of its folder, a zip bomb of a ckpt.pt and three zip
directories that lie. Each runs through `python -m model.generate --checkpoint`, `python -m
model.convert` and (folders) `python -m model.film` in a child process (one per command, tests/support/cli_batch.py): exit status 2, nothing on
stdout, exactly one line on stderr (`prog: error: sentence`, no Traceback) holding the case's
sentence, no file written. The app's registry of --model sources (lab.catalogue.external) refuses each with the
same sentence when the model is chosen; tests/api/test_hostile_sources_app.py starts the app with
some of them beside a good model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.hostile_models import CASES, FOLDER, NAME, NANOGPT, PROMPT, REVISION, build_sources

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = ("model.generate", "model.convert", "model.film")


# (case, command): every command of every case, but model.film only reads Hugging Face folders
JOBS = [(case, command) for case, (kind, _, _) in sorted(CASES.items()) for command in COMMANDS
        if command != "model.film" or kind != NANOGPT]


def command_line(command: str, source: str, series: str, out: Path) -> list[str]:
    if command == "model.generate":
        return ["--checkpoint", source, "--prompt", PROMPT, "--max-new-tokens", "2"]
    if command == "model.convert":
        return [source, "--out", str(out)]
    return [series, "--revisions", REVISION, "--probe", PROMPT, "--out", str(out)]


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    return build_sources(tmp_path_factory.mktemp("hostile"))


@pytest.fixture(scope="module")
def answers(sources, tmp_path_factory):
    """Every (case, command) run in a child process, one process per command for all its cases
    (tests/support/cli_batch.py: each line runs as `python -m command` would, its own stdout and stderr
    captured), the three commands at once: (status, stdout, stderr, wrote)."""
    tmp = tmp_path_factory.mktemp("out")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp / "empty-cache"),
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))

    def run(command):
        jobs = [job for job in JOBS if job[1] == command]
        outs = {job: tmp / f"{job[0]}-{command}.safetensors" for job in jobs}
        lines = [command_line(command, *sources[case], outs[(case, command)]) for case, _ in jobs]
        done = subprocess.run([sys.executable, "-m", "tests.support.cli_batch", command], input=json.dumps(lines),
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        return {job: (*answer, outs[job].exists()) for job, answer in zip(jobs, json.loads(done.stdout))}

    with ThreadPoolExecutor(max_workers=len(COMMANDS)) as pool:
        return {job: answer for part in pool.map(run, COMMANDS) for job, answer in part.items()}


def test_the_good_sources_open_through_every_command(sources, tmp_path):
    """The cases are changes of sources that work: the refusals below are about the change."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    for command in COMMANDS:
        out = tmp_path / f"{command}.safetensors"
        source, series = sources["good"]
        done = subprocess.run([sys.executable, "-m", command, *command_line(command, source, series, out)], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("case, command", JOBS)
def test_each_command_refuses_each_hostile_source_in_one_line(answers, case, command):
    kind, _, sentence = CASES[case]
    status, stdout, stderr, wrote = answers[(case, command)]
    assert status == 2, stderr
    assert stdout == "" and not wrote
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"python -m {command}: error: ") and sentence in lines[0], lines[0]
    if command == "model.film" and kind == FOLDER:
        assert lines[0].startswith(f"python -m {command}: error: revision {REVISION}: ")


@pytest.mark.parametrize("case", sorted(c for c, (kind, _, _) in CASES.items() if kind != NAME))
def test_the_app_refuses_each_with_the_same_sentence_when_it_is_chosen(sources, case, tmp_path):
    """The app's --model sources (lab.catalogue.external) load on first use: the hostile one is refused with
    the sentence the commands print; the good one beside it still opens."""
    from lab.checks import UserError
    from lab.catalogue.external import ExternalModels, parse_source

    registry = ExternalModels([parse_source(sources[case][0]), parse_source(sources["good"][0])],
                              tmp_path / "hashes.json")
    hostile, good = registry.names
    with pytest.raises(UserError) as info:
        registry.get(hostile)
    assert CASES[case][2] in str(info.value) and "\n" not in str(info.value)
    assert registry.get(good).model.cfg.n_layers == 2


def test_a_source_name_of_3000_characters_is_a_sentence_for_the_app(sources):
    from lab.catalogue.external import parse_source

    with pytest.raises(ValueError, match=CASES["name-of-3000-characters"][2]):
        parse_source(sources["name-of-3000-characters"][0])
