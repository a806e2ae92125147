"""Checkpoints: exact round trips, atomic writes, and refusal of every kind of hostile file."""

from __future__ import annotations

import json
import os
import pickle
import random
import signal
import struct
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest
import torch
from safetensors.torch import save as st_save

import model.checkpoint as ckpt_mod
from model.checkpoint import (
    STALE_TEMP_SECONDS,
    TEMP_PREFIX,
    TEMP_SUFFIX,
    Limits,
    atomic_write,
    checkpoint_bytes,
    load_checkpoint,
    parse_checkpoint,
    save_checkpoint,
    sweep_stale_temp_files,
)
from model.config import ModelConfig
from model.tokenizers import CharTokenizer, WordTokenizer
from model.transformer import DecoderLM
from tests.support.safetensors_bytes import safetensors_join as join, safetensors_split as split

ROOT = Path(__file__).resolve().parents[2]
TOK = CharTokenizer(list("abcdefghij"))  # vocab 11


def make_model(seed: int = 0, **kw) -> DecoderLM:
    torch.manual_seed(seed)
    base = dict(vocab_size=TOK.vocab_size, block_size=12, n_layers=2, n_heads=2, d_model=16, init="torch")
    return DecoderLM(ModelConfig(**{**base, **kw})).eval()


def logits(model: DecoderLM, ids=(1, 5, 2, 9, 3, 3, 7)) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([list(ids)])).logits


# ----------------------------------------------------------------------- byte-level helpers




def edit_config(data: bytes, **changes) -> bytes:
    header, body = split(data)
    cfg = json.loads(header["__metadata__"]["config"])
    cfg.update(changes)
    header["__metadata__"]["config"] = json.dumps(cfg)
    return join(header, body)


@pytest.fixture(scope="module")
def good() -> bytes:
    return checkpoint_bytes(make_model(), TOK, {"note": "hi"})


def refused(data: bytes, *fragments: str) -> str:
    with pytest.raises(ValueError) as info:
        parse_checkpoint(data)
    msg = str(info.value)
    for f in fragments:
        assert f.lower() in msg.lower(), msg
    return msg


# ----------------------------------------------------------------------- round trips


@pytest.mark.parametrize("pos", ["sinusoidal", "learned", "rope", "none"])
@pytest.mark.parametrize("tie", [False, True])
def test_round_trip_identical_logits(tmp_path, pos, tie):
    m = make_model(pos_encoding=pos, tie_weights=tie)
    path = save_checkpoint(tmp_path / "m.safetensors", m, TOK, {"steps": 3})
    loaded = load_checkpoint(path)
    assert loaded.model.cfg == m.cfg
    assert torch.equal(logits(loaded.model), logits(m))
    assert loaded.tokenizer == TOK
    assert loaded.meta == {"steps": 3}
    assert not loaded.model.training
    if tie:
        assert loaded.model.head.weight is loaded.model.tok_emb.weight
        assert "head.weight" not in split(path.read_bytes())[0]  # stored once
    else:
        assert loaded.model.head.weight.data_ptr() != loaded.model.tok_emb.weight.data_ptr()


@pytest.mark.parametrize(
    "kw",
    [
        dict(n_layers=3, n_heads=4, d_model=32, pos_encoding="rope", norm="post", activation="swiglu"),
        dict(n_layers=1, n_heads=1, d_model=4, d_ff=0, pos_encoding="sinusoidal", norm="none", bias=False,
             head_bias=True, attn_out_proj=False),
        dict(block_size=30, activation="relu", d_ff=48, mask="bidirectional"),
    ],
)
def test_other_architecture_loads_as_itself(tmp_path, kw):
    m = make_model(seed=4, **kw)
    loaded = load_checkpoint(save_checkpoint(tmp_path / "other", m, TOK))
    assert loaded.model.cfg == m.cfg
    assert {k: v.shape for k, v in loaded.model.state_dict().items()} == {
        k: v.shape for k, v in m.state_dict().items()}
    assert torch.equal(logits(loaded.model), logits(m))


