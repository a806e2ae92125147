"""A pretrained model as the lab shows it: opened from its files (model.families, model.nanogpt), what
it is in one line, example prompts that show something on any model, and the head it opens on,
chosen by computing the head roles on the first example (never by hand).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from model.backend import ForwardRequest, per_layer
from model.heads import ROLES, Role, head_scores

from ..checks import UserError
from ..limits import WEIGHTS_DTYPE
from .models import FirstView, ModelEntry, counted, many_heads, usable_examples

# Prompts that show something on a real model: a sentence said twice (a model that learned to copy, a
# character model too, follows it), a pronoun to resolve and a name to repeat (the indirect-object pattern);
# and one made per model: a random token sequence, twice. The model opens on the one where it shows most.
REPEAT_PROMPT = "the cat sat on the mat. the cat sat on the mat."
PRONOUN_PROMPT = "Anna found the key under the mat. She gave it to Tom because he"
NAME_PROMPT = "When Mary and John went to the store, John gave a drink to"
# A character model's own pattern (the built-in Shakespeare model's first view): each character of a word
# looks at the space or line break that starts it. A score like model.heads' roles, for character tokenizers.
WORD_START = Role("word_start", "word-start", "mean over characters i after the first space of A[i, s(i)], s(i) "
                  "the space or line break that starts i's word", 0.5,
                  "each character looks at the space or line break that starts its word")
SHOWN_ROLES = ("induction", "previous_token", "word_start")  # what a first view looks for, the rarer first
SHOWN = {**ROLES, "word_start": WORD_START}
INDUCTION_TOKENS = 10  # random tokens in the sequence that the induction prompt repeats
_WORD = re.compile(r" ?[A-Za-z]{3,10}")


@dataclass
class ExternalEntry(ModelEntry):
    """A model the person running the app added: where it comes from and what its files say."""

    family: str = ""
    source: str = ""  # repo@revision, or the local file or folder by its name (lab.catalogue.external.Source.shown)
    sha256: str = ""
    licence: str | None = None

    @property
    def summary(self) -> str:
        c, tok = self.cfg, self.tokenizer
        tokens = counted(tok.vocab_size, "token")
        if c.vocab_used is not None and c.vocab_used < c.vocab_size:
            tokens += f", {c.vocab_size - c.vocab_used:,} padded rows never shown"
        bos = getattr(tok, "bos_id", None)
        if getattr(tok, "add_bos", False):
            tokens += f"; puts “{tok.piece(bos)}” first"
        elif tok.kind == "hf":
            tokens += "; no BOS token first"
        licence = f", licence {self.licence}" if self.licence else ""
        # a model another backend runs says where, with its size (model.backend's `where`)
        size = counted(self.n_params(), "parameter") if self.own else f"runs on {self.backend.where()}"
        return (f"{self.name}: {self.family}, {size}, "
                f"{counted(c.n_layers, 'layer')} × {counted(c.n_heads, 'head')}, d_model {c.d_model}, "
                f"context {c.block_size}, {tokenizer_name(tok)} ({tokens}), weights {weights_word(self.model)}, "
                f"source {self.source}{licence}")


def weights_word(model) -> str:
    """How the model holds its weights, for the status line: float32, or a 16-bit dtype kept as stored
    (None: another backend holds them, and says where)."""
    if model is None:
        return "held by the backend"
    dtype = model.tok_emb.weight.dtype
    return "float32" if dtype == torch.float32 else f"{str(dtype).removeprefix('torch.')} as stored"


def tokenizer_name(tok) -> str:
    return "Hugging Face tokenizer" if tok.kind == "hf" else f"{tok.kind} tokenizer"


def licence_of(folder: Path | None, hf_config: dict | None) -> str | None:
    """The licence the files state: config.json's "license", else README.md's front matter."""
    value = (hf_config or {}).get("license")
    if isinstance(value, str) and value.strip():
        return value.strip()[:60]
    readme = folder / "README.md" if folder is not None else None
    try:
        text = readme.read_text(encoding="utf-8", errors="replace")[:20_000] if readme else ""
    except OSError:
        return None
    front = re.match(r"---\s*\n(.*?)\n---", text, re.S)
    found = re.search(r"^licen[cs]e:\s*['\"]?([^'\"\n]+)", front.group(1), re.M) if front else None
    return found.group(1).strip()[:60] if found else None


# ------------------------------------------------------------------------------ opening a source


def open_external(name: str, source, folder: Path, digest: str) -> ExternalEntry:
    """The entry of a source whose files were checked (lab.catalogue.external); a bad file is a UserError."""
    from model.families import family_of, open_folder
    from model.families.common import read_config
    from model.nanogpt import load_nanogpt

    film = None  # a Decoder Lab file may carry a film (a training's, or a series of checkpoints')
    try:
        if source.kind == "nanogpt":
            run = load_nanogpt(source.path)
            model, tok, family, hf = run.model, run.tokenizer, "nanoGPT (GPT-2 layout)", None
        elif source.kind == "nanochat":
            from model.nanochat import load_nanochat

            run = load_nanochat(source.path)
            model, tok, family, hf = run.model, run.tokenizer, "nanochat", None
        elif source.kind == "file":
            from model.checkpoint import load_checkpoint
            from model.convert import LOCAL_LIMITS

            ck = load_checkpoint(source.path, LOCAL_LIMITS)
            model, tok, family, hf, film = ck.model, ck.tokenizer, "Decoder Lab file", None, ck.film
        else:
            hf = read_config(folder)
            family = family_of(hf).name
            model, tok = open_folder(folder, stored=WEIGHTS_DTYPE == "stored")
    except ValueError as exc:
        raise UserError(f"'{source.shown}' cannot be opened: {str(exc).rstrip('.')}.") from None
    except OSError:
        raise UserError(f"'{source.shown}' cannot be read here.") from None
    for p in model.parameters():
        p.requires_grad_(False)
    model.eval()
    examples = example_prompts(tok, model.cfg.block_size)
    entry = ExternalEntry(name, model, tok, {"source": source.shown, "sha256": digest}, examples=examples,
                          family=family, source=source.shown, sha256=digest, film=film,
                          licence=licence_of(folder if source.kind in ("folder", "hub") else None, hf))
    if not many_heads(entry.cfg):  # thousands of heads open on the roles map (ui.explore.opening_controls)
        entry.first_view, entry.examples = choose_first_view(entry)
    return entry


def open_on_backend(name: str, source, digest: str) -> ExternalEntry:
    """The entry of a source run by another backend than the own engine (source.backend: "nnsight", with its
    device_map and remote settings), as `python app.py --backend nnsight` asks; a refusal is a UserError."""
    from model.nnsight_backend import open_nnsight

    try:
        backend = open_nnsight(source.path if source.path is not None else source.repo, device_map=source.device_map,
                               remote=source.remote)
    except ValueError as exc:
        raise UserError(f"'{source.shown}' cannot be opened with nnsight: {str(exc).rstrip('.')}.") from None
    tok = backend.tokenizer
    examples = example_prompts(tok, backend.cfg.block_size)
    entry = ExternalEntry(name, None, tok, {"source": source.shown, "sha256": digest}, examples=examples,
                          family=f"{backend.family} through nnsight", source=source.shown, sha256=digest,
                          runner=backend)
    # a first view is found by running every example: on NDIF a request each, before the page answers; and a
    # model of many heads opens on the roles map anyway (lab.limits.MANY_HEADS)
    if not (source.remote or many_heads(entry.cfg)):
        entry.first_view, entry.examples = choose_first_view(entry)
    return entry


# ------------------------------------------------------------------------------ examples, first view


def induction_prompt(tok, seed: int = 0) -> str | None:
    """A random sequence of word tokens written twice (None when the vocabulary has too few words)."""
    text_of = getattr(tok, "text_of", None) or (lambda i: tok.decode([i]))  # a word keeps its space
    words = [text for i in range(tok.vocab_size) if _WORD.fullmatch(text := text_of(i))]
    spaced = [w for w in words if w.startswith(" ")]
    words = spaced if len(spaced) >= INDUCTION_TOKENS else words  # words apart where the vocabulary allows
    if len(words) < INDUCTION_TOKENS:  # a character vocabulary: letters
        words = [text for i in range(tok.vocab_size) if (text := text_of(i)).isascii() and text.isalpha()]
    if len(words) < INDUCTION_TOKENS:
        return None
    once = "".join(random.Random(seed).sample(words, INDUCTION_TOKENS))
    return (once + once).strip()


def example_prompts(tok, block_size: int) -> tuple[str, ...]:
    """The examples this model can read whole within its context (the induction prompt first)."""
    found = []
    for prompt in (induction_prompt(tok), REPEAT_PROMPT, PRONOUN_PROMPT, NAME_PROMPT):
        if prompt is None:
            continue
        enc = tok.encode_verbose(prompt)
        if not enc.unknown and 1 < len(enc.ids) <= block_size:
            found.append(prompt)
    return usable_examples(found)


def word_start_scores(attention: list[np.ndarray], pieces: list[str]) -> np.ndarray:
    """WORD_START's score of every head (L, H); NaN without a character after a space."""
    seps = [i for i, p in enumerate(pieces) if p in ("␣", "⏎")]
    queries = [i for i, p in enumerate(pieces) if p not in ("␣", "⏎") and seps and i > seps[0]]
    A = np.stack(attention)  # (L, H, T, T)
    if not queries:
        return np.full(A.shape[:2], np.nan)
    keys = [max(s for s in seps if s < i) for i in queries]
    return A[:, :, queries, keys].mean(-1).astype(np.float64)


