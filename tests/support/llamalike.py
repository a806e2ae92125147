"""Shared by the Llama-like family tests (test_families_llama3.py, test_families_qwen.py,
test_families_smollm3.py, test_families_hostile_llamalike.py): a small random model of a
transformers class saved as a folder, the command line held to it, and config.json edits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from tests.support.families import hf_tokenizer, save_reference, sharpen

ROOT = Path(__file__).resolve().parents[2]
VOCAB = 300
NULL = object()  # edit_config writes it as JSON null (None removes the key)


def build(model_class, config_class, folder: Path, seed: int = 0, bos: bool = False, max_positions: int = 40,
          **options):
    """(reference model, folder): a random `model_class` of `config_class(**options)`, eager attention,
    sharpened (tests.support.families.sharpen), saved with a byte-level BPE tokenizer."""
    cfg = config_class(vocab_size=VOCAB, max_position_embeddings=max_positions, bos_token_id=1, eos_token_id=0,
                       attn_implementation="eager", **options)
    torch.manual_seed(seed)
    ref = model_class(cfg).eval()
    # gain 1.5: still far from uniform, and float32's rounding (different in the two implementations'
    # sums) stays a few ulps of logits near 5
    sharpen(ref, seed=seed, gain=1.5)
    if cfg.tie_word_embeddings:
        with torch.no_grad():  # a tied head reads the N(0, 1) embedding: logits of 15 and more without this
            ref.get_input_embeddings().weight.mul_(1.5 / cfg.hidden_size**0.5)
    return ref, save_reference(ref, folder, VOCAB, bos=bos)


def edit_config(folder: Path, **changes) -> dict:
    """Rewrite config.json with `changes` (None removes a key, NULL writes null); returns the new config."""
    path = folder / "config.json"
    hf = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            hf.pop(key, None)
        else:
            hf[key] = None if value is NULL else value
    path.write_text(json.dumps(hf))
    return hf


def check_cli(ref: torch.nn.Module, folder: Path, prompt: str, new_tokens: int = 4) -> None:
    """`python -m model.generate --checkpoint FOLDER --json` at temperature 0, run as a person runs it:
    transformers' greedy tokens, with their probabilities to 1e-5."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-m", "model.generate", "--checkpoint", str(folder), "--prompt", prompt,
                           "--max-new-tokens", str(new_tokens), "--temperature", "0", "--json"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    ids = hf_tokenizer(folder)(prompt)["input_ids"]
    assert 0 < len(lines) <= new_tokens
    with torch.no_grad():
        for line in lines:
            probs = torch.softmax(ref(torch.tensor([ids])).logits[0, -1], -1)
            token = int(probs.argmax())
            assert line["token_id"] == token
            assert abs(line["prob"] - float(probs[token])) < 1e-5
            ids.append(token)
    # fewer lines than asked for only when the last is the end-of-text token
    assert len(lines) == new_tokens or lines[-1]["token_id"] == 0


def check_convert(folder: Path, out: Path, prompt: str) -> None:
    """`python -m model.convert FOLDER --out FILE` writes a Decoder Lab file that the app's loader opens
    (upload limits included) as the same config, tokenizer and numbers, bit for bit."""
    from model.checkpoint import load_checkpoint
    from model.families import open_folder

    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-m", "model.convert", str(folder), "--out", str(out)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr
    model, tok = open_folder(folder)
    reopened = load_checkpoint(out)
    assert reopened.model.cfg == model.cfg and reopened.tokenizer == tok
    ids = torch.tensor([tok.encode(prompt)])
    with torch.no_grad():
        a, b = model(ids, return_attention=True), reopened.model(ids, return_attention=True)
    assert torch.equal(a.logits, b.logits) and all(torch.equal(p, q) for p, q in zip(a.attentions, b.attentions))
