"""Small random OLMo 2 and Phi-3 models built with transformers' own classes and saved as Hugging Face
folders (tests/engine/test_families_olmo2.py, test_families_phi3.py, test_families_hostile_olmo_phi.py),
and the command lines those tests run on them as a person does (child processes).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from tests.support.families import save_reference, sharpen

ROOT = Path(__file__).resolve().parents[2]
VOCAB = 300


def olmo2_reference(folder: Path, seed: int = 0, **options):
    """(Olmo2ForCausalLM, its folder): random weights made far from uniform, the options over a small default.

    Two scales keep float32's own rounding well inside the tolerances (1e-6 on attention, 1e-5 on logits):
    the engine normalises each head's queries and keys in its rotary pair order, transformers in rotate-half
    order, so the two sum the squares in another order and differ by a rounding at every q/k norm, which the
    scores carry on. With q/k norm weights around 0.7 (not 1) the scores stay near 5; a tied head reads with
    the N(0, 1) embedding rows, twice an untied head's logits, so its final norm's weights are halved. The
    numbers are no less the reference's: only further from float32's last bits."""
    from transformers import Olmo2Config, Olmo2ForCausalLM

    settings = dict(vocab_size=VOCAB, max_position_embeddings=64, hidden_size=24, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, intermediate_size=40)
    cfg = Olmo2Config(bos_token_id=1, eos_token_id=0, pad_token_id=0, attn_implementation="eager",
                      **{**settings, **options})
    torch.manual_seed(seed)
    ref = Olmo2ForCausalLM(cfg).eval()
    sharpen(ref, seed=seed)
    with torch.no_grad():
        for layer in ref.model.layers:
            layer.self_attn.q_norm.weight.mul_(0.7)
            layer.self_attn.k_norm.weight.mul_(0.7)
        if cfg.tie_word_embeddings:
            ref.model.norm.weight.mul_(0.5)
    return ref, save_reference(ref, folder, VOCAB)


def phi3_reference(folder: Path, seed: int = 0, **options):
    """(Phi3ForCausalLM, its folder), as olmo2_reference. sharpen gives query and key projections gain 1 by
    their names (q_proj, k_proj); Phi-3 fuses them into qkv_proj, so their rows are brought to gain 1 here
    (at gain 2 the scores reach the range where float32 alone moves attention weights by 1e-6). A tied head's
    final norm is halved as olmo2_reference's is."""
    from transformers import Phi3Config, Phi3ForCausalLM

    settings = dict(vocab_size=VOCAB, max_position_embeddings=64, hidden_size=32, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, intermediate_size=40)
    cfg = Phi3Config(bos_token_id=1, eos_token_id=0, pad_token_id=0, attn_implementation="eager",
                     **{**settings, **options})
    torch.manual_seed(seed)
    ref = Phi3ForCausalLM(cfg).eval()
    sharpen(ref, seed=seed)
    attn = ref.model.layers[0].self_attn
    qk_rows = (cfg.num_attention_heads + cfg.num_key_value_heads) * attn.head_dim
    with torch.no_grad():
        for layer in ref.model.layers:
            layer.self_attn.qkv_proj.weight[:qk_rows] *= 0.5
        if cfg.tie_word_embeddings:  # as olmo2_reference: a tied head's logits halved
            ref.model.norm.weight.mul_(0.5)
    return ref, save_reference(ref, folder, VOCAB)


def edit_config(folder: Path, **changes) -> None:
    """Rewrite config.json with `changes` (a value of None removes the key)."""
    path = folder / "config.json"
    hf = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            hf.pop(key, None)
        else:
            hf[key] = value
    path.write_text(json.dumps(hf))


def run(module: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`python -m module args…` from the project's root, offline."""
    full = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                **(env or {}))
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, env=full, cwd=ROOT,
                          timeout=600)


def greedy_with_probs(ref, ids: list[int], n: int) -> list[tuple[int, float]]:
    """transformers' greedy continuation: (token, its softmax probability) per step."""
    out, ids = [], list(ids)
    with torch.no_grad():
        for _ in range(n):
            logits = ref(torch.tensor([ids])).logits[0, -1]
            token = int(logits.argmax())
            out.append((token, float(torch.softmax(logits, -1)[token])))
            ids.append(token)
    return out


def check_cli_generate(ref, folder: Path, prompt: str, n: int = 6) -> None:
    """`python -m model.generate --checkpoint FOLDER --json` at temperature 0 writes transformers' greedy
    tokens, each with its probability, one JSON line per token."""
    from tests.support.families import hf_tokenizer

    done = run("model.generate", "--checkpoint", str(folder), "--prompt", prompt, "--max-new-tokens", str(n),
               "--temperature", "0", "--json")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    tok = hf_tokenizer(folder)
    want = greedy_with_probs(ref, tok(prompt)["input_ids"], n)
    assert [line["token_id"] for line in lines] == [t for t, _ in want]
    for line, (token, prob) in zip(lines, want):
        assert abs(line["prob"] - prob) < 1e-5
        assert line["text"] == tok.decode([token], clean_up_tokenization_spaces=False)


def check_convert_and_reopen(folder: Path, out: Path, prompts: list[str]) -> None:
    """`python -m model.convert FOLDER --out FILE` writes a Decoder Lab file that the app's loader opens under
    its upload limits with the same config and tokenizer, computing the same numbers bit for bit."""
    from model.checkpoint import load_checkpoint
    from model.families import open_folder

    done = run("model.convert", str(folder), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "upload will not take it" not in done.stdout
    model, tok = open_folder(folder)
    reopened = load_checkpoint(out)
    assert reopened.model.cfg == model.cfg and reopened.tokenizer == tok
    for prompt in prompts:
        x = torch.tensor([tok.encode(prompt)])
        with torch.no_grad():
            a, b = model(x, return_attention=True), reopened.model(x, return_attention=True)
        assert torch.equal(a.logits, b.logits)
        assert all(torch.equal(p, q) for p, q in zip(a.attentions, b.attentions))
