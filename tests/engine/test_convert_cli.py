"""The command lines: `python -m model.generate --checkpoint SRC` for every kind of source, and
`python -m model.convert SRC --out FILE.safetensors`, run as a person runs them (child processes).

Sources: a Decoder Lab file (assets/sort.safetensors), a Hugging Face GPT-2 folder written by
transformers' save_pretrained, and a nanoGPT ckpt.pt with its meta.pkl. Greedy tokens and their
probabilities are held to transformers' GPT2LMHeadModel for the two foreign ones. Converted files of
all three (and of a Llama folder) are reopened by the app's loader under its upload limits and must
compute the same numbers bit for bit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from model.checkpoint import load_checkpoint
from model.families import open_folder
from model.generate import Decoder, Sampling, generate
from model.nanogpt import load_nanogpt
from tests.support.families import PROMPTS, hf_tokenizer, save_reference, sharpen
from tests.support.nanogpt_runs import CHARS, _System, reference, save_run

ROOT = Path(__file__).resolve().parents[2]
SORT = ROOT / "assets" / "sort.safetensors"
NEW = 6


def run(module: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=600)


def generate_json(src: Path, prompt: str, *extra: str) -> list[dict]:
    done = run("model.generate", "--checkpoint", str(src), "--prompt", prompt, "--max-new-tokens", str(NEW),
               "--temperature", "0", "--json", *extra)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def greedy_reference(ref: GPT2LMHeadModel, ids: list[int], n: int) -> list[tuple[int, float]]:
    """transformers' greedy continuation: (token, its softmax probability) per step."""
    out = []
    ids = list(ids)
    with torch.no_grad():
        for _ in range(n):
            logits = ref(torch.tensor([ids])).logits[0, -1]
            nxt = int(logits.argmax())
            out.append((nxt, float(torch.softmax(logits, -1)[nxt])))
            ids.append(nxt)
    return out


def check_lines(lines: list[dict], want: list[tuple[int, float]], decode) -> None:
    assert len(lines) == len(want)
    for line, (token, prob) in zip(lines, want):
        assert {"token_id", "text", "prob", "sampled_prob"} <= set(line)
        assert line["token_id"] == token
        assert line["text"] == decode([token])
        assert abs(line["prob"] - prob) < 1e-5
        assert line["sampled_prob"] == 1.0  # temperature 0 draws the argmax with probability 1


def test_generate_nanogpt_checkpoint(tmp_path):
    ref = reference(len(CHARS))
    path = save_run(tmp_path / "run", ref)
    (tmp_path / "run" / "meta.pkl").rename(tmp_path / "meta.pkl")  # not beside it: given with --meta
    prompt = "to be, or"
    lines = generate_json(path, prompt, "--meta", str(tmp_path / "meta.pkl"))
    stoi = {c: i for i, c in enumerate(CHARS)}
    want = [(t + 1, p) for t, p in greedy_reference(ref, [stoi[c] for c in prompt], NEW)]  # ids + 1: <unk> is 0
    check_lines(lines, want, lambda ids: "".join(CHARS[i - 1] for i in ids))


def hf_folder(tmp_path: Path, vocab_size: int = 300) -> tuple[GPT2LMHeadModel, Path]:
    """A random GPT-2 folder with a 300-token tokenizer (its embedding padded when vocab_size > 300)."""
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_head=4, n_embd=16, n_positions=64, vocab_size=vocab_size,
                     attn_implementation="eager", bos_token_id=1, eos_token_id=0)
    ref = GPT2LMHeadModel(cfg).eval()
    sharpen(ref, conv1d=True)
    return ref, save_reference(ref, tmp_path / "gpt2-tiny", 300)


