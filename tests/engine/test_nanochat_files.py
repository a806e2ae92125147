"""nanochat's files through every door, and hostile ones refused with a sentence.

* The doors: `python -m model.generate --checkpoint` (nanochat's greedy tokens, from the checkpoint folder
  and from one model_<step>.pt), `python -m model.convert` (the Decoder Lab file reopens under the app's
  loader with the same logits bit for bit, its tokenizer through the stored-tokenizer checks), and the
  app's --model registry (lab.catalogue.external); the folder layouts nanochat writes (flat, its cache's
  <base>/tokenizer beside <base>/base_checkpoints/<tag>), the largest step first.
* Hostile tokenizer.pkl files, each written here opcode by opcode: another class, another pattern, extra
  state keys, a rank key that is not bytes, a token no merge makes, a file past the size bound, a pickle
  that would call os.system (through REDUCE, and through the allowed opcodes with another global) -
  nothing in them runs.
* Hostile model files and meta files: globals a nanochat model file never holds (a Parameter, os.system),
  a top level that is not the weights, weights of an earlier nanochat, shapes the meta does not give,
  meta fields of the wrong type, size or name, a tokenizer of another vocabulary, a link out of the folder.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lab.catalogue.external import ExternalModels, parse_source
from model.checkpoint import load_checkpoint
from model.convert import LOCAL_LIMITS
from model.hf_tokenizer_checks import SPLIT_REGEXES
from model.nanochat import load_nanochat
from model.nanochat_tokenizer import MAX_TOKENIZER_PICKLE_BYTES, NANOCHAT_PATTERN, nanochat_tokenizer, read_encoding
from model.safe_unpickle import load_torch_weights
from tests.support.nanochat_files import (
    ASSETS, CHECKPOINT, FIXTURE_CONFIG, ROOT, TOKENIZER, VOCAB, expected, random_state, write_checkpoint,
)

GPT4_PATTERN = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*"""
                r"""|\s*[\r\n]|\s+(?!\S)|\s+""")


def run(module: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=600)


def refused_line(done: subprocess.CompletedProcess, module: str) -> str:
    """The one line a command prints when it refuses a model: exit status 2, no traceback."""
    assert done.returncode == 2 and not done.stdout and "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"python -m {module}: error: ")
    return lines[0]


@pytest.fixture(scope="module")
def cases():
    return expected()[0]


@pytest.fixture(scope="module")
def fixture_run():
    return load_nanochat(CHECKPOINT)


# ------------------------------------------------------------------------------------------ the doors


def test_generate_cli_gives_nanochats_greedy_tokens(cases):
    case = cases[1]
    for source in (CHECKPOINT, CHECKPOINT / "model_000007.pt"):
        done = run("model.generate", "--checkpoint", str(source), "--prompt", case["text"], "--temperature", "0",
                   "--max-new-tokens", "12", "--json")
        assert done.returncode == 0, done.stderr
        assert [json.loads(line)["token_id"] for line in done.stdout.splitlines()] == case["greedy"].tolist()


def test_convert_writes_a_file_that_computes_the_same(tmp_path, cases, fixture_run):
    out = tmp_path / "nanochat.safetensors"
    done = run("model.convert", str(CHECKPOINT), "--out", str(out))
    assert done.returncode == 0, done.stderr
    ck = load_checkpoint(out, LOCAL_LIMITS)
    assert ck.model.cfg == fixture_run.model.cfg and ck.meta["source"] == "nanochat" and ck.meta["step"] == 7
    ids = cases[3]["ids"][None]
    with torch.inference_mode():
        assert torch.equal(ck.model(ids).logits, fixture_run.model(ids).logits)
    assert ck.tokenizer.encode(cases[2]["text"]) == cases[2]["ids"].tolist()
    assert SPLIT_REGEXES["nanochat"] == NANOCHAT_PATTERN  # the stored tokenizer's one allowed pattern