def example_scores(entry: ModelEntry) -> list[dict[str, np.ndarray]]:
    """Each example's head scores (model.heads.head_scores, and WORD_START for a character tokenizer), as
    the app computes them on the prompt."""
    found = []
    for prompt in entry.examples:
        ids = entry.tokenizer.encode(prompt)
        attention = per_layer(entry.backend.forward(ForwardRequest(tuple(ids), attention="all")).attention, entry.cfg)
        scores = head_scores(attention, ids)
        if entry.tokenizer.kind == "char":
            scores["word_start"] = word_start_scores(attention, [entry.tokenizer.piece(i) for i in ids])
        found.append(scores)
    return found


def best_heads(entry: ModelEntry) -> list[tuple[str, int, int, int, float]]:
    """Per role of SHOWN_ROLES that some example defines: (role, example, layer, head, score) of the highest
    score over the examples and heads (the first example wins a tie)."""
    scores, best = example_scores(entry), []
    for key in SHOWN_ROLES:
        top = None
        for k, found in enumerate(scores):
            table = np.asarray(found.get(key, np.nan), dtype=np.float64)
            if np.isfinite(table).any() and (top is None or np.nanmax(table) > top[4]):
                layer, head = (int(v) for v in np.unravel_index(np.nanargmax(table), table.shape))
                top = (key, k, layer, head, float(table[layer, head]))
        if top is not None:
            best.append(top)
    return best


