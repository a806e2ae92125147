"""Minimal pairs made for a model's own tokenizer, and the check that finds them.

Compare A / B and activation patching need two prompts of the same number of tokens (patching swaps
activations position by position) and, for the metric, answers of one token each. Which words keep the
count equal depends on the tokenizer: " Paris" is one GPT-2 token and six characters of a character model;
" Elizabeth" is two GPT-2 tokens where " Mary" is one. So no list of pairs fits every model.

`TEMPLATES` are sentences with one slot, each with words to put there and the answer each word implies
(a name and its pronoun, a country and its capital, a word seen before and how it goes on). `pairs_for`
keeps, per template, the first two words whose prompts have the same number of tokens for this model,
whose answers differ and are one token each, and whose characters the model knows: a pair made for it.
`count_tokens` is the check behind that, for a person's own template and words: how many tokens the
prompt has with each word, grouped, so that any two words of one group make a pair.

The templates that read English come first; the two task templates (sort digits, copy letters) are offered
only to a model none of the English ones fits (a model trained here on the sort or copy task).
"""

from __future__ import annotations

from dataclasses import dataclass

from model.hf_tokenizer import HFFileTokenizer

from .catalogue.models import ModelEntry
from .checks import UserError

SLOT = "___"  # where a person's template takes the word ("{}" is taken too)
MAX_TEMPLATE_CHARS = 300
MAX_WORDS = 40
MAX_WORD_CHARS = 40


@dataclass(frozen=True)
class Template:
    text: str  # "{}" is where the word goes
    fills: tuple[tuple[str, str], ...]  # (word, the text that continues the prompt with that word)
    about: str  # what the pair asks of the model
    task: bool = False  # a training task's pattern, not English


TEMPLATES = (
    Template("When Mary and John went to the store, {} gave a drink to",
             (("John", " Mary"), ("Mary", " John")), "who receives: the other name (indirect object)"),
    Template("{} went to the shop, and then", (("Mary", " she"), ("John", " he"), ("Anna", " she"), ("Tom", " he"),
                                               ("Sarah", " she"), ("David", " he"), ("Emma", " she"), ("Paul", " he")),
             "which pronoun: the name's"),
    Template("The capital of {} is", (("France", " Paris"), ("Italy", " Rome"), ("Japan", " Tokyo"),
                                      ("Germany", " Berlin"), ("Spain", " Madrid"), ("Egypt", " Cairo")),
             "a fact: the country's capital"),
    Template("The {} on the table", (("book", " is"), ("books", " are"), ("key", " is"), ("keys", " are"),
                                     ("cup", " is"), ("cups", " are")), "agreement: is or are"),
    Template("{} found the key .", (("anna", " she"), ("tom", " he"), ("maria", " she"), ("peter", " he"),
                                    ("lisa", " she"), ("john", " he")), "which pronoun (lower case, words apart)"),
    Template("the {} sat. the c", (("cat", "a"), ("cot", "o"), ("cut", "u")),
             "copying: the letter after c, as before"),
    Template("she said {}, he said y", (("yes", "e"), ("you", "o")), "copying: the letter after y, as before"),
    Template("5{}3124=", (("0", "0"), ("6", "1")), "sorting: the smallest digit first", task=True),
    Template("hc{}padlk|hc", (("b", "b"), ("p", "p")), "copying the sequence: its third letter", task=True),
)


@dataclass(frozen=True)
class Pair:
    a: str
    b: str
    answer_a: str  # the display piece of A's answer (the token the metric puts first)
    answer_b: str
    about: str
    tokens: int  # tokens of each prompt


def _prompt_ids(entry: ModelEntry, text: str) -> list[int] | None:
    """The prompt's ids as the lab reads a prompt (lab.catalogue.models.encode_prompt: a BOS where the tokenizer adds
    one), or None when the model lacks one of its characters or words."""
    enc = entry.tokenizer.encode_verbose(text)
    return None if enc.unknown or not enc.ids else list(enc.ids)


def answer_ids(entry: ModelEntry, text: str) -> list[int] | None:
    """`text`'s own tokens as it continues a prompt (no BOS), or None when the model lacks part of it."""
    tok = entry.tokenizer
    enc = tok.encode_verbose(text, add_special_tokens=False) if isinstance(tok, HFFileTokenizer) else \
        tok.encode_verbose(text)
    return None if enc.unknown else list(enc.ids)


def answer_id(entry: ModelEntry, text: str) -> int | None:
    """The one token `text` is when it continues a prompt, or None when it is not one."""
    ids = answer_ids(entry, text)
    used = entry.cfg.vocab_used or entry.cfg.vocab_size
    return ids[0] if ids is not None and len(ids) == 1 and ids[0] < used else None