def test_word_tokenizer_round_trip(tmp_path):
    tok = WordTokenizer(["how", "is", "living"])
    torch.manual_seed(0)
    m = DecoderLM(ModelConfig(vocab_size=tok.vocab_size, block_size=8, n_layers=1, n_heads=1, d_model=8))
    loaded = load_checkpoint(save_checkpoint(tmp_path / "w", m, tok))
    assert loaded.tokenizer == tok and loaded.tokenizer.kind == "word"


def test_save_adds_suffix_and_leaves_no_temp_files(tmp_path):
    m = make_model()
    p1 = save_checkpoint(tmp_path / "model", m, TOK)
    assert p1 == tmp_path / "model.safetensors"
    save_checkpoint(tmp_path / "model", make_model(seed=1), TOK)  # overwrite
    assert sorted(os.listdir(tmp_path)) == ["model.safetensors"]
    assert torch.equal(logits(load_checkpoint(p1).model), logits(make_model(seed=1)))
    assert (p1.stat().st_mode & 0o777) == 0o644


def test_failed_write_keeps_old_file_and_no_temp(tmp_path):
    path = tmp_path / "x.safetensors"
    atomic_write(path, b"old")
    with pytest.raises(TypeError):
        atomic_write(path, object())  # type: ignore[arg-type]
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["x.safetensors"]


def test_next_save_sweeps_only_stale_temp_files(tmp_path):
    """A killed save leaves a temp file; the next save into that folder removes it once stale."""
    old = time.time() - STALE_TEMP_SECONDS - 60
    stale = [f"{TEMP_PREFIX}abc123{TEMP_SUFFIX}", f"{TEMP_PREFIX}zz_9{TEMP_SUFFIX}"]
    fresh = f"{TEMP_PREFIX}live42{TEMP_SUFFIX}"  # could belong to a save running right now
    others = [
        "notes.txt", "old.safetensors", ".tmp-legacy",  # unrelated, however old
        f"{TEMP_PREFIX}abc",  # the prefix without the suffix
        f"x{TEMP_PREFIX}abc{TEMP_SUFFIX}",  # the pattern, not at the start
    ]
    for name in [*stale, fresh, *others]:
        (tmp_path / name).write_bytes(b"partial")
    stale_dir = f"{TEMP_PREFIX}dir{TEMP_SUFFIX}"  # the right name, but not a regular file
    (tmp_path / stale_dir).mkdir()
    (tmp_path / "target.txt").write_text("keep")
    stale_link = f"{TEMP_PREFIX}link{TEMP_SUFFIX}"
    os.symlink(tmp_path / "target.txt", tmp_path / stale_link)
    for name in [*stale, *others, stale_dir]:
        os.utime(tmp_path / name, (old, old))
    os.utime(tmp_path / stale_link, (old, old), follow_symlinks=False)

    path = save_checkpoint(tmp_path / "m", make_model(), TOK)
    left = set(os.listdir(tmp_path))
    assert left == {fresh, *others, stale_dir, stale_link, "target.txt", path.name}
    assert (tmp_path / "target.txt").read_text() == "keep"
    assert load_checkpoint(path).model is not None
    # and the fresh one goes too once it is old enough
    os.utime(tmp_path / fresh, (old, old))
    assert sweep_stale_temp_files(tmp_path) == [fresh]


def test_sweep_of_a_missing_folder_is_harmless(tmp_path):
    assert sweep_stale_temp_files(tmp_path / "nowhere") == []


# ----------------------------------------------------------------------- hostile files


class Evil:
    def __init__(self, canary: Path):
        self.canary = str(canary)

    def __reduce__(self):
        return (os.mkdir, (self.canary,))