def choose_first_view(entry: ModelEntry) -> tuple[FirstView | None, tuple[str, ...]]:
    """(first view, examples with its example first): the head and example where the model shows something,
    as the built-ins open on one. The rule: of the roles in SHOWN_ROLES, the first that some head reaches
    (its score ≥ the role's threshold) on some example, at its highest score; when no head reaches one, the
    head nearest to a role (the highest score over its threshold), and the caption says no head stands out."""
    best = best_heads(entry) if entry.examples else []
    if not best:
        return None, entry.examples
    key, k, layer, head, score = choose(best)
    examples = (entry.examples[k], *entry.examples[:k], *entry.examples[k + 1:])
    return FirstView(layer, head, _caption(SHOWN[key], layer, head, score)), examples


def choose(best: list[tuple[str, int, int, int, float]]) -> tuple[str, int, int, int, float]:
    """Of `best_heads`' heads, the first whose score reaches its role's threshold, else the nearest to one
    (the highest score relative to its threshold)."""
    reached = [b for b in best if b[4] >= SHOWN[b[0]].threshold]
    return reached[0] if reached else max(best, key=lambda b: b[4] / SHOWN[b[0]].threshold)


def _caption(role, layer: int, head: int, score: float) -> str:
    what = ("in the second copy of the sequence, each token looks at the token that followed it the first time"
            if role.key == "induction" else role.meaning)
    if score >= role.threshold:
        return (f"On this example, layer {layer}, head {head} is this model's clearest {role.name} head "
                f"({score:.2f} ≥ {role.threshold:g}): {what}. Press Step.")
    return (f"No head of this model stands out on its examples: the nearest to a role is layer {layer}, "
            f"head {head}, {role.name} {score:.2f} (a head plays that role from {role.threshold:g}). Press Step, "
            "then look through the heads: the head tools below score every one.")