def test_the_apps_model_registry_opens_it(tmp_path, cases, fixture_run):
    source = parse_source(str(CHECKPOINT))
    assert source.kind == "nanochat" and source.name == "d3 (nanochat)" and source.shown == "local folder d3"
    registry = ExternalModels([source], hashes=tmp_path / "hashes.json")
    entry = registry.get(registry.names[0])
    assert entry.family == "nanochat" and "puts “<|bos|>” first" in entry.summary
    ids = cases[1]["ids"][None]
    with torch.inference_mode():
        assert torch.equal(entry.model(ids).logits, fixture_run.model(ids).logits)
    one = parse_source(str(CHECKPOINT / "model_000007.pt"))
    assert one.kind == "nanochat" and one.shown == "local file d3/model_000007.pt"


def test_layouts_and_steps(tmp_path, fixture_run, cases):
    flat = tmp_path / "flat"
    shutil.copytree(CHECKPOINT, flat)
    shutil.copy(TOKENIZER, flat / "tokenizer.pkl")
    shutil.copy(CHECKPOINT / "meta_000007.json", flat / "meta_000002.json")  # an earlier step, other weights
    torch.save(random_state(FIXTURE_CONFIG, seed=3), flat / "model_000002.pt")
    ids = cases[0]["ids"][None]
    with torch.inference_mode():
        want = fixture_run.model(ids).logits
        assert torch.equal(load_nanochat(flat).model(ids).logits, want)  # the largest step
        assert not torch.equal(load_nanochat(flat / "model_000002.pt").model(ids).logits, want)
    sub = tmp_path / "sub"
    shutil.copytree(CHECKPOINT, sub)
    shutil.copytree(TOKENIZER.parent, sub / "tokenizer")
    assert load_nanochat(sub).tokenizer.vocab_size == VOCAB
    with pytest.raises(ValueError, match="nanochat's base folder; give one checkpoint folder"):
        load_nanochat(ASSETS)
    lone = tmp_path / "lone"
    shutil.copytree(CHECKPOINT, lone)
    with pytest.raises(ValueError, match="no nanochat tokenizer.pkl"):
        load_nanochat(lone)
    (lone / "tokenizer.pkl").symlink_to(TOKENIZER)  # a link out of the folder is not followed
    with pytest.raises(ValueError, match="link to a file outside"):
        load_nanochat(lone)
    (lone / "meta_000007.json").unlink()
    with pytest.raises(ValueError, match="no meta_000007.json beside it"):
        load_nanochat(lone)


# ------------------------------------------------------------------------------ hostile tokenizer.pkl


def _value(v) -> bytes:
    """One value as protocol-4 opcodes: a str, bytes, an int or a dict of them."""
    if isinstance(v, str):
        raw = v.encode("utf-8", "surrogatepass")
        return (b"\x8c" + bytes([len(raw)]) if len(raw) < 256 else b"X" + len(raw).to_bytes(4, "little")) + raw
    if isinstance(v, bytes):
        return b"C" + bytes([len(v)]) + v
    if isinstance(v, int):
        return b"J" + v.to_bytes(4, "little", signed=True)
    return b"}(" + b"".join(_value(k) + _value(x) for k, x in v.items()) + b"u"


def encoding_pickle(state, module: str = "tiktoken.core", name: str = "Encoding") -> bytes:
    """What pickle.dump of an object of class module.name with this state writes (PROTO 4, the class by
    STACK_GLOBAL, NEWOBJ, the state, BUILD, STOP)."""
    return b"\x80\x04" + _value(module) + _value(name) + b"\x93)\x81" + _value(state) + b"b."


@pytest.fixture(scope="module")
def state():
    return read_encoding(TOKENIZER.read_bytes())


def _refused(tmp_path: Path, data: bytes, match: str, marker: Path | None = None) -> None:
    path = tmp_path / "tokenizer.pkl"
    path.write_bytes(data)
    with pytest.raises(ValueError, match=match):
        nanochat_tokenizer(path, VOCAB)
    assert marker is None or not marker.exists()  # nothing in the file ran


def test_a_tokenizer_written_opcode_by_opcode_reads_as_nanochats(tmp_path, state):
    assert state["pat_str"] == NANOCHAT_PATTERN and state["name"] == "rustbpe"
    path = tmp_path / "tokenizer.pkl"
    path.write_bytes(encoding_pickle(state))
    again = nanochat_tokenizer(path, VOCAB)
    text = "it's we'll THEY'RE 3.14159\n\n  spaces"
    assert again.encode(text) == nanochat_tokenizer(TOKENIZER, VOCAB).encode(text)


