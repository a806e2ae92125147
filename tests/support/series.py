"""A series of checkpoints of one small GPT-2, trained here with transformers and saved with
save_pretrained at several steps, one Hugging Face folder per revision (root/step0, root/step5, …): what
`python -m model.film` turns into a film (model/film_series.py). Also the same series laid out as a hub
cache, where each revision is a ref naming its own snapshot.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from .families import TEXT, write_tokenizer

VOCAB = 300
SAVED_AT = (0, 5, 10, 20, 40, 80, 120)  # the steps saved, as revisions step0, step5, … (by step 80 a head
# of layer 1 has begun to attend as an induction head does on PROBE)
PROBE = " the fox met a bear, and the bear said hello to the fox met a bear"


def revisions(steps=SAVED_AT) -> list[str]:
    return [f"step{s}" for s in steps]


def build_series(root: Path, steps=SAVED_AT, n_head: int = 4, seed: int = 0) -> dict[str, Path]:
    """Train a 2-layer GPT-2 on TEXT with AdamW, saving it (and one tokenizer) at each of `steps`;
    revision name -> folder."""
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    tok_folder = root / "tokenizer"
    write_tokenizer(tok_folder, VOCAB)
    ids = PreTrainedTokenizerFast.from_pretrained(tok_folder)(TEXT)["input_ids"]
    cfg = GPT2Config(n_positions=64, vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=n_head, bos_token_id=1,
                     eos_token_id=0, attn_implementation="eager", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(seed)
    data = torch.tensor(ids)
    folders = {}
    for step in range(max(steps) + 1):
        if step in steps:
            folder = root / f"step{step}"
            model.save_pretrained(folder)
            for f in tok_folder.iterdir():
                shutil.copy(f, folder / f.name)
            folders[folder.name] = folder
        starts = torch.randint(0, len(ids) - 33, (8,), generator=g)
        x = torch.stack([data[s : s + 32] for s in starts])
        model.train()
        loss = model(x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return folders


def fake_hub_series(cache: Path, repo: str, folders: dict[str, Path]) -> None:
    """The hub cache's layout for `repo`: each revision a ref naming a snapshot of its own."""
    root = cache / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True)
    for i, (rev, folder) in enumerate(folders.items()):
        commit = f"{i:040x}"
        shutil.copytree(folder, root / "snapshots" / commit)
        (root / "refs" / rev).write_text(commit)


def build_neox_series(root: Path, steps=(0, 1000, 143000)) -> dict[str, Path]:
    """Pythia's shape in small (GPT-NeoX: partial rotary, parallel residual, untied head, an embedding padded
    20 rows past the tokenizer), random weights of another seed at each revision; revision name -> folder."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    from .families import save_reference, sharpen

    cfg = GPTNeoXConfig(max_position_embeddings=64, bos_token_id=1, eos_token_id=0, attn_implementation="eager",
                        vocab_size=VOCAB + 20, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=48, rotary_pct=0.25)
    folders = {}
    for i, step in enumerate(steps):
        torch.manual_seed(i)
        model = GPTNeoXForCausalLM(cfg).eval()
        sharpen(model, seed=i)
        folders[f"step{step}"] = save_reference(model, root / f"step{step}", VOCAB)
    return folders
