"""Recipes: named model + training presets, and the Train tab's recipe.

Each shipped checkpoint in assets/ is made from one of the presets by the CLI
(`python -m model.train --preset NAME --out assets/NAME`; a preset of the "text" corpus reads its
text from `--text PATH`), and tests hold it to its quality bar. The CLI records each one's training
film too (`--film`, default FILM_FRAMES frames, on the preset's `probe` or, when that is None, a
held-out example: the first validation example of sort/copy/toy, the start of the validation text
of grammar/shakespeare); the sort, copy and grammar films carry their task (`Preset.task`), which
adds the task's own score (sort match, copy match, pronoun → name).
`train_tab_defaults` fills the Train tab's form with the recipe of a corpus's built-in model
(its tokenizer, architecture, steps and learning rate), and `train_tab_recipe` turns the form
(already checked by the lab layer) into the same two configs, so a recipe is read in one place whichever way a run starts (minGPT keeps
its `get_config()` beside the project it configures, apart from the trainer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .config import ModelConfig
from .corpora import Corpus
from .film import FILM_FRAMES, task_of
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

    @property
    def task(self) -> str | None:
        """The task of its film ("sort", "copy", "grammar": the right attention is known, so its score is shown)."""
        return task_of(self.corpus)


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


# The Train tab's fixed choices: a text corpus is cut into windows of this many tokens; the
# task corpora (sort, copy, toy) bring their own example length.
TAB_TEXT_BLOCK = 64
TAB_BATCH_SIZE = 16
TAB_EVAL_BATCHES = 4
# The tab trains with the hand-written step (model/fastpath.py) and, on CPUs with AMX tiles, in bf16 once the
# matrices are big enough to pay for the copy: d_model x tokens per step >= BF16_PAYS_FROM. Measured here
# (bench/RESULTS.md, issue 16; 1 thread, film on): the tab's sort model (13 K) 3.9 ms/step fp32 vs 4.2 bf16;
# sort at d_model 128 (27 K) 9.0 vs 7.9; grammar at d_model 48 (49 K) 13.9 vs 11.6 and 96 (98 K) 31-39 vs 21.9.
BF16_PAYS_FROM = 20_000


def amx_available() -> bool:
    """Whether this CPU has AMX tiles (where bf16 matrix products run several times faster than fp32)."""
    check = getattr(torch.cpu, "_is_amx_tile_supported", None)  # torch's own probe (private, so guarded)
    try:
        return bool(check()) if check is not None else False
    except Exception:  # a build without the probe's support: assume no AMX
        return False


def tab_bf16(mcfg: ModelConfig, batch_size: int = TAB_BATCH_SIZE) -> bool:
    """Whether a Train-tab run of this model trains in bf16 (see BF16_PAYS_FROM)."""
    return amx_available() and mcfg.d_model * batch_size * mcfg.block_size >= BF16_PAYS_FROM

# The built-in model whose recipe is the Train tab's default for each corpus ("text", your own
# text: the character model of real text).
TAB_CORPUS_PRESETS = {"grammar": "grammar", "sort": "sort", "copy": "copy", "toy": "toy", "text": "shakespeare"}
# Fewer steps than the preset where the tab's batches and wall-clock limit cannot fit its run:
# 1000 steps of the Shakespeare model take about 90 s on two CPU cores (validation ≈ 2.0 on Tiny
# Shakespeare); 2000 would meet the time limit.
TAB_STEPS = {"text": 1000}


def train_tab_defaults(corpus_name: str, limits: dict[str, tuple[float, float]] | None = None) -> dict[str, Any]:
    """The Train tab's form for `corpus_name`: the recipe of that corpus's built-in model.

    Keys: tokenizer, layers, heads, d_model, d_ff (4 × d_model when the preset leaves it out),
    pos_encoding, norm, activation, dropout, steps, lr. With `limits` (the form's inclusive
    (low, high) by label, as lab.limits.TRAIN_LIMITS) each number is brought inside them (the
    article toy's d_model 4 is below the form's smallest); what the form cannot set (the toy's
    missing biases, a context longer than the tab's windows) stays the preset's alone.
    """
    if corpus_name not in TAB_CORPUS_PRESETS:
        raise ValueError(f"no Train-tab recipe for corpus {corpus_name!r}; expected one of {', '.join(TAB_CORPUS_PRESETS)}")
    p = PRESETS[TAB_CORPUS_PRESETS[corpus_name]]
    m = p.model
    d_model = m["d_model"]
    form = dict(
        tokenizer=p.tokenizer, layers=m["n_layers"], heads=m["n_heads"], d_model=d_model,
        d_ff=4 * d_model if m.get("d_ff") is None else m["d_ff"], pos_encoding=m.get("pos_encoding", "learned"),
        norm=m.get("norm", "pre"), activation=m.get("activation", "gelu"), dropout=m.get("dropout", 0.0),
        steps=TAB_STEPS.get(corpus_name, p.train.steps), lr=p.train.lr,
    )
    for key, label in (("layers", "layers"), ("heads", "heads"), ("d_model", "d_model"), ("d_ff", "d_ff"),
                       ("dropout", "dropout"), ("steps", "steps"), ("lr", "learning rate")):
        if limits and label in limits:
            low, high = limits[label]
            form[key] = type(form[key])(min(max(form[key], low), high))
    return form


def example_length(corpus: Corpus) -> int:
    """The tokens of one whole example of a task corpus: its input row and the last target (<EOS>)."""
    return int(corpus.train.x.shape[1]) + 1


def tab_example_block(corpus: Corpus) -> int:
    """The context of a Train-tab model of a task corpus (sort, copy, toy): its built-in model's, and never
    shorter than one whole example, so a generated answer keeps its prompt's first token in view."""
    preset = PRESETS.get(TAB_CORPUS_PRESETS.get(corpus.name, ""))
    return max(example_length(corpus), preset.model["block_size"] if preset is not None else 0)


def train_tab_recipe(
    corpus: Corpus,
    *,
    layers: int,
    heads: int,
    d_model: int,
    d_ff: int,
    pos_encoding: str,
    norm: str,
    activation: str,
    dropout: float,
    steps: int,
    lr: float,
    seed: int,
    max_seconds: float | None,
    keep_best: bool = False,
    film_frames: int = FILM_FRAMES,
    probe_ids: tuple[int, ...] = (),
) -> tuple[ModelConfig, TrainConfig]:
    """The model and training configs of a Train-tab run on `corpus`.

    The context is TAB_TEXT_BLOCK for text, else `tab_example_block` (every example fits whole).
    Warm-up is a tenth of the run (at most 50 steps) and the model is evaluated ten times,
    so a short run still shows a validation curve. `keep_best`: end with the weights of the
    lowest validation loss seen (TrainConfig.keep_best). `film_frames` (0 = none) and `probe_ids`
    (empty = a held-out example of the corpus): the run's training film (model/film.py). The step is the
    hand-written one where the model allows (backward="auto"), in bf16 where `tab_bf16` says it pays.
    """
    block = TAB_TEXT_BLOCK if corpus.kind == "text" else tab_example_block(corpus)
    mcfg = ModelConfig(vocab_size=corpus.tokenizer.vocab_size, block_size=block, n_layers=layers, n_heads=heads,
                       d_model=d_model, d_ff=d_ff, pos_encoding=pos_encoding, norm=norm, activation=activation,
                       dropout=dropout)
    tcfg = TrainConfig(steps=steps, batch_size=TAB_BATCH_SIZE, lr=lr, warmup=min(50, steps // 10),
                       eval_every=max(10, steps // 10), eval_batches=TAB_EVAL_BATCHES, seed=seed,
                       max_seconds=max_seconds, keep_best=keep_best, film_frames=film_frames, probe_ids=tuple(probe_ids),
                       backward="auto", bf16=tab_bf16(mcfg))
    return mcfg, tcfg
