"""The built-in models' presets: the model and training configs each shipped checkpoint is made from.

Each shipped checkpoint in assets/ is made from one of the presets by the CLI
(`python -m model.train --preset NAME --out assets/NAME`; a preset of the "text" corpus reads its
text from `--text PATH`), and tests hold it to its quality bar. The CLI records each one's training
film too (`--film`, default FILM_FRAMES frames, on the preset's `probe` or, when that is None, a
held-out example: the first validation example of sort/copy/toy, the start of the validation text
of grammar/shakespeare); the sort, copy and grammar films carry their task (model.heads.task_of),
which adds the task's own score (sort match, copy match, pronoun → name).
The Train tab starts from these presets too, through its own recipe (lab/recipe.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .config import ModelConfig
from .train import TrainConfig


@dataclass(frozen=True)
class Preset:
    name: str
    corpus: str
    tokenizer: str
    model: dict[str, Any]
    train: TrainConfig
    summary: str
    quality: str = ""
    probe: str | None = None  # the film's probe prompt (None: a held-out example of the corpus)

    def model_config(self, vocab_size: int) -> ModelConfig:
        return ModelConfig(vocab_size=vocab_size, **self.model)


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            name="toy",
            corpus="toy",
            tokenizer="word",
            # Article 001 (the project's first source article; README, "Built-in models"): d_model 4, sinusoidal positions, one single-head masked self-attention
            # without bias or output projection, a residual connection and a linear head (with bias);
            # no normalisation and no feed-forward. PyTorch's default initialisation, as there.
            model=dict(block_size=20, n_layers=1, n_heads=1, d_model=4, d_ff=0, pos_encoding="sinusoidal",
                       norm="none", bias=False, head_bias=True, attn_out_proj=False, init="torch"),
            # Adam at lr 0.05 for 100 epochs over the two sequences (one full batch per epoch).
            train=TrainConfig(steps=100, batch_size=2, lr=0.05, warmup=0, schedule="constant", weight_decay=0.0,
                              betas=(0.9, 0.999), grad_clip=None, eval_every=0, eval_batches=1),
            summary="Article 001's 7-word example: both prompts must answer 'exciting <EOS>'.",
            quality="both prompts generate exactly 'exciting <EOS>' greedily",
        ),
        Preset(
            name="sort",
            corpus="sort",
            tokenizer="char",
            model=dict(block_size=16, n_layers=2, n_heads=4, d_model=64, pos_encoding="learned", dropout=0.0),
            train=TrainConfig(steps=2000, batch_size=64, lr=3e-3, warmup=100, eval_every=250),
            summary="Sort six digits, then <EOS>: the answer's i-th digit attends to the i-th smallest input digit.",
            quality="≥ 99% of 200 held-out sequences exactly sorted; the example prompts' answers end with <EOS>",
        ),
        Preset(
            name="copy",
            corpus="copy",
            tokenizer="char",
            model=dict(block_size=20, n_layers=2, n_heads=4, d_model=64, pos_encoding="learned"),
            train=TrainConfig(steps=1500, batch_size=64, lr=3e-3, warmup=100, eval_every=250),
            summary="Repeat a random sequence, then <EOS>: an induction head looks one step past the earlier copy.",
            quality="≥ 95% of second-half tokens right on 200 held-out sequences; "
                    "the example prompts' answers end with <EOS>",
        ),
        Preset(
            name="grammar",
            corpus="grammar",
            tokenizer="word",
            model=dict(block_size=256, n_layers=3, n_heads=4, d_model=96, pos_encoding="learned", dropout=0.0),
            train=TrainConfig(steps=1000, batch_size=16, lr=2e-3, warmup=100, eval_every=250),
            summary="Generated English: pronouns must agree with earlier names.",
            quality="held-out loss recorded in assets/grammar.json and reached by the shipped model",
        ),
        Preset(
            name="shakespeare",
            corpus="text",  # the text comes from the CLI's --text (Tiny Shakespeare); never stored here
            tokenizer="char",
            # The training benchmark's recipe (bench/train_bench.py, bench/TRAINING.md): nanoGPT's
            # CPU-sized character model, tied weights, no bias, AdamW 1e-3 -> 1e-4 with the wsd schedule.
            model=dict(block_size=64, n_layers=4, n_heads=4, d_model=128, pos_encoding="learned", norm="pre",
                       activation="gelu", bias=False, tie_weights=True, dropout=0.0),
            train=TrainConfig(steps=2000, batch_size=12, lr=1e-3, min_lr=1e-4, warmup=100, schedule="wsd",
                              decay_frac=0.3, weight_decay=0.1, betas=(0.9, 0.99), grad_clip=1.0, eval_every=250,
                              eval_batches=50, seed=1337),
            summary="Real text: a character model of Tiny Shakespeare (the training benchmark's recipe).",
            quality="held-out loss recorded in assets/shakespeare.json (≈ 1.85–1.95) and reached by the shipped model; "
                    "its next-token distributions stay uncertain",
        ),
    )
}

