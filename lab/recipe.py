"""The Train tab's recipe: from the form's values to the two configs of a run.

`train_tab_defaults` fills the form for a corpus with the recipe of that corpus's built-in model
(model.presets: its tokenizer, architecture, steps and learning rate), and `train_tab_recipe`
turns the form (already checked by the session) into a `ModelConfig` and a `TrainConfig`: the
context, batch, warm-up, evaluation schedule and whether to train in bf16 are decided here, once.
The engine only trains what it is given; the recipe of a run lives beside the place that starts
it, as minGPT keeps `get_config()` in the project and not in its trainer. Measured numbers behind
the choices are in bench/RESULTS.md ("The Train tab's recipe").
"""

from __future__ import annotations

from typing import Any

import torch

from model.config import ModelConfig
from model.corpora import Corpus
from model.film import FILM_FRAMES
from model.presets import PRESETS
from model.train import TrainConfig

# The corpora whose tokenizer the person picks; the others bring their own (sort, copy: characters;
# the article toy: words).
OWN_TOKENIZER = ("grammar", "text")
# A text corpus is cut into windows of this many tokens; the task corpora (sort, copy, toy) bring
# their own example length.
TAB_TEXT_BLOCK = 64
TAB_BATCH_SIZE = 16
TAB_EVAL_BATCHES = 4
# On CPUs with AMX tiles the tab trains in bf16 once the matrices are big enough to pay for the
# copy: d_model x tokens per step >= BF16_PAYS_FROM (below it fp32 is as fast or faster).
BF16_PAYS_FROM = 20_000
# The built-in model whose recipe is the tab's default for each corpus ("text", your own text: the
# character model of real text).
TAB_CORPUS_PRESETS = {"grammar": "grammar", "sort": "sort", "copy": "copy", "toy": "toy", "text": "shakespeare"}
# Fewer steps than the preset where the tab's batches and wall-clock limit cannot fit its run (the
# Shakespeare preset's 2000 steps would meet the time limit).
TAB_STEPS = {"text": 1000}


def amx_available() -> bool:
    """Whether this CPU has AMX tiles (where bf16 matrix products run several times faster than fp32)."""
    check = getattr(torch.cpu, "_is_amx_tile_supported", None)  # torch's own probe (private, so guarded)
    try:
        return bool(check()) if check is not None else False
    except Exception:  # a build without the probe's support: assume no AMX
        return False


def bf16_choice(mcfg: ModelConfig, batch_size: int, device: str = "cpu", amx: bool | None = None) -> tuple[bool, str]:
    """Whether a run of this model and batch trains in bf16 on `device`, and why, in a few words: the one
    rule the Train tab and `python -m bench.train_bench` follow. On CUDA always (autocast); on a CPU only
    with AMX tiles (`amx`: None asks this CPU) and matrices big enough to pay for the bf16 copy
    (BF16_PAYS_FROM); without AMX, bf16 products (AVX-512 BF16 included) were measured slower than fp32."""
    if device == "cuda":
        return True, "CUDA: bf16 autocast, as the lab trains on a GPU"
    if not (amx_available() if amx is None else amx):
        return False, "this CPU has no AMX tiles: bf16 matrix products do not beat fp32 here"
    size = mcfg.d_model * batch_size * mcfg.block_size
    if size < BF16_PAYS_FROM:
        return False, f"AMX, but d_model x tokens per step = {size:,} < {BF16_PAYS_FROM:,}: too small to pay for the copy"
    return True, f"AMX and d_model x tokens per step = {size:,} >= {BF16_PAYS_FROM:,}"


def tab_bf16(mcfg: ModelConfig, batch_size: int = TAB_BATCH_SIZE) -> bool:
    """Whether a Train-tab run of this model trains in bf16 on the CPU (`bf16_choice`)."""
    return bf16_choice(mcfg, batch_size)[0]


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
