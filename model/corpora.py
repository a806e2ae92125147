"""Built-in and user corpora for Decoder Lab.

Everything is generated locally and is deterministic given ``seed``.

Two corpus kinds:

* ``"examples"`` (toy, sort, copy): fixed-length rows ``x`` (N, L) with
  next-token targets ``y`` (N, L); ``y == -100`` where no loss is taken. Sort and copy
  examples end with ``<EOS>`` (one token of their char tokenizer), which is a target too.
* ``"text"`` (grammar, user text): a 1-D token stream split 90/10 by
  position; batches are random windows.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from .tokenizers import (
    EOS,
    MAX_TOKEN_BYTES,
    MAX_VOCAB,
    TOKENIZER_KINDS,
    BPETokenizer,
    CharTokenizer,
    Tokenizer,
    WordTokenizer,
    count_word_tokens,
)

__all__ = [
    "IGNORE_INDEX",
    "SORT_LEN",
    "COPY_LEN",
    "COPY_ALPHABET",
    "CORPUS_NAMES",
    "DEFAULT_TOKENIZER",
    "TOY_VOCAB",
    "FEMALE_NAMES",
    "MALE_NAMES",
    "PRESENT_VERBS",
    "MIN_TEXT_CHARS",
    "MAX_TEXT_CHARS",
    "MIN_TEXT_TOKENS",
    "WORD_VOCAB_LIMIT",
    "Stopped",
    "Split",
    "Corpus",
    "build_corpus",
    "check_trainable",
    "sort_examples",
    "copy_examples",
    "grammar_text",
    "read_text_file",
]

IGNORE_INDEX = -100
SORT_LEN = 6
COPY_LEN = 8
COPY_ALPHABET = "abcdefghijklmnop"
TASK_TRAIN_SIZE = 20_000
TASK_VAL_SIZE = 500
MIN_TEXT_CHARS = 1024
MAX_TEXT_CHARS = 1_200_000
MIN_TEXT_TOKENS = 20  # a token stream shorter than this cannot be split into train and val windows
ENCODE_CHUNK_CHARS = 100_000  # text encoded between two should_stop checks (BPE; char and word are fast whole)
WORD_VOCAB_LIMIT = 10_000  # word vocabulary cap for user text (rarer words -> <unk>)
GRAMMAR_TARGET_CHARS = 300_000
TRAIN_FRACTION = 0.9

# article 001's seven-word example: two hand-written sequences over this vocabulary
TOY_VOCAB = ("how", "is", "living", "in", "amsterdam", "exciting", "<EOS>")
_TOY_EXAMPLES = (
    ("how is living in amsterdam <EOS> exciting", "is living in amsterdam <EOS> exciting <EOS>"),
    ("living in amsterdam is how <EOS> exciting", "in amsterdam is how <EOS> exciting <EOS>"),
)

CORPUS_NAMES = ("toy", "sort", "copy", "grammar", "text")
DEFAULT_TOKENIZER = {"toy": "word", "sort": "char", "copy": "char", "grammar": "word", "text": "char"}


class Stopped(Exception):
    """Raised by :func:`build_corpus` when its ``should_stop`` says so between phases.

    Not a ``ValueError``: the corpus was not refused, the person stopped it.
    """


def _check_name(name: str) -> None:
    if name not in CORPUS_NAMES:
        raise ValueError(f"unknown corpus {name!r}; expected one of {', '.join(CORPUS_NAMES)}")


@dataclass
class Split:
    """Token data of one split (train or val)."""

    x: torch.Tensor  # (N, L) examples, or (N,) token stream
    y: torch.Tensor | None  # (N, L) targets with IGNORE_INDEX, or None for streams

    def __post_init__(self) -> None:
        if self.x.dtype != torch.long:
            raise ValueError("Split.x must be a LongTensor")
        if self.y is None:
            if self.x.dim() != 1:
                raise ValueError("a text split needs a 1-D token stream")
        elif self.x.dim() != 2 or self.y.shape != self.x.shape or self.y.dtype != torch.long:
            raise ValueError("an example split needs x and y LongTensors of the same (N, L) shape")

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def get_batch(
        self, batch_size: int, block_size: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Random batch ``(x, y)`` of shape (batch_size, T).

        Streams: windows ``x = ids[i:i+T]``, ``y = ids[i+1:i+T+1]`` with
        ``T = min(block_size, len - 1)``. Examples: rows sampled with
        replacement, cropped to ``block_size`` columns.
        """
        if batch_size < 1 or block_size < 1:
            raise ValueError("batch_size and block_size must be positive")
        if self.y is None:
            n = len(self)
            if n < 2:
                raise ValueError("token stream is too short to form a batch")
            t = min(block_size, n - 1)
            starts = torch.randint(0, n - t, (batch_size,), generator=generator)
            idx = starts[:, None] + torch.arange(t)
            return self.x[idx], self.x[idx + 1]
        rows = torch.randint(0, len(self), (batch_size,), generator=generator)
        return self.x[rows, :block_size], self.y[rows, :block_size]


