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

from model.heads import ROLES, head_scores

from .checks import UserError
from .models import FirstView, ModelEntry, counted, usable_examples

# Prompts that show something on a real model: a pronoun to resolve and a name to repeat (the
# indirect-object pattern). The first example is made per model: a random token sequence, twice.
PRONOUN_PROMPT = "Anna found the key under the mat. She gave it to Tom because he"
NAME_PROMPT = "When Mary and John went to the store, John gave a drink to"
INDUCTION_TOKENS = 10  # random tokens in the sequence that the induction prompt repeats
_WORD = re.compile(r" ?[A-Za-z]{3,10}")


@dataclass
class ExternalEntry(ModelEntry):
    """A model the person running the app added: where it comes from and what its files say."""

    family: str = ""
    source: str = ""  # repo@revision, or the local file or folder by its name (lab.external.Source.shown)
    sha256: str = ""
    licence: str | None = None

    @property
    def summary(self) -> str:
        c, tok = self.model.cfg, self.tokenizer
        tokens = counted(tok.vocab_size, "token")
        if c.vocab_used is not None and c.vocab_used < c.vocab_size:
            tokens += f", {c.vocab_size - c.vocab_used:,} padded rows never shown"
        bos = getattr(tok, "bos_id", None)
        if getattr(tok, "add_bos", False):
            tokens += f"; puts “{tok.piece(bos)}” first"
        elif tok.kind == "hf":
            tokens += "; no BOS token first"
        licence = f", licence {self.licence}" if self.licence else ""
        return (f"{self.name}: {self.family}, {counted(self.model.n_params(), 'parameter')}, "
                f"{counted(c.n_layers, 'layer')} × {counted(c.n_heads, 'head')}, d_model {c.d_model}, "
                f"context {c.block_size}, {tokenizer_name(tok)} ({tokens}), source {self.source}{licence}")


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


def open_source(name: str, source, folder: Path, digest: str) -> ExternalEntry:
    """The entry of a source whose files were checked (lab.external); a bad file is a UserError."""
    from model.families import family_of, open_folder
    from model.families.common import read_config
    from model.nanogpt import load_nanogpt

    film = None  # a Decoder Lab file may carry a film (a training's, or a series of checkpoints')
    try:
        if source.kind == "nanogpt":
            run = load_nanogpt(source.path)
            model, tok, family, hf = run.model, run.tokenizer, "nanoGPT (GPT-2 layout)", None
        elif source.kind == "file":
            from model.checkpoint import load_checkpoint
            from model.convert import LOCAL_LIMITS

            ck = load_checkpoint(source.path, LOCAL_LIMITS)
            model, tok, family, hf, film = ck.model, ck.tokenizer, "Decoder Lab file", None, ck.film
        else:
            hf = read_config(folder)
            family = family_of(hf).name
            model, tok = open_folder(folder)
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
    entry.first_view = first_view(entry)
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
    for prompt in (induction_prompt(tok), PRONOUN_PROMPT, NAME_PROMPT):
        if prompt is None:
            continue
        enc = tok.encode_verbose(prompt)
        if not enc.unknown and 1 < len(enc.ids) <= block_size:
            found.append(prompt)
    return usable_examples(found)


def first_view(entry: ModelEntry) -> FirstView | None:
    """The head with the highest induction score on the first example (the previous-token score where
    there is none), with a caption quoting the score as computed."""
    if not entry.examples:
        return None
    ids = entry.tokenizer.encode(entry.examples[0])
    with torch.inference_mode():
        out = entry.model(torch.tensor([ids]), return_attention=True)
    scores = head_scores([a[0].float().numpy() for a in out.attentions], ids)
    for key in ("induction", "previous_token"):
        table = np.asarray(scores[key], dtype=np.float64)
        if np.isfinite(table).any():
            layer, head = (int(v) for v in np.unravel_index(np.nanargmax(table), table.shape))
            return FirstView(layer, head, _caption(ROLES[key], layer, head, float(table[layer, head])))
    return None


def _caption(role, layer: int, head: int, score: float) -> str:
    where = f"On the first example, layer {layer}, head {head} has the highest {role.name} score of all heads"
    if role.key == "induction":
        what = "in the second copy of the sequence, each token looks at the token that followed it the first time"
    else:
        what = "each token looks at the token just before it"
    verdict = (f"({score:.2f} ≥ {role.threshold:g}): {what}." if score >= role.threshold
               else f"({score:.2f}, below the {role.threshold:g} from which a head is said to play that role).")
    return f"{where} {verdict} Press Step."