def test_pickle_payloads_are_refused_and_never_unpickled(tmp_path):
    # the payload is live: unpickling it really creates the canary
    probe = tmp_path / "probe-canary"
    pickle.loads(pickle.dumps(Evil(probe)))
    assert probe.exists()

    canary = tmp_path / "canary"
    files = {}
    for proto in (0, 2, 4, 5):
        files[f"pickle{proto}"] = pickle.dumps(Evil(canary), protocol=proto)
    p = tmp_path / "zip.pt"
    torch.save(Evil(canary), p)
    files["torch-zip"] = p.read_bytes()
    p = tmp_path / "legacy.pt"
    torch.save(Evil(canary), p, _use_new_zipfile_serialization=False)
    files["torch-legacy"] = p.read_bytes()
    for name, data in files.items():
        target = tmp_path / f"{name}.safetensors"
        target.write_bytes(data)
        with pytest.raises(ValueError) as info:
            load_checkpoint(target)
        assert "safetensors" in str(info.value) or "header" in str(info.value), (name, str(info.value))
        assert not canary.exists(), name


def test_empty_and_tiny_files(tmp_path):
    refused(b"", "8-byte")
    refused(b"\x01" * 7, "8-byte")
    (tmp_path / "empty.safetensors").write_bytes(b"")
    with pytest.raises(ValueError):
        load_checkpoint(tmp_path / "empty.safetensors")
    with pytest.raises(ValueError, match="cannot read"):
        load_checkpoint(tmp_path / "missing.safetensors")


def test_header_longer_than_file(good):
    refused(struct.pack("<Q", len(good)) + good[8:], "longer than the file")
    refused(good[:40], "longer than the file")  # truncated inside the header


def test_header_length_of_many_megabytes(good):
    for n in (1024 * 1024 + 1, 50 * 1024 * 1024, 2**63):
        refused(struct.pack("<Q", n) + good[8:], "header would be")


def test_header_not_json(good):
    (n,) = struct.unpack("<Q", good[:8])
    refused(good[:8] + b"\x80\x04" + b"\xff" * (n - 2) + good[8 + n :], "not valid json")
    refused(good[:8] + b"{" + b"a" * (n - 1) + good[8 + n :], "not valid json")
    refused(join([1, 2, 3], b""), "not a json object")  # type: ignore[arg-type]


def test_deeply_nested_header_is_a_value_error():
    raw = b"[" * 200_000 + b"]" * 200_000
    refused(struct.pack("<Q", len(raw)) + raw, "nested too deeply")
    header = {"__metadata__": {"format": "decoder-lab/1", "config": "[" * 100_000 + "]" * 100_000,
                               "tokenizer": "{}"}}
    refused(join(header, b""))


def test_valid_safetensors_without_our_metadata():
    plain = st_save({"w": torch.zeros(3)})
    refused(plain, "not a decoder lab checkpoint")
    other = st_save({"w": torch.zeros(3)}, metadata={"format": "pt"})
    refused(other, "not a decoder lab checkpoint")


def test_metadata_without_config(good):
    header, body = split(good)
    del header["__metadata__"]["config"]
    refused(join(header, body), "config")
    header, body = split(good)
    header["__metadata__"]["tokenizer"] = "not json"
    refused(join(header, body), "tokenizer")


def test_config_with_unknown_fields(good):
    refused(edit_config(good, evil="rm -rf /"), "unknown config fields", "evil")


@pytest.mark.parametrize("changes", [dict(vocab_size=-1), dict(n_heads=0), dict(dropout=float("nan")),
                                     dict(pos_encoding="alibi"), dict(d_model="16")])
def test_config_with_bad_values(good, changes):
    refused(edit_config(good, **changes))


@pytest.mark.parametrize("field, literal, fragment", [
    ("pe_base", "1" + "0" * 400, "pe_base must be a number > 1, got a number far too large"),
    ("dropout", "1" + "0" * 400, "dropout must be in [0, 1), got a number far too large"),
    ("dropout", "-1" + "0" * 400, "dropout must be in [0, 1), got a number far too large"),
    ("pe_base", "Infinity", "pe_base must be a number > 1, got inf"),
    ("vocab_size", "1" + "0" * 400, "vocab_size is a number far too large, above this app's limit"),
    ("pe_base", "1" + "0" * 5000, "must hold 'config' and 'tokenizer' as JSON"),  # past Python's 4,300 digits
], ids=["pe_base-400-digits", "dropout-400-digits", "dropout-minus-400-digits", "pe_base-inf", "vocab-400-digits",
        "pe_base-5000-digits"])