@dataclass
class Corpus:
    """A built corpus: its tokenizer, both splits and a few example prompts."""

    name: str
    tokenizer: Tokenizer
    train: Split
    val: Split
    sample_prompts: list[str]
    kind: str  # "text" | "examples"


# --------------------------------------------------------------------------- tasks


def sort_examples(n: int, seed: int) -> list[str]:
    """``n`` strings like ``'503124=012345'`` (digits may repeat; the corpus adds ``<EOS>``)."""
    digits = np.random.default_rng(seed).integers(0, 10, size=(n, SORT_LEN))
    return ["".join(map(str, row)) + "=" + "".join(map(str, sorted(row))) for row in digits.tolist()]


def copy_examples(n: int, seed: int) -> list[str]:
    """``n`` strings like ``'hcbpadlk|hcbpadlk'`` over :data:`COPY_ALPHABET` (the corpus adds ``<EOS>``)."""
    letters = np.random.default_rng(seed).integers(0, len(COPY_ALPHABET), size=(n, COPY_LEN))
    out = []
    for row in letters.tolist():
        s = "".join(COPY_ALPHABET[i] for i in row)
        out.append(f"{s}|{s}")
    return out


def _disjoint(make: Callable[[int, int], list[str]], n_train: int, n_val: int, seed: int) -> tuple[list[str], list[str]]:
    """Train/val example lists where no val string occurs in train."""
    pool = make(n_train + 4 * n_val, seed)
    val: list[str] = []
    seen: set[str] = set()
    pos = 0
    while len(val) < n_val:
        s = pool[pos]
        pos += 1
        if s not in seen:
            seen.add(s)
            val.append(s)
    train = [s for s in pool[pos:] if s not in seen][:n_train]
    if len(train) < n_train:  # practically impossible for the built-in sizes
        raise RuntimeError("could not draw enough distinct examples")
    return train, val


def _example_split(tok: Tokenizer, examples: list[str], sep: str) -> Split:
    """Encode ``examples``, each followed by the end token ``<EOS>``.

    The loss is taken on every token after the separator ``sep``: the answer and the end
    token, so a trained model says where its answer ends (generation stops there).
    """
    eos = tok.eos_id
    if eos is None:
        raise ValueError("a task tokenizer needs the <EOS> token")
    ids = torch.tensor([tok.encode(s) + [eos] for s in examples], dtype=torch.long)
    x, y = ids[:, :-1].clone(), ids[:, 1:].clone()
    prompt_len = examples[0].index(sep) + 1  # tokens up to and including sep
    y[:, : prompt_len - 1] = IGNORE_INDEX
    return Split(x, y)


def _task_corpus(name: str, alphabet: str, sep: str, make: Callable[[int, int], list[str]], seed: int) -> Corpus:
    # one character per token, and <EOS> (the last id) as one token
    tok = CharTokenizer([*alphabet, sep, EOS])
    train, val = _disjoint(make, TASK_TRAIN_SIZE, TASK_VAL_SIZE, seed)
    return Corpus(
        name=name,
        tokenizer=tok,
        train=_example_split(tok, train, sep),
        val=_example_split(tok, val, sep),
        sample_prompts=[s[: s.index(sep) + 1] for s in val[:5]],
        kind="examples",
    )