def llama_folder(tmp_path: Path) -> Path:
    """A random Llama folder: grouped-query attention 3:1, untied head, a tokenizer that puts <s> first."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=300, max_position_embeddings=40, bos_token_id=1, eos_token_id=0, hidden_size=24,
                      num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2, intermediate_size=40,
                      rope_theta=100000.0, attn_implementation="eager")
    ref = LlamaForCausalLM(cfg).eval()
    sharpen(ref)
    return save_reference(ref, tmp_path / "llama-tiny", 300, bos=True)


def test_generate_hugging_face_folder(tmp_path):
    ref, folder = hf_folder(tmp_path)
    prompt = "Once upon a time"
    tok = hf_tokenizer(folder)
    lines = generate_json(folder, prompt)
    check_lines(lines, greedy_reference(ref, tok(prompt)["input_ids"], NEW),
                lambda ids: tok.decode(ids, clean_up_tokenization_spaces=False))


def test_generate_decoder_lab_file():
    ckpt = load_checkpoint(SORT)
    tok = ckpt.tokenizer
    steps = list(generate(Decoder(ckpt.model, tok.encode("503124="), Sampling(temperature=0.0), eos_id=tok.eos_id), NEW))
    lines = generate_json(SORT, "503124=")
    check_lines(lines, [(s.token_id, float(s.probs[s.token_id])) for s in steps], tok.decode)


def test_convert_nanogpt_and_reopen(tmp_path):
    """A converted nanoGPT run is an ordinary Decoder Lab file: the app's loader (upload limits
    included) opens it, and it computes the same logits bit for bit."""
    path = save_run(tmp_path / "run", reference(len(CHARS), bias=False), bias=False, prefix="_orig_mod.")
    out = tmp_path / "shakespeare.safetensors"
    done = run("model.convert", str(path), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"wrote {out} (") and "upload will not take it" not in done.stdout
    direct = load_nanogpt(path)
    reopened = load_checkpoint(out)  # the app's own limits
    assert reopened.tokenizer == direct.tokenizer
    assert reopened.meta["source"] == "nanoGPT" and reopened.meta["dataset"] == "shakespeare_char"
    for prompt in ("to be", "the cat sat on"):
        ids = torch.tensor([direct.tokenizer.encode(prompt)])
        with torch.no_grad():
            a = direct.model(ids, return_attention=True)
            b = reopened.model(ids, return_attention=True)
        assert torch.equal(a.logits, b.logits)
        assert all(torch.equal(x, y) for x, y in zip(a.attentions, b.attentions))


def test_convert_decoder_lab_file_round_trips(tmp_path):
    out = tmp_path / "copy.safetensors"
    done = run("model.convert", str(SORT), "--out", str(out))
    assert done.returncode == 0, done.stderr
    a, b = load_checkpoint(SORT), load_checkpoint(out)
    assert a.tokenizer == b.tokenizer and a.model.cfg == b.model.cfg
    for (ka, va), (kb, vb) in zip(a.model.state_dict().items(), b.model.state_dict().items()):
        assert ka == kb and torch.equal(va, vb)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_convert_hugging_face_folder_and_reopen(family, tmp_path):
    """A converted Hugging Face folder (GPT-2 with its embedding padded past the tokenizer; Llama
    with grouped-query attention and a BOS-prepending tokenizer) is an ordinary Decoder Lab file: the
    app's loader opens it under the upload limits, with the same tokenizer and bit-identical numbers."""
    folder = hf_folder(tmp_path, vocab_size=320)[1] if family == "gpt2" else llama_folder(tmp_path)
    out = tmp_path / f"{family}.safetensors"
    done = run("model.convert", str(folder), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"wrote {out} (") and "upload will not take it" not in done.stdout
    model, tok = open_folder(folder)
    reopened = load_checkpoint(out)  # the app's own limits
    assert reopened.model.cfg == model.cfg
    assert reopened.tokenizer == tok and reopened.tokenizer.add_bos == tok.add_bos
    assert reopened.meta == {"source": "Hugging Face folder", "name": folder.name}
    assert (model.cfg.vocab_size, model.cfg.vocab_used) == ((320, 300) if family == "gpt2" else (300, None))
    assert tok.add_bos == (family == "llama")
    for prompt in PROMPTS:
        ids = tok.encode(prompt)
        assert reopened.tokenizer.encode(prompt) == ids
        assert [reopened.tokenizer.piece(i) for i in ids] == [tok.piece(i) for i in ids]
        assert reopened.tokenizer.decode(ids) == tok.decode(ids)
        x = torch.tensor([ids])
        with torch.no_grad():
            a = model(x, return_attention=True)
            b = reopened.model(x, return_attention=True)
        assert torch.equal(a.logits, b.logits)
        assert all(torch.equal(p, q) for p, q in zip(a.attentions, b.attentions))