def _pair(entry: ModelEntry, template: Template) -> Pair | None:
    """The template's first pair that fits this model (see the module's docstring), or None."""
    block = entry.cfg.block_size
    usable = []  # (word, its prompt, tokens, answer id)
    for word, answer in template.fills:
        prompt = template.text.format(word)
        ids, token = _prompt_ids(entry, prompt), answer_id(entry, answer)
        if ids is not None and token is not None and len(ids) <= block:
            usable.append((prompt, len(ids), token))
    for i, (a, n, token_a) in enumerate(usable):
        for b, m, token_b in usable[i + 1:]:
            if m == n and token_b != token_a:
                return Pair(a, b, entry.pieces[token_a], entry.pieces[token_b], template.about, n)
    return None


def pairs_for(entry: ModelEntry) -> list[Pair]:
    """Minimal pairs for this model: one per template that fits it, the English ones first; the task
    templates only where no English one fits."""
    found = [p for t in TEMPLATES if not t.task for p in [_pair(entry, t)] if p is not None]
    return found or [p for t in TEMPLATES if t.task for p in [_pair(entry, t)] if p is not None]


def template_pair(a, b) -> bool:
    """Whether (a, b) are two prompts of one template (the menu of pairs offers no others)."""
    for t in TEMPLATES:
        prompts = [t.text.format(w) for w, _ in t.fills]
        if a in prompts and b in prompts and a != b:
            return True
    return False


def answers_of(entry: ModelEntry, a, b) -> tuple[str, str] | None:
    """The answer pieces of a template pair (A's first) for this model, when both are one token."""
    for t in TEMPLATES:
        answers = {t.text.format(w): answer for w, answer in t.fills}
        if a in answers and b in answers:
            ids = answer_id(entry, answers[a]), answer_id(entry, answers[b])
            return None if None in ids or ids[0] == ids[1] else (entry.pieces[ids[0]], entry.pieces[ids[1]])
    return None


@dataclass(frozen=True)
class Count:
    word: str
    tokens: int | None  # the prompt's tokens with this word (None: the model lacks a character or word of it)
    pieces: tuple[str, ...]  # how the model cuts the word where the template puts it (with the space before it)


def count_tokens(entry: ModelEntry, template, words) -> list[Count]:
    """For each word, the tokens of `template` with the word in its slot ("___" or "{}"), and the word's
    pieces. Refuses a template without one slot, and more or longer words than the page takes."""
    if not isinstance(template, str) or not isinstance(words, str):
        raise UserError("Type a template and some words.")
    if len(template) > MAX_TEMPLATE_CHARS:
        raise UserError(f"The template is {len(template):,} characters; {MAX_TEMPLATE_CHARS} at most.")
    if template.count(SLOT) + template.count("{}") != 1:
        raise UserError(f"Mark the one place for the word with {SLOT}, as in “The capital of {SLOT} is”.")
    listed = [w.strip() for w in words.replace("\n", ",").split(",") if w.strip()]
    if not listed:
        raise UserError("List the words to try, separated by commas (for example “France, Italy, Japan”).")
    if len(listed) > MAX_WORDS or any(len(w) > MAX_WORD_CHARS for w in listed):
        raise UserError(f"Try at most {MAX_WORDS} words of at most {MAX_WORD_CHARS} characters each.")
    before, _, after = template.replace("{}", SLOT).partition(SLOT)
    spaced = before.endswith(" ")
    out = []
    for word in dict.fromkeys(listed):
        ids = _prompt_ids(entry, before + word + after)
        alone = answer_ids(entry, (" " if spaced else "") + word) if ids is not None else None
        out.append(Count(word, None if ids is None else len(ids), tuple(entry.pieces[i] for i in alone or ())))
    return out


def count_report(counts: list[Count]) -> str:
    """The counts as Markdown: the groups of words whose prompts have the same number of tokens (any two of
    a group make a pair), largest first, each word's pieces, and the words the model cannot read."""
    groups: dict[int, list[Count]] = {}
    for c in counts:
        if c.tokens is not None:
            groups.setdefault(c.tokens, []).append(c)
    lines = []
    for n, group in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        shown = ", ".join(f"{_md(c.word)} ({' · '.join(_md(p) for p in c.pieces)})" for c in group)
        lead = "any two make a pair" if len(group) > 1 else "no other word has this count"
        lines.append(f"- **{n} tokens** ({lead}): {shown}")
    lost = [c.word for c in counts if c.tokens is None]
    if lost:
        lines.append(f"- not in this model's vocabulary: {', '.join(_md(w) for w in lost)}")
    return "\n".join(lines)


def _md(text: str) -> str:
    """A piece or word as Markdown shows it literally (no emphasis, links or HTML)."""
    out = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    for ch in "\\`*_{}[]()#+-.!|~":
        out = out.replace(ch, "\\" + ch)
    return out