def test_hostile_tokenizer_files_are_refused(tmp_path, state):
    ranks = state["mergeable_ranks"]
    cases = [
        (encoding_pickle(state, name="CoreBPE"), "asks to import 'tiktoken.core.CoreBPE'"),
        (encoding_pickle(state, module="collections", name="OrderedDict"), "asks to import 'collections.OrderedDict'"),
        (encoding_pickle({**state, "pat_str": GPT4_PATTERN}), "not nanochat's"),
        (encoding_pickle({**state, "explicit_n_vocab": VOCAB}), "must hold exactly"),
        (encoding_pickle("cl100k_base"), "must hold exactly"),  # a registered encoding pickled by its name
        (encoding_pickle({**state, "mergeable_ranks": {**ranks, "text": 5}}), "has the key 'text'"),
        (encoding_pickle({**state, "mergeable_ranks": {**ranks, b"\xffzz": 290}}), "one rank to two tokens|ranks run"),
        (encoding_pickle({**state, "special_tokens": {"<|user_start|>": 291}}), "no <|bos|> token"),
        (encoding_pickle({**state, "special_tokens": {"<|bos|>": 291, "hello": 292}}), "written <|name|>"),
        (encoding_pickle({**state, "special_tokens": {"<|bos|>": 295}}), "right after the ranks"),
        (_value(state) + b".", "not a saved tiktoken Encoding"),  # the state alone, no class
        (pickle.dumps([1, 2.5]), "opcode"),
        (encoding_pickle(state)[:-40], "not a valid pickle"),
    ]
    longest = max(ranks, key=len)  # a token made of bytes no merge of earlier tokens gives
    cases.append((encoding_pickle({**state, "mergeable_ranks": {**{k: v for k, v in ranks.items() if k != longest},
                                                                longest[::-1] + b"\x00": ranks[longest]}}),
                  "not the merge of two tokens"))
    for data, match in cases:
        _refused(tmp_path, data, match)
    wrong_size = tmp_path / "other" / "tokenizer.pkl"
    wrong_size.parent.mkdir()
    shutil.copy(TOKENIZER, wrong_size)
    with pytest.raises(ValueError, match="300 tokens but the model's meta file says vocab_size 301"):
        nanochat_tokenizer(wrong_size, VOCAB + 1)


def test_tokenizer_files_that_would_run_code_or_are_huge_are_refused(tmp_path, state):
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    _refused(tmp_path, pickle.dumps(Evil(), protocol=4), "holds pickle opcode", marker)
    module = os.system.__module__  # posix: the global is named, its NEWOBJ never reached
    _refused(tmp_path, encoding_pickle(state, module=module, name="system"), f"asks to import '{module}.system'",
             marker)
    huge = tmp_path / "huge" / "tokenizer.pkl"
    huge.parent.mkdir()
    with open(huge, "wb") as f:
        f.truncate(MAX_TOKENIZER_PICKLE_BYTES + 1)  # sparse: nothing is written
    with pytest.raises(ValueError, match=f"{MAX_TOKENIZER_PICKLE_BYTES + 1:,} bytes; a tokenizer.pkl is read up to"):
        nanochat_tokenizer(huge, VOCAB)
    flood = b"\x80\x04}(" + b"C\x00\x94J\x00\x00\x00\x00" * 700_000 + b"u."  # 2.1 million values and marks in 5.6 MB
    _refused(tmp_path, flood, "more values than a vocabulary")
    _refused(tmp_path, b"\x80\x04}r\xff\xff\xff\x7f.", "opcode LONG_BINPUT")  # a memo of 2^31 entries


# --------------------------------------------------------------------------- hostile model and meta files


def _folder(tmp_path: Path, name: str, state=None, mc=None, **extra) -> Path:
    return write_checkpoint(tmp_path / name, random_state(FIXTURE_CONFIG) if state is None else state,
                            FIXTURE_CONFIG if mc is None else mc, **extra)