def _toy_corpus() -> Corpus:
    tok = WordTokenizer(list(TOY_VOCAB))
    x = torch.tensor([tok.encode(a) for a, _ in _TOY_EXAMPLES], dtype=torch.long)
    y = torch.tensor([tok.encode(b) for _, b in _TOY_EXAMPLES], dtype=torch.long)
    return Corpus(
        name="toy",
        tokenizer=tok,
        train=Split(x, y),
        val=Split(x.clone(), y.clone()),
        sample_prompts=["how is living in amsterdam <EOS>", "living in amsterdam is how <EOS>"],
        kind="examples",
    )


# ------------------------------------------------------------------------- grammar

FEMALE_NAMES = ("anna", "maria", "lisa", "emma", "sara", "julia")
MALE_NAMES = ("tom", "peter", "john", "paul", "mark", "david")
_OBJECTS = ("key", "book", "ball", "letter", "apple", "cup", "map", "hat", "lamp", "box", "coin", "bag")
_PLACES = ("park", "garden", "kitchen", "school", "market", "station", "library")
_ADJECTIVES = ("red", "old", "small", "new", "blue", "heavy")
_MOODS = ("happy", "tired", "busy", "hungry", "late")
# base form -> third person singular present
PRESENT_VERBS = {
    "see": "sees", "like": "likes", "find": "finds", "help": "helps", "call": "calls",
    "visit": "visits", "know": "knows", "meet": "meets", "want": "wants", "carry": "carries",
    "wash": "washes", "need": "needs",
}  # fmt: skip
_PERSON_VERBS = ("see", "like", "help", "call", "visit", "know", "meet")
_THING_VERBS = ("like", "find", "want", "carry", "wash", "need", "see")
_PAST_THING = ("found", "lost", "bought", "dropped", "took", "washed")
_SUBJ = {"f": "she", "m": "he"}
_OBJ = {"f": "her", "m": "him"}
_POSS = {"f": "her", "m": "his"}


def _gender(name: str) -> str:
    return "f" if name in FEMALE_NAMES else "m"


def _story(r: random.Random) -> str:
    a, b = r.sample(FEMALE_NAMES + MALE_NAMES, 2)
    ga, gb = _gender(a), _gender(b)
    sa, sb, oa, ob, pa = _SUBJ[ga], _SUBJ[gb], _OBJ[ga], _OBJ[gb], _POSS[ga]
    obj, obj2 = r.sample(_OBJECTS, 2)
    place, adj, mood = r.choice(_PLACES), r.choice(_ADJECTIVES), r.choice(_MOODS)
    v3 = PRESENT_VERBS[r.choice(_THING_VERBS)]
    vp3 = PRESENT_VERBS[r.choice(_PERSON_VERBS)]
    vbase = r.choice(_THING_VERBS)
    past = r.choice(_PAST_THING)
    template = r.randrange(7)
    if template == 0:
        s = f"{a} {past} the {obj} . {sa} gave it to {b} because {sb} asked {oa} ."
    elif template == 1:
        s = f"{a} {vp3} {b} . {sa} {v3} {pa} {adj} {obj} every day ."
    elif template == 2:
        s = f"{a} and {b} went to the {place} . they {vbase} the {obj} there ."
    elif template == 3:
        s = f"{a} lost {pa} {obj} in the {place} . {b} found it and gave it back to {oa} ."
    elif template == 4:
        s = f"{a} is {mood} . {sa} {v3} the {obj} and {b} {vp3} {oa} ."
    elif template == 5:
        s = f"{a} met {b} at the {place} . {sa} told {ob} about {pa} {obj2} ."
    else:
        s = f"{a} and {b} are {mood} . they {vbase} the {obj} , so {a} {vp3} {ob} ."
    return s


def grammar_text(seed: int = 0, target_chars: int = GRAMMAR_TARGET_CHARS) -> str:
    """Generated stories, one per line, about ``target_chars`` characters long.

    Grammar rules (tested): a sentence that starts with a pronoun refers to
    the previous sentence's subject (he/she for one person, they for two);
    present-tense verbs agree with their subject; every gendered pronoun
    matches the gender of a person named in the same story.
    """
    r = random.Random(seed)
    lines: list[str] = []
    total = 0
    while total < target_chars:
        line = _story(r)
        lines.append(line)
        total += len(line) + 1
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------- user text


