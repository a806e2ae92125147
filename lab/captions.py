"""The line above the attention: a built-in's own caption while its claim holds on the text shown,
else a sentence read off the very numbers drawn.

A built-in's caption (`lab.catalogue.models.FirstView`) quotes numbers measured on its first example prompt
(tests/lab/test_first_views.py holds them to the model). It is shown only for its own layer, head and
view, and only when its pattern holds on the attention drawn and every number it quotes is what
that attention gives, to the two decimals quoted. Anywhere else (another head, another text, a
text that grew past the claim) the caption describes the head shown from its own numbers.

Plain text: the wiring escapes it for the page (tokens such as <EOS> must stay text).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import numpy as np

from model import heads
from viz import LINES_VIEW, THUMBNAILS_VIEW

from . import headsettings
from .catalogue.models import ModelEntry, many_heads, thousands_of_heads_caption

_NUMBER = re.compile(r"\b\d\.\d\d\b")
SEPARATORS = ("␣", "⏎")  # how the character tokenizers show a space and a line break
MAX_LISTED_HEADS = 4  # "all heads" names where each head looks, up to this many heads

# A claim check reads the head's (T, T) weights, the pieces and the token ids of the text shown and
# returns the numbers its caption quotes, in order (None for one this text cannot show yet: a number
# measured after Generate), or None when the pattern the caption describes does not hold.
Claim = Callable[[np.ndarray, list[str], list[int]], list[float | None] | None]


def _pronoun(w: np.ndarray, t: list[str], ids: list[int]):
    if t.count("he") != 1 or t.count("tom") != 1:  # which "he", which "tom" would be unclear
        return None
    q, k = t.index("he"), t.index("tom")
    return [w[q, k]] if int(w[q].argmax()) == k else None


def _sort(w: np.ndarray, t: list[str], ids: list[int]):
    q, k = heads.ideal_keys_sort(t)
    if len(q) == 0 or t[k[0]] != "0" or int(w[q[0]].argmax()) != k[0]:
        return None
    if len(q) > 1 and (w[q].argmax(-1) == k).sum() <= len(q) / 2:  # "most answer rows": once there are some
        return None
    return [w[q[0], k[0]]]


def _copy(w: np.ndarray, t: list[str], ids: list[int]):
    if "|" not in t or t[0] != "h":
        return None
    sep = t.index("|")
    if int(w[sep].argmax()) != 0:
        return None
    iq, ik = heads.induction_targets(ids)
    if any(int(w[i].argmax()) != j for i, j in zip(iq, ik)):  # each copied letter so far
        return None
    whole_copy = len(iq) == sep  # the induction score quoted is the finished copy's
    return [w[sep, 0], float(heads.induction(w, ids)) if whole_copy else None]


def _article(w: np.ndarray, t: list[str], ids: list[int]):
    if "<EOS>" not in t or "is" not in t:
        return None
    q = t.index("<EOS>")  # the prompt's: a generated <EOS> comes after it
    k = int(w[q].argmax())
    return [w[q, k], None] if t[k] == "is" else None  # the second number is the second example's


def _word_start(w: np.ndarray, t: list[str], ids: list[int]):
    seps = [i for i, p in enumerate(t) if p in SEPARATORS]
    if not seps:
        return None
    queries = [i for i, p in enumerate(t) if p not in SEPARATORS and i > seps[0]]
    keys = [max(s for s in seps if s < i) for i in queries]
    if not queries or (w[queries].argmax(-1) == np.array(keys)).mean() <= 0.75:
        return None
    return [float(w[queries, keys].mean())]


CLAIMS: dict[str, Claim] = {
    "grammar (built-in)": _pronoun,
    "sort digits (built-in)": _sort,
    "copy / induction (built-in)": _copy,
    "article toy (built-in)": _article,
    "shakespeare (built-in)": _word_start,
}


def quoted_numbers(caption: str) -> list[str]:
    """The numbers a caption quotes ("0.76"), in order."""
    return _NUMBER.findall(caption)


def claim_holds(entry: ModelEntry, weights: Sequence[np.ndarray], tokens: Sequence[str], ids: Sequence[int]) -> bool:
    """Whether the built-in's caption is true of this attention (one (H, T, T) array per layer)."""
    fv, check = entry.first_view, CLAIMS.get(entry.name)
    if fv is None or check is None or not entry.builtin:
        return False
    values = check(np.asarray(weights[fv.layer][fv.head], dtype=np.float64), list(tokens), [int(i) for i in ids])
    quoted = quoted_numbers(fv.caption)
    if values is None or len(values) != len(quoted):
        return False
    return all(v is None or f"{v:.2f}" == q for v, q in zip(values, quoted))