def test_model_files_with_other_globals_are_refused_before_they_are_read(tmp_path):
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    sd = random_state(FIXTURE_CONFIG)
    for name, value, match in [("param", torch.nn.Parameter(sd["smear_lambda"]), "torch._utils._rebuild_parameter"),
                               ("evil", Evil(), f"{os.system.__module__}.system"),
                               ("size", torch.Size([2]), "torch.Size")]:
        folder = _folder(tmp_path, name, state={**sd, "smear_lambda": value})
        with pytest.raises(ValueError, match=f"asks for '{match}', which a nanochat model file never holds"):
            load_nanochat(folder)
        done = run("model.generate", "--checkpoint", str(folder), "--prompt", "a")
        assert match in refused_line(done, "model.generate")
    assert not marker.exists()


def test_model_files_that_are_not_current_nanochat_weights_are_refused(tmp_path):
    sd = random_state(FIXTURE_CONFIG)
    old = {k: v for k, v in sd.items() if k not in ("smear_gate.weight", "smear_lambda", "backout_lambda")}
    older = {k: v for k, v in old.items() if "ve_gate" not in k and "value_embeds" not in k}
    cases = [
        (_folder(tmp_path, "list", state=[sd["smear_lambda"]]), "its top level is not a dict of named tensors"),
        (_folder(tmp_path, "wrapped", state={"model": sd}), "its top level is not a dict of named tensors"),
        (_folder(tmp_path, "march", state=old), "2026-03-09 to 03-14"),
        (_folder(tmp_path, "older", state=older), "before 2026"),
        (_folder(tmp_path, "missing", state={k: v for k, v in sd.items() if k != "lm_head.weight"}),
         "missing \\['lm_head.weight'\\]"),
        (_folder(tmp_path, "shape", state={**sd, "x0_lambdas": torch.zeros(4)}), "x0_lambdas has shape \\[4\\]"),
        (_folder(tmp_path, "nan", state={**sd, "resid_lambdas": torch.full((3,), float("nan"))}), "NaN"),
        (_folder(tmp_path, "ints", state={**sd, "smear_lambda": torch.ones(1, dtype=torch.int64)}),
         "asks for 'torch.LongStorage'"),
    ]
    for folder, match in cases:
        with pytest.raises(ValueError, match=match):
            load_nanochat(folder)
    with pytest.raises(ValueError, match="no 'model' entry"):  # the nanoGPT reader is as strict as before
        load_torch_weights(CHECKPOINT / "model_000007.pt", tmp_path)


@pytest.mark.parametrize("change, match", [
    ({"n_embd": 16, "n_head": 2, "n_kv_head": 1}, "smear reads 24 channels"),
    ({"n_layer": True}, "n_layer'\\] must be a whole number"),
    ({"sequence_len": 10**7}, "sequence_len'\\] must be a whole number from 1 to 13,107"),
    ({"vocab_size": "300"}, "vocab_size'\\] must be a whole number"),
    ({"n_kv_head": 3}, "groups of n_kv_head"),
    ({"window_pattern": "SXL"}, "letters S and L"),
    ({"window_pattern": ""}, "letters S and L"),
    ({"rope_theta": 10000}, "fields nanochat's GPTConfig does not"),
    ({"vocab_size": 301}, "vocab_size 301"),
    ({"n_layer": 10**6}, "n_layer'\\] must be a whole number from 1 to 256"),
])
def test_hostile_meta_files_are_refused(tmp_path, change, match):
    folder = _folder(tmp_path, "m", mc={**FIXTURE_CONFIG, **change})
    with pytest.raises(ValueError, match=match):
        load_nanochat(folder)


def test_a_meta_file_without_a_model_config_or_of_a_huge_model_is_refused(tmp_path):
    folder = _folder(tmp_path, "nomc")
    (folder / "meta_000005.json").write_text('{"step": 5, "min": NaN}')
    with pytest.raises(ValueError, match="has no model_config"):
        load_nanochat(folder)
    folder = _folder(tmp_path, "big", mc={**FIXTURE_CONFIG, "n_embd": 2**16, "n_head": 2**9, "n_kv_head": 2**9})
    with pytest.raises(ValueError, match="parameters; the limit is"):
        load_nanochat(folder)
    assert "Infinity" in (CHECKPOINT / "meta_000007.json").read_text()  # nanochat's own meta file reads