def test_config_numbers_too_large_for_a_float_are_refused_with_a_sentence(good, field, literal, fragment):
    """A 400-digit number is valid JSON but no float: the refusal names the field, never OverflowError's text."""
    header, body = split(good)
    cfg = json.loads(header["__metadata__"]["config"])
    header["__metadata__"]["config"] = json.dumps({**cfg, field: 0}).replace(f'"{field}": 0', f'"{field}": {literal}')
    msg = refused(join(header, body), fragment)
    assert len(msg) < 300 and "too large to convert" not in msg


@pytest.mark.parametrize(
    "changes, fragment",
    [
        (dict(d_model=100_000, n_layers=1000, n_heads=8), "limit"),
        (dict(vocab_size=10**12), "vocab_size"),
        (dict(block_size=10**9), "block_size"),
        (dict(d_ff=10**9), "d_ff"),
        # every field within its own bound, but together too many parameters
        (dict(vocab_size=4096, d_model=256, n_layers=6, n_heads=8, d_ff=1024), "parameters"),
    ],
)
def test_gigantic_config_refused_before_allocation(good, monkeypatch, changes, fragment):
    data = edit_config(good, **changes)
    built = []
    monkeypatch.setattr(ckpt_mod, "DecoderLM", lambda *a, **k: built.append(1))
    tracemalloc.start()
    try:
        refused(data, fragment)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * 1024 * 1024
    assert built == []


def test_tokenizer_vocab_must_match_config(good):
    refused(edit_config(good, vocab_size=TOK.vocab_size + 1), "tokenizer has 11 tokens", "expects 12")
    header, body = split(good)
    header["__metadata__"]["tokenizer"] = json.dumps({"kind": "char", "chars": list("abc")})
    refused(join(header, body), "tokenizer has 4 tokens")


def test_missing_tensor(good):
    header, body = split(good)
    del header["blocks.1.attn.qkv.weight"]
    refused(join(header, body), "missing", "blocks.1.attn.qkv.weight")


def test_extra_tensor(good):
    header, body = split(good)
    header["evil.weight"] = dict(header["tok_emb.weight"])
    refused(join(header, body), "unexpected", "evil.weight")


def test_tied_checkpoint_must_not_carry_a_head(tmp_path):
    data = checkpoint_bytes(make_model(tie_weights=True), TOK)
    header, body = split(data)
    start, end = header["tok_emb.weight"]["data_offsets"]
    header["head.weight"] = {"dtype": "F32", "shape": header["tok_emb.weight"]["shape"],
                             "data_offsets": [len(body), len(body) + end - start]}
    refused(join(header, body + body[start:end]), "unexpected", "head.weight")


def test_wrong_shape(good):
    header, body = split(good)
    v, d = header["tok_emb.weight"]["shape"]
    header["tok_emb.weight"]["shape"] = [d, v]  # same byte count, wrong layout
    refused(join(header, body), "tok_emb.weight", "shape")


@pytest.mark.parametrize("dtype", ["F16", "I64", "F64", "BF16"])
def test_wrong_dtype(good, dtype):
    header, body = split(good)
    header["head.weight"]["dtype"] = dtype
    refused(join(header, body), "head.weight", "float32")


def test_data_offsets_past_the_end(good):
    header, body = split(good)
    name = max((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][1])
    s, e = header[name]["data_offsets"]
    header[name]["data_offsets"] = [s + 64, e + 64]
    refused(join(header, body), name, "outside the file")
    header[name]["data_offsets"] = [s, e - 4]  # wrong byte length
    refused(join(header, body), name)
    header[name]["data_offsets"] = ["0", 4]
    refused(join(header, body), name)


