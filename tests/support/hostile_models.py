"""Hostile model sources, each a small change to a good tiny GPT-2 folder or nanoGPT run (the table
that tests/engine/test_hostile_model_files.py runs through every command line and the app's registry,
and tests/api/test_hostile_sources_app.py gives a running app): `CASES` maps a case's name to its
kind, the change, and the sentence every entrance must answer with; `build_sources(tmp)` writes them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from tokenizers import Tokenizer, models
from transformers import GPT2Config, GPT2LMHeadModel

from tests.support.families import save_reference, sharpen
from tests.support.nanogpt_runs import CHARS, reference, save_run
from tests.support.safetensors_bytes import safetensors_join, safetensors_split
from tests.support.zip_bytes import with_central, zip_bomb

PROMPT = "Once upon a time"
REVISION = "step0"  # each hostile folder is the one revision of a series, so model.film reads it too


def edit_json(path: Path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def folder_case(good: Path, root: Path, change) -> Path:
    folder = root / REVISION
    shutil.copytree(good, folder)
    change(folder)
    return folder


def nano_case(run: Path, root: Path, change) -> Path:
    shutil.copytree(run, root)
    path = root / "ckpt.pt"
    change(path)
    return path


def overlapping(folder: Path) -> None:
    path = folder / "model.safetensors"
    header, body = safetensors_split(path.read_bytes())
    for name, info in header.items():
        if name != "__metadata__":
            info["data_offsets"] = [0, info["data_offsets"][1] - info["data_offsets"][0]]  # every tensor at 0
    path.write_bytes(safetensors_join(header, body))


def tokens(n: int):
    def change(folder: Path) -> None:
        def pad(doc):
            vocab = doc["model"]["vocab"]
            vocab.update({f"pad{i}": i for i in range(len(vocab), n)})
        edit_json(folder / "tokenizer.json", pad)
    return change


def wordpiece(doc: dict) -> None:
    vocab = {t: i for t, i in doc["model"]["vocab"].items()}
    doc["model"] = json.loads(Tokenizer(models.WordPiece(vocab, unk_token="</s>")).to_str())["model"]


def link_out(folder: Path) -> None:
    outside = folder.parent / "somewhere-else.json"
    (folder / "config.json").rename(outside)
    (folder / "config.json").symlink_to(outside)


def config(**values):
    return lambda folder: edit_json(folder / "config.json", lambda doc: doc.update(values))


def tokenizer(change):
    return lambda folder: edit_json(folder / "tokenizer.json", change)


def lie(**where):
    return lambda path: path.write_bytes(with_central(path.read_bytes(), "ckpt/data/0", **where))


FOLDER, NANOGPT, NAME = "folder", "nanogpt", "name"
# name -> (kind, how the good source is changed, the sentence every entrance answers with)
CASES = {
    "config-400-digits": (FOLDER, config(n_embd=int("9" * 400)),
                          "config.json's n_embd must be a whole number from 1 to 2,147,483,647, got a number far too large"),
    "config-nested-100000-deep": (FOLDER, lambda f: (f / "config.json").write_text("[" * 100_000 + "]" * 100_000),
                                  "config.json is nested too deeply (more than 32 levels"),
    "tensors-overlap": (FOLDER, overlapping, "model.safetensors: the bytes of tensor"),
    "name-of-3000-characters": (NAME, None, "has a name of 3,000 bytes; a file or folder name here has at most 255"),
    "nanogpt-million-layers": (NANOGPT, lambda p: save_run(p.parent, reference(len(CHARS)), model_args=dict(
        n_layer=10**6, n_head=4, n_embd=16, block_size=32, bias=True, vocab_size=len(CHARS), dropout=0.0)),
        "the nanoGPT checkpoint describes a model of 1,000,000 layers; at most 256 are read"),
    "tokenizer-padded-to-1000000": (FOLDER, tokenizer(lambda d: d.update(padding={
        "strategy": {"Fixed": 1_000_000}, "direction": "Right", "pad_to_multiple_of": None, "pad_id": 0,
        "pad_type_id": 0, "pad_token": "</s>"})), "tokenizer.json padding must be null"),
    "tokenizer-of-1000000-tokens": (FOLDER, tokens(1_000_000),
                                    "tokenizer.json has 1,000,000 tokens but the model only 300 embedding rows"),
    "tokenizer-regex-replace": (FOLDER, tokenizer(lambda d: d.update(normalizer={
        "type": "Replace", "pattern": {"Regex": "(a+)+b"}, "content": "x"})),
        "tokenizer.json normalizer Replace.pattern has an unknown key 'Regex'"),
    "tokenizer-regex-split": (FOLDER, tokenizer(lambda d: d.update(pre_tokenizer={
        "type": "Split", "pattern": {"Regex": "\\s+"}, "behavior": "Isolated", "invert": False})),
        "tokenizer.json has a pre_tokenizer of type 'Split', which the app does not run"),
    "tokenizer-wordpiece": (FOLDER, tokenizer(wordpiece), "tokenizer.json model.type is 'WordPiece'; only BPE models"),
    "config-links-out": (FOLDER, link_out, "config.json in the folder step0 is a link to a file outside the model's "
                                           "folder, which is not followed"),
    "zip-bomb": (NANOGPT, lambda p: zip_bomb(p.with_name("clean.pt"), p, "ckpt/data/0", 2**30),
                 "ckpt.pt holds a compressed entry 'ckpt/data/0'"),
    "zip-directory-says-800-mb": (NANOGPT, lie(size=800_000_000), "ckpt.pt's zip directory does not agree with its "
                                  "entry 'ckpt/data/0' (more bytes than the file holds before its directory)"),
    "zip-directory-says-64-bytes": (NANOGPT, lie(size=64), "ckpt.pt's zip directory does not agree with its entry "
                                    "'ckpt/data/0' (other sizes after its data)"),
    "zip-directory-points-elsewhere": (NANOGPT, lie(header_of="ckpt/data.pkl"), "ckpt.pt's zip directory does not "
                                       "agree with its entry 'ckpt/data/0' (another name in its local header)"),
}


def build_sources(tmp: Path) -> dict[str, tuple[str, str]]:
    """Each case's source (a folder, a ckpt.pt or a name) and, for model.film, its series folder, written
    under `tmp`; "good" is the good folder they are made from."""
    torch.manual_seed(0)
    ref = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=4, n_embd=16, n_positions=64, vocab_size=300,
                                     bos_token_id=1, eos_token_id=0)).eval()
    sharpen(ref, conv1d=True)
    good = save_reference(ref, tmp / "good" / REVISION, 300)
    run = tmp / "run"
    save_run(run, reference(len(CHARS)))
    shutil.copy(run / "ckpt.pt", run / "clean.pt")
    out = {"good": (str(good), str(good.parent))}
    for name, (kind, change, _) in CASES.items():
        root = tmp / name
        if kind == FOLDER:
            folder = folder_case(good, root, change)
            out[name] = (str(folder), str(root))
        elif kind == NANOGPT:
            out[name] = (str(nano_case(run, root, change)), str(root))
        else:
            long = str(tmp / ("m" * 3000))
            out[name] = (long, long)
    return out