def _check_text(text: object) -> str:
    """The text of a "text" corpus, of an allowed length."""
    if not isinstance(text, str):
        raise ValueError("the 'text' corpus needs text (a str)")
    if not text.strip():
        raise ValueError("the text is empty")
    if len(text.strip()) < MIN_TEXT_CHARS:
        raise ValueError(f"the text is too short: {len(text.strip())} characters; at least {MIN_TEXT_CHARS} are needed")
    if len(text) > MAX_TEXT_CHARS:
        raise ValueError(f"the text is too long: {len(text)} characters; at most {MAX_TEXT_CHARS} are allowed")
    return text


def read_text_file(path: str | os.PathLike[str], max_bytes: int = MAX_TEXT_CHARS) -> str:
    """Read a UTF-8 text file, refusing large, binary or non-UTF-8 files.

    A leading BOM is dropped and Windows line endings become ``\\n``.
    """
    size = os.path.getsize(path)
    if size > max_bytes:
        raise ValueError(f"file is too large: {size} bytes; the limit is {max_bytes} bytes")
    with open(path, "rb") as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"file is too large; the limit is {max_bytes} bytes")
    try:
        text = data.decode("utf-8", errors="strict")
    except UnicodeDecodeError:
        raise ValueError("file is not UTF-8 text") from None
    if "\x00" in text:
        raise ValueError("file contains NUL bytes; not UTF-8 text")
    return text.removeprefix("\ufeff").replace("\r\n", "\n")


def _check_kind(tokenizer_kind: object) -> str:
    if not isinstance(tokenizer_kind, str) or tokenizer_kind not in TOKENIZER_KINDS:
        raise ValueError(f"unknown tokenizer kind {tokenizer_kind!r}; expected one of {', '.join(TOKENIZER_KINDS)}")
    return tokenizer_kind


def _check_tokenizable(text: str, kind: str, bpe_vocab_size: int) -> None:
    """Refuse, in well under a second, text that ``kind`` cannot turn into a corpus."""
    if kind == "bpe" and (isinstance(bpe_vocab_size, bool) or not isinstance(bpe_vocab_size, int)
                          or not 2 <= bpe_vocab_size <= MAX_VOCAB):
        raise ValueError(f"the BPE vocabulary size must be an integer from 2 to {MAX_VOCAB:,}")
    if kind == "word":
        tokens, usable = count_word_tokens(text, enough=MIN_TEXT_TOKENS)
        if tokens < MIN_TEXT_TOKENS:
            raise ValueError(
                f"the text gives only {tokens} word token{'' if tokens == 1 else 's'}; "
                f"at least {MIN_TEXT_TOKENS} are needed "
                "(a word is a run of letters, digits and apostrophes, or one punctuation mark: "
                "for text without spaces between words use the char or bpe tokenizer)")
        if usable < MIN_TEXT_TOKENS:
            raise ValueError(
                f"only {usable} of the text's word tokens are short enough for a word vocabulary "
                f"(at most {MAX_TOKEN_BYTES} bytes); at least {MIN_TEXT_TOKENS} are needed: "
                "use the char or bpe tokenizer")
        return
    # char and bpe: every character is a token or part of one (a BPE token has at most 16), so
    # a text of MIN_TEXT_CHARS always gives enough tokens; the vocabulary holds every character.
    distinct = set(text)
    usable = sum(1 for c in distinct if not "\ud800" <= c <= "\udfff")
    if usable == 0:
        raise ValueError("the text has no usable characters (only lone surrogates, which are not valid Unicode)")
    if usable + 1 > MAX_VOCAB:
        raise ValueError(f"the text has {usable:,} distinct characters; a {kind} vocabulary holds at most "
                         f"{MAX_VOCAB - 1:,}: use the word tokenizer")