def test_overlapping_offsets_are_refused(good):
    header, body = split(good)
    a = header["blocks.0.attn.qkv.weight"]
    b = header["blocks.1.attn.qkv.weight"]
    b["data_offsets"] = list(a["data_offsets"])  # both tensors read the same bytes
    msg = refused(join(header, body), "overlap", "each tensor must have bytes of its own")
    assert "deserializing" not in msg  # checked here, in a sentence; the library never sees it
    header, body = split(good)
    for name, info in header.items():
        if name != "__metadata__":  # every tensor at offset 0
            info["data_offsets"] = [0, info["data_offsets"][1] - info["data_offsets"][0]]
    refused(join(header, body), "overlap")
    header, body = split(good)
    refused(join(header, body + b"\0" * 16), "16 bytes after its last tensor that belong to no tensor")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_weights(good, value):
    header, body = split(good)
    s, e = header["blocks.0.attn.qkv.weight"]["data_offsets"]
    pos = s + 4 * 5
    bad = body[:pos] + struct.pack("<f", value) + body[pos + 4 :]
    refused(join(header, bad), "blocks.0.attn.qkv.weight", "nan or infinite")


def test_truncated_file(good, tmp_path):
    for cut in (len(good) - 1, len(good) - 1000, len(good) // 2):
        refused(good[:cut])
        p = tmp_path / "t.safetensors"
        p.write_bytes(good[:cut])
        with pytest.raises(ValueError):
            load_checkpoint(p)
    assert parse_checkpoint(good).model.cfg == make_model().cfg  # the untouched bytes load


def test_file_size_limit(tmp_path, good):
    p = tmp_path / "big.safetensors"
    p.write_bytes(good)
    with pytest.raises(ValueError, match="limit"):
        load_checkpoint(p, Limits(max_file_bytes=len(good) - 1))
    assert load_checkpoint(p, Limits(max_file_bytes=len(good))).model is not None


def test_edited_but_consistent_file_still_loads(good):
    """Sanity for the helpers: re-serialising an untouched header gives a loadable file."""
    header, body = split(good)
    loaded = parse_checkpoint(join(header, body))
    assert torch.equal(logits(loaded.model), logits(make_model()))
    assert loaded.meta == {"note": "hi"}


# ----------------------------------------------------------------------- crash safety

CHILD = r"""
import itertools, sys
import torch
from model.checkpoint import save_checkpoint
from model.config import ModelConfig
from model.tokenizers import CharTokenizer
from model.transformer import DecoderLM
tok = CharTokenizer(list("abcdefghij"))
m = DecoderLM(ModelConfig(vocab_size=tok.vocab_size, block_size=16, n_layers=2, n_heads=2, d_model=64))
for i in itertools.count(1):
    with torch.no_grad():
        for p in m.parameters():
            p.fill_(float(i))
    save_checkpoint(sys.argv[1], m, tok, {"version": i})
    print(i, flush=True)
"""


@pytest.mark.slow
def test_sigkill_during_repeated_saves_leaves_a_loadable_file(tmp_path):
    rng = random.Random(20240601)
    path = tmp_path / "live.safetensors"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    for _ in range(5):
        proc = subprocess.Popen([sys.executable, "-c", CHILD, str(path)], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            first = proc.stdout.readline()  # wait for one complete save
            assert first.strip() == "1", proc.stderr.read()
            time.sleep(rng.uniform(0.0, 0.25))
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        assert proc.returncode == -signal.SIGKILL
        loaded = load_checkpoint(path)
        version = loaded.meta["version"]
        assert isinstance(version, int) and version >= 1
        for name, p in loaded.model.state_dict().items():
            assert torch.all(p == float(version)), name  # exactly the weights saved as that version
    leftovers = [n for n in os.listdir(tmp_path) if n != "live.safetensors"]
    assert all(n.startswith(TEMP_PREFIX) and n.endswith(TEMP_SUFFIX) for n in leftovers)  # only temp files
    # once those are stale, the next save into the folder removes them
    old = time.time() - STALE_TEMP_SECONDS - 60
    for n in leftovers:
        os.utime(tmp_path / n, (old, old))
    save_checkpoint(path, make_model(), TOK)
    assert os.listdir(tmp_path) == ["live.safetensors"]