def test_convert_refuses_a_tokenizer_it_could_not_open_again(tmp_path):
    """A folder's tokenizer.json with a step the loader's checks do not run (here a regex Split
    pre-tokenizer) is refused by name before anything is written: the folder is held to the checks a
    Decoder Lab file's tokenizer gets, so it is refused when it is opened (model.generate answers the
    same, tests/engine/test_hostile_model_files.py)."""
    _, folder = hf_folder(tmp_path)
    path = folder / "tokenizer.json"
    doc = json.loads(path.read_text())
    doc["pre_tokenizer"] = {"type": "Split", "pattern": {"Regex": "\\s+"}, "behavior": "Isolated", "invert": False}
    path.write_text(json.dumps(doc))
    out = tmp_path / "gpt2-tiny.safetensors"
    _refused(run("model.convert", str(folder), "--out", str(out)), "model.convert",
             "tokenizer.json has a pre_tokenizer of type 'Split', which the app does not run")
    assert not out.exists()


def test_generate_refuses_characters_missing_from_meta_pkl(tmp_path):
    """A nanoGPT character vocabulary lacks most of Unicode: as in the app, such a prompt is refused
    with a sentence naming the characters, not run as <unk>."""
    path = save_run(tmp_path / "run", reference(len(CHARS)))
    _refused(run("model.generate", "--checkpoint", str(path), "--prompt", "to be ζ or 日"), "model.generate",
             "the prompt has characters this model's vocabulary lacks: 'ζ', '日'")


def _refused(done: subprocess.CompletedProcess, prog: str, sentence: str, usage: bool = False) -> None:
    """Exit status 2 and the sentence: a file or prompt the command cannot take is one line on stderr;
    a usage error (usage=True: a flag missing or malformed) is argparse's usage, then its line."""
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith(f"usage: python -m {prog}") == usage
    lines = done.stderr.strip().splitlines()
    assert usage or len(lines) == 1, done.stderr
    assert lines[-1].startswith(f"python -m {prog}: error: ") and sentence in lines[-1]
    assert "Traceback" not in done.stderr


def test_bad_arguments_are_usage_and_one_sentence(tmp_path):
    marker = tmp_path / "created"
    torch.save({"model": _System(marker)}, tmp_path / "ckpt.pt")
    _refused(run("model.convert", str(SORT), "--out", str(tmp_path / "x.bin")), "model.convert",
             "must end in .safetensors", usage=True)
    _refused(run("model.convert", str(SORT)), "model.convert", "the following arguments are required: --out",
             usage=True)
    _refused(run("model.convert", str(tmp_path / "nothing.pt"), "--out", str(tmp_path / "x.safetensors")),
             "model.convert", "nothing.pt does not exist")
    _refused(run("model.convert", str(SORT), "--meta", str(tmp_path / "meta.pkl"), "--out",
                 str(tmp_path / "x.safetensors")), "model.convert", "--meta and --tokenizer apply to a nanoGPT ckpt.pt only")
    _refused(run("model.generate", "--checkpoint", str(tmp_path / "ckpt.pt"), "--prompt", "a"), "model.generate",
             "ckpt.pt: its pickle asks for something a weights file never needs (posix.system); it was refused")
    assert not marker.exists()
    assert not (tmp_path / "x.safetensors").exists()