def check_trainable(text: object, tokenizer_kind: str, bpe_vocab_size: int = 256) -> str:
    """Return ``text`` if a "text" corpus can be built from it with ``tokenizer_kind``.

    Otherwise raise ``ValueError`` saying what is wrong (not text, empty, too short or too
    long, too few word tokens for the word tokenizer, too many distinct characters for a
    char or BPE vocabulary). Cheap (well under a second for the largest allowed text), and
    :func:`build_corpus` runs it before any tokenizer is trained, so a caller need not.
    """
    body = _check_text(text)
    _check_tokenizable(body, _check_kind(tokenizer_kind), bpe_vocab_size)
    return body


def _train_tokenizer(kind: str, text: str, bpe_vocab_size: int) -> Tokenizer:
    if kind == "char":
        return CharTokenizer.train(text)
    if kind == "word":
        return WordTokenizer.train(text, max_vocab=WORD_VOCAB_LIMIT)
    return BPETokenizer.train(text, vocab_size=bpe_vocab_size)


def _stream_corpus(
    name: str, text: str, tokenizer_kind: str, bpe_vocab_size: int, prompts: list[str], stop: Callable[[], None]
) -> Corpus:
    tok = _train_tokenizer(tokenizer_kind, text, bpe_vocab_size)
    stop()
    encoded: list[int] = []
    for part in tok.encode_chunks(text, ENCODE_CHUNK_CHARS):
        encoded += part
        stop()
    ids = torch.tensor(encoded, dtype=torch.long)
    if len(ids) < MIN_TEXT_TOKENS:  # check_trainable refuses such text first; the invariant, stated here
        raise ValueError(f"the text gives only {len(ids)} {tokenizer_kind} tokens; "
                         f"at least {MIN_TEXT_TOKENS} are needed")
    cut = int(len(ids) * TRAIN_FRACTION)
    return Corpus(
        name=name,
        tokenizer=tok,
        train=Split(ids[:cut].clone(), None),
        val=Split(ids[cut:].clone(), None),
        sample_prompts=prompts,
        kind="text",
    )


def _text_prompts(text: str) -> list[str]:
    """A few line openings from the text (first words of non-empty lines)."""
    prompts: list[str] = []
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 3:
            p = " ".join(words[:3])
            if p not in prompts:
                prompts.append(p)
        if len(prompts) == 3:
            break
    return prompts or [text.strip()[:20]]


# --------------------------------------------------------------------------- build


def build_corpus(
    name: str,
    tokenizer_kind: str | None = None,
    seed: int = 0,
    text: str | None = None,
    bpe_vocab_size: int = 256,
    should_stop: Callable[[], bool] | None = None,
) -> Corpus:
    """Build a corpus by name (see :data:`CORPUS_NAMES`).

    ``tokenizer_kind`` (None = :data:`DEFAULT_TOKENIZER` for the corpus) only
    applies to "grammar" and "text"; toy is always word-level, sort/copy
    always char-level. ``text`` is only used by "text".

    Text that cannot make a corpus is refused (``ValueError``, see :func:`check_trainable`)
    before any tokenizer is trained. Each phase of a "grammar" or "text" corpus (check,
    tokenizer training, encoding part by part) takes a bounded time for any allowed text, and
    ``should_stop`` is asked between them: when it returns true, :class:`Stopped` is raised.
    """
    _check_name(name)
    if tokenizer_kind is None:
        tokenizer_kind = DEFAULT_TOKENIZER[name]
    _check_kind(tokenizer_kind)

    def stop() -> None:
        if should_stop is not None and should_stop():
            raise Stopped("building the corpus was stopped")

    if name == "toy":
        return _toy_corpus()
    if name == "sort":
        return _task_corpus("sort", "0123456789", "=", sort_examples, seed)
    if name == "copy":
        return _task_corpus("copy", COPY_ALPHABET, "|", copy_examples, seed)
    if name == "grammar":
        prompts = ["anna found the key . she", "tom met lisa at the park . he", "maria lost her"]
        return _stream_corpus("grammar", grammar_text(seed), tokenizer_kind, bpe_vocab_size, prompts, stop)
    body = check_trainable(text, tokenizer_kind, bpe_vocab_size)
    stop()
    return _stream_corpus("text", body, tokenizer_kind, bpe_vocab_size, _text_prompts(body), stop)