def caption(entry: ModelEntry, weights, scores, tokens: Sequence[str], ids: Sequence[int], layer: int,
            head: int | None, view: str, change: str = "", heads: Sequence[int] | None = None) -> str:
    """What the line above the attention says about the picture drawn from `weights` / `scores`
    (per layer (H, T, T), as drawn: under the person's change when `change` names one). heads: the
    page of heads drawn when head is None (None: every head)."""
    fv = entry.first_view
    if (not change and fv is not None and (layer, head, view) == (fv.layer, fv.head, fv.view)
            and claim_holds(entry, weights, tokens, ids)):
        return fv.caption
    lead = f"With {change}: " if change else ""
    last = len(tokens) - 1
    if view == "all layers":
        return (lead + f"Every layer, every head: in each panel a row is a query token and its colours are the "
                f"weights it puts on the tokens up to it. The last token is “{tokens[last]}”.")
    if view in (LINES_VIEW, THUMBNAILS_VIEW):
        return lead + many_heads_caption(weights, tokens, layer, view)
    if head is None and len(weights[layer]) == 1:
        head = 0
    if head is None:
        w = weights[layer][:, last]  # (H, T): the last token's row in each head
        shown = list(range(len(w))) if heads is None else [int(h) for h in heads]
        looks = [f"“{tokens[int(w[h].argmax())]}” in head {h} ({w[h].max():.2f})" for h in shown[:MAX_LISTED_HEADS]]
        more = f", … ({len(shown)} heads)" if len(shown) > MAX_LISTED_HEADS else ""
        which = "every head" if heads is None else f"heads {shown[0]}–{shown[-1]} of {len(w)}"
        return (lead + f"Layer {layer}, {which}: the last token “{tokens[last]}” looks most at "
                + ", ".join(looks) + more + ". Click a token to see its row.")
    if view == "scores":
        row = scores[layer][head, last]
        top = int(np.nanargmax(np.where(np.isfinite(row), row, np.nan)))
        return (lead + f"Layer {layer}, head {head}, scores before the softmax: the last token “{tokens[last]}” "
                f"scores “{tokens[top]}” (position {top}) highest ({row[top]:.2f}). Click a token to see its row.")
    row = weights[layer][head, last]
    top = int(row.argmax())
    return (lead + f"Layer {layer}, head {head}: the row of the last token “{tokens[last]}” puts its largest "
            f"weight ({row[top]:.2f}) on “{tokens[top]}” (position {top}). Click a token to see its row.")


def many_heads_caption(weights, tokens: Sequence[str], layer: int, view: str) -> str:
    """The line above the views of many heads at once: how to read it, and one number read off it."""
    last = len(tokens) - 1
    if view == LINES_VIEW:
        w = np.asarray(weights[layer])[:, last]  # (H, T): the last token's row in each head
        h, k = np.unravel_index(int(w.argmax()), w.shape)
        return (f"Layer {layer}, all {len(w)} heads, one colour each; a line is as opaque as its weight. The last "
                f"token “{tokens[last]}” sends its strongest line to “{tokens[k]}” in head {h} "
                f"({w[h, k]:.2f}).")
    line = f"All {len(weights)} × {len(weights[0])} heads, each a small map of its weights: click one to open it."
    if last >= 1:
        q = np.arange(1, last + 1)
        prev = np.array([np.asarray(w)[:, q, q - 1].mean(-1) for w in weights])  # (L, H)
        li, h = np.unravel_index(int(prev.argmax()), prev.shape)
        line += f" Most on the previous token: layer {li}, head {h} (mean weight {prev[li, h]:.2f})."
    return line


# ------------------------------------------------------------------------- the head tools' change


def change_mark(settings: headsettings.ProbeSettings, start: int) -> str:
    """The head tools' change, short enough for a figure title: "L1H0 ablated (mean) · L1H0 row 11 edited"
    (`start`: the window's first position in the whole text)."""
    p, parts = settings, []
    if p.heads or p.keep_only:
        listed = [headsettings.head_label(*h) for h in p.heads]
        listed = ", ".join(listed[:3]) + (f" +{len(listed) - 3} more" if len(listed) > 3 else "")
        if p.keep_only:
            listed = f"all heads but {listed}" if listed else "all heads"
        parts.append(f"{listed} ablated ({p.mode})")
    if p.edit is not None:
        parts.append(f"{headsettings.head_label(p.edit.layer, p.edit.head)} row {p.edit.query - start} edited")
    return " · ".join(parts)


def no_text_caption(entry: ModelEntry, layer, head, view) -> str | None:
    """The line above the Explore attention before any text: a built-in's own line at its own view
    (what the first Step shows), else an invitation to press Step; the way to the head-roles map for a model of
    thousands of heads. None for an own model (the page has its own invitation)."""
    fv = entry.first_view
    if fv is not None and (layer, head, view) == (fv.layer, fv.head, fv.view):
        return fv.caption
    if fv is None and many_heads(entry.cfg):  # thousands of heads: where to start, whatever head is shown
        return thousands_of_heads_caption(entry.cfg)
    if not entry.builtin:
        return None
    which = "every layer" if view == "all layers" else f"layer {layer}, " + (
        "every head" if head == "all" else f"head {head}")
    return f"Press Step to see where each token looks in {which}."
