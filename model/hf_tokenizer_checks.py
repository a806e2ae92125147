"""The checks on a Hugging Face tokenizer.json that a Decoder Lab file carries (tokenizer kind "hf"),
run on plain JSON values before the `tokenizers` library sees a byte of it.

A converted pretrained model (python -m model.convert) stores its tokenizer.json in the file's
metadata, and such a file may come back as a visitor's upload. The library runs whatever the JSON
describes (a padding of millions of tokens, a normalizer that multiplies text, a regex that
backtracks, an Aho-Corasick automaton over a flood of added tokens), so, as model/bpe.py does for
the app's own BPE, only what the supported families' tokenizers use is accepted:

* the JSON text: at most MAX_JSON_CHARS_PER_TOKEN characters per allowed token, parsed by `json`
  with duplicate keys refused, no padding, no truncation;
* the model: BPE only (WordPiece, Unigram, WordLevel are refused by name), its vocabulary and added
  tokens holding the ids 0 .. n-1 once each with n within the vocabulary limit, each token at most
  MAX_HF_TOKEN_BYTES bytes, at most as many merges as tokens, each made of vocabulary tokens;
* normalizer, pre-tokenizer, post-processor and decoder: one of the steps GPT-2, GPT-Neo, Pythia,
  SmolLM2, Llama/TinyLlama, Llama 3, SmolLM3, Qwen2/2.5/3, OLMo 2, Phi-4-mini and Gemma 2/3 tokenizers
  use (table `STEPS`), with their few options checked, or a Sequence of at most MAX_SEQUENCE of them;
  anything else is refused by its type name;
* a `Split` pre-tokenizer: its pattern one of the exact strings those families ship (`SPLIT_REGEXES`,
  and Gemma's split at a space), never a regular expression of the file's own.

Every refusal is a ValueError with one sentence that names the field.
"""

from __future__ import annotations

from typing import Any, Callable

from . import json_bounds
from .json_bounds import unique_keys
from .tokenizer_core import check_keys, check_same, json_type, preview, utf8_len

# A token's text as the file stores it (GPT-2's byte alphabet takes at most 2 bytes of UTF-8 per
# byte it stands for); bounds what one generated token can add to the text.
MAX_HF_TOKEN_BYTES = 512
MAX_JSON_CHARS_PER_TOKEN = 400  # GPT-2's tokenizer.json: 1.4 MB for 50,257 tokens, about 28 per token
MAX_ADDED_TOKENS = 8192  # Pythia adds 25, SmolLM2 17, Llama 3 256, Gemma 3 about 6,400 (its control tokens)
# merges per token of the vocabulary: a byte-level file converted from tiktoken lists every pair that makes a
# token, several per token (Llama 3: 280,147 merges for 128,256 tokens; Llama 2: 61,249 for 32,000)
MERGES_PER_TOKEN = 4
MAX_SEQUENCE = 4  # steps in one Sequence step (TinyLlama's decoder has 4)
MAX_TEMPLATE = 8  # pieces of a TemplateProcessing template, and its special tokens
SPACE_MARK = "\u2581"  # SentencePiece's "▁", which stands for a space

TOP_KEYS = {"version", "truncation", "padding", "added_tokens", "normalizer", "pre_tokenizer", "post_processor",
            "decoder", "model"}
MODEL_KEYS = {"type", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk",
              "byte_fallback", "ignore_merges", "vocab", "merges"}
ADDED_FLAGS = ("single_word", "lstrip", "rstrip", "normalized", "special")
BYTE_LEVEL = {"add_prefix_space": bool, "trim_offsets": bool, "use_regex": bool}


def checked_document(text: Any, max_vocab: int) -> dict[str, Any]:
    """The parsed tokenizer.json, every field checked (see the module docstring)."""
    if not isinstance(text, str):
        raise ValueError(f"the hf tokenizer's tokenizer.json must be a JSON string, not {json_type(text)}")
    cap = MAX_JSON_CHARS_PER_TOKEN * max_vocab
    if len(text) > cap:
        raise ValueError(f"the hf tokenizer's tokenizer.json is {len(text):,} characters; the limit is {cap:,}")
    what = "the hf tokenizer's tokenizer.json"
    doc = json_bounds.parse(text, what, object_pairs_hook=unique_keys(what), parse_constant=_no_constant)
    check_keys(doc, "tokenizer.json", TOP_KEYS)
    check_same(doc["version"], "1.0", "tokenizer.json version")
    for key in ("truncation", "padding"):  # the app never pads or truncates a prompt
        if doc[key] is not None:
            raise ValueError(f"tokenizer.json {key} must be null: the app never uses it")
    vocab = _checked_model(doc["model"], max_vocab)
    n_tokens = _checked_added_tokens(doc["added_tokens"], vocab, max_vocab)
    for slot in STEPS:
        _checked_step(doc[slot], slot, n_tokens, top=True)
    return doc


def check_counts(doc: Any, max_vocab: int) -> int:
    """The counts of a tokenizer.json as a model folder holds it (an older release of the library may
    have written it, so its keys are not checked yet), before the library builds anything from it:
    the added tokens and merges within the bounds `checked_document` holds them to. Returns the number
    of tokens in its model's vocabulary (the caller compares it with the model's rows)."""
    if not isinstance(doc, dict):
        raise ValueError(f"tokenizer.json must hold an object, not {json_type(doc)}")
    model = doc.get("model")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    n = len(vocab) if isinstance(vocab, (dict, list)) else 0
    added, merges = doc.get("added_tokens"), model.get("merges") if isinstance(model, dict) else None
    limit = min(MAX_ADDED_TOKENS, max_vocab)
    if isinstance(added, list) and len(added) > limit:
        raise ValueError(f"tokenizer.json added_tokens has {len(added):,} entries; the limit is {limit:,}")
    if isinstance(merges, list) and len(merges) > MERGES_PER_TOKEN * max(n, 1):
        raise ValueError(f"tokenizer.json model.merges has {len(merges):,} entries; the limit is "
                         f"{MERGES_PER_TOKEN} per token of the vocabulary's {n:,}")
    return n


def _checked_model(model: Any, max_vocab: int) -> dict[str, int]:
    """model: BPE with its vocabulary and merges within bounds; returns the vocabulary."""
    if isinstance(model, dict) and model.get("type") != "BPE":
        kind = model.get("type")
        shown = preview(kind) if isinstance(kind, str) else json_type(kind)
        raise ValueError(f"tokenizer.json model.type is {shown}; only BPE models (GPT-2's and Llama's kind) are read")
    check_keys(model, "tokenizer.json model", MODEL_KEYS)
    check_same(model["dropout"], None, "tokenizer.json model.dropout")
    for key in ("continuing_subword_prefix", "end_of_word_suffix"):
        if model[key] not in (None, ""):
            raise ValueError(f"tokenizer.json model.{key} must be null (byte-level and SentencePiece BPE use none)")
    for key in ("fuse_unk", "byte_fallback", "ignore_merges"):
        _flag(model[key], f"tokenizer.json model.{key}")
    vocab = model["vocab"]
    field = "tokenizer.json model.vocab"
    if not isinstance(vocab, dict):
        raise ValueError(f"{field} must be an object, not {json_type(vocab)}")
    if not 1 <= len(vocab) <= max_vocab:
        raise ValueError(f"{field} has {len(vocab):,} tokens; this file may have 1 to {max_vocab:,}")
    for token, i in vocab.items():
        _token(token, f"{field} entry {preview(token)}")
        _id(i, max_vocab, f"{field} id of {preview(token)}")
    unk = model["unk_token"]
    if unk is not None and (not isinstance(unk, str) or unk not in vocab):
        raise ValueError("tokenizer.json model.unk_token must be null or a token of the vocabulary")
    _checked_merges(model["merges"], vocab)
    return vocab


def _checked_merges(merges: Any, vocab: dict[str, int]) -> None:
    field = "tokenizer.json model.merges"
    if not isinstance(merges, list):
        raise ValueError(f"{field} must be an array, not {json_type(merges)}")
    if len(merges) > MERGES_PER_TOKEN * len(vocab):
        raise ValueError(f"{field} has {len(merges):,} entries; the limit is {MERGES_PER_TOKEN} per token of "
                         f"the vocabulary's {len(vocab):,}")
    for i, pair in enumerate(merges):
        if not isinstance(pair, list) or len(pair) != 2 or not all(isinstance(p, str) for p in pair):
            raise ValueError(f"{field}[{i}] must be an array of two strings")
        for part in (pair[0], pair[1], pair[0] + pair[1]):
            if part not in vocab:
                raise ValueError(f"{field}[{i}] uses or makes {preview(part)}, which is not in the vocabulary")


def _checked_added_tokens(added: Any, vocab: dict[str, int], max_vocab: int) -> int:
    """added_tokens: few, each a token of its own id or the vocabulary's same token; together with
    the vocabulary the ids run 0 .. n-1, each once, so every id a text encodes to has a model row.
    Returns n."""
    field = "tokenizer.json added_tokens"
    if not isinstance(added, list):
        raise ValueError(f"{field} must be an array, not {json_type(added)}")
    limit = min(MAX_ADDED_TOKENS, max_vocab)
    if len(added) > limit:
        raise ValueError(f"{field} has {len(added):,} entries; the limit is {limit:,}")
    tokens = {i: t for t, i in vocab.items()}
    if len(tokens) != len(vocab):
        raise ValueError("tokenizer.json model.vocab gives one id to two tokens")
    for n, entry in enumerate(added):
        where = f"{field}[{n}]"
        check_keys(entry, where, {"id", "content", *ADDED_FLAGS})
        content, i = _token(entry["content"], f"{where}.content"), _id(entry["id"], max_vocab, f"{where}.id")
        for flag in ADDED_FLAGS:
            _flag(entry[flag], f"{where}.{flag}")
        if tokens.get(i, content) != content or vocab.get(content, i) != i:
            raise ValueError(f"{where} gives id {i} to {preview(content)}, which the vocabulary holds otherwise")
        tokens[i] = content
    if len(tokens) != max(tokens) + 1:
        raise ValueError(f"tokenizer.json's token ids must run from 0 to {len(tokens) - 1} without gaps")
    return len(tokens)


# ------------------------------------------------------------------ normalizer, pre-tokenizer, ...


def _fixed(**values: Any) -> Callable[[dict, str, int], None]:
    """A step whose options must be exactly these values."""
    def check(step: dict, field: str, n_tokens: int) -> None:
        for key, value in values.items():
            check_same(step[key], value, f"{field}.{key}")
    check.keys = set(values)
    return check


def _typed(**types: type) -> Callable[[dict, str, int], None]:
    """A step whose options are free within their types (booleans)."""
    def check(step: dict, field: str, n_tokens: int) -> None:
        for key, kind in types.items():
            if type(step[key]) is not kind:
                raise ValueError(f"{field}.{key} must be {json_type(kind())}")
    check.keys = set(types)
    return check


def _metaspace(step: dict, field: str, n_tokens: int) -> None:
    check_same(step["replacement"], SPACE_MARK, f"{field}.replacement")
    if step["prepend_scheme"] not in ("always", "never", "first"):
        raise ValueError(f"{field}.prepend_scheme must be \"always\", \"never\" or \"first\"")
    _flag(step["split"], f"{field}.split")


_metaspace.keys = {"replacement", "prepend_scheme", "split"}


def _strip(step: dict, field: str, n_tokens: int) -> None:
    check_same(step["content"], " ", f"{field}.content")
    for key in ("start", "stop"):
        if type(step[key]) is not int or step[key] not in (0, 1):
            raise ValueError(f"{field}.{key} must be 0 or 1")


_strip.keys = {"content", "start", "stop"}


def _template(step: dict, field: str, n_tokens: int) -> None:
    """TemplateProcessing (Llama's BOS): a few pieces and special tokens of the vocabulary."""
    specials = step["special_tokens"]
    if not isinstance(specials, dict) or len(specials) > MAX_TEMPLATE:
        raise ValueError(f"{field}.special_tokens must be an object of at most {MAX_TEMPLATE} tokens")
    for name, special in specials.items():
        where = f"{field}.special_tokens[{preview(name)}]"
        _token(name, where)
        check_keys(special, where, {"id", "ids", "tokens"})
        check_same(special["id"], name, f"{where}.id")
        ids, tokens = special["ids"], special["tokens"]
        if not (isinstance(ids, list) and isinstance(tokens, list) and 1 <= len(ids) == len(tokens) <= MAX_TEMPLATE):
            raise ValueError(f"{where} must list 1 to {MAX_TEMPLATE} ids and as many tokens")
        for i in ids:
            _id(i, n_tokens, f"{where}.ids")
        for t in tokens:
            _token(t, f"{where}.tokens")
    for key in ("single", "pair"):
        pieces = step[key]
        if not isinstance(pieces, list) or not 1 <= len(pieces) <= MAX_TEMPLATE:
            raise ValueError(f"{field}.{key} must be an array of 1 to {MAX_TEMPLATE} pieces")
        for piece in pieces:
            _template_piece(piece, specials, f"{field}.{key}")


_template.keys = {"single", "pair", "special_tokens"}


def _template_piece(piece: Any, specials: dict, field: str) -> None:
    if not isinstance(piece, dict) or len(piece) != 1 or not set(piece) <= {"SpecialToken", "Sequence"}:
        raise ValueError(f"{field} pieces must each be one SpecialToken or Sequence")
    (kind, body), = piece.items()
    check_keys(body, f"{field} {kind}", {"id", "type_id"})
    if type(body["type_id"]) is not int or not 0 <= body["type_id"] < MAX_TEMPLATE:
        raise ValueError(f"{field} {kind}.type_id must be a whole number below {MAX_TEMPLATE}")
    allowed = ("A", "B") if kind == "Sequence" else tuple(specials)
    if not isinstance(body["id"], str) or body["id"] not in allowed:
        raise ValueError(f"{field} {kind}.id must be one of {', '.join(allowed) or 'its special tokens'}")


# The regular expressions a Split pre-tokenizer may carry, exactly as the families' tokenizer.json
# files hold them. A file never brings its own: the library runs the expression on every text, and a
# backtracking one can take minutes. Each of these matches every character of any text, so the
# "Isolated" behaviour and "Removed" with invert true (the spelling of files converted from tiktoken
# by older tools: OLMo 2's, Phi-4's) cut a text into the same pieces.
SPLIT_REGEXES = {
    # Qwen2, Qwen2.5, Qwen3 (transformers' Qwen2Tokenizer): digits one at a time
    "Qwen2": (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
              r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""),
    # cl100k: Llama 3.x and SmolLM3 (Isolated), OLMo 2 and Phi-4 (Removed, inverted): digits in threes
    "cl100k": (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"""
               r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""),
    # o200k (GPT-4o's encoding): Phi-4-mini; letters split by case, contractions kept on the word
    "o200k": (r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"""
              r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?"""
              r"""|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"""
              r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?"""
              r"""|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"""),
    # nanochat (model/nanochat_tokenizer.py, which builds its tokenizer.json): GPT-4's with digits in twos,
    # possessive quantifiers
    "nanochat": (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*"""
                 r"""|\s*[\r\n]|\s+(?!\S)|\s+"""),
}
SPLIT_SHIPPED = "the Qwen2, cl100k (Llama 3, OLMo 2), o200k (Phi-4-mini), nanochat and Gemma tokenizers"
SPLIT_CUTS = (("Isolated", False), ("Removed", True))  # (behavior, invert)
# Gemma 2 and 3: a split at the space, after the normalizer has turned every space into "▁" (so it
# never cuts; transformers' GemmaTokenizer writes it all the same)
GEMMA_SPLIT = {"pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": False}


def _split(step: dict, field: str, n_tokens: int) -> None:
    """Split: one of the patterns the families ship (SPLIT_REGEXES, GEMMA_SPLIT), cut as they cut."""
    pattern = step["pattern"]
    if pattern == GEMMA_SPLIT["pattern"]:
        for key in ("behavior", "invert"):
            check_same(step[key], GEMMA_SPLIT[key], f"{field}.{key}")
        return
    kind, text = next(iter(pattern.items())) if isinstance(pattern, dict) and len(pattern) == 1 else (None, None)
    if kind != "Regex" or not isinstance(text, str) or text not in SPLIT_REGEXES.values():
        if kind in ("Regex", "String") and isinstance(text, str):
            shown = f"the {'regular expression' if kind == 'Regex' else 'string'} {preview(text)}"
        else:
            shown = f"a pattern that is {json_type(pattern)}"
        raise ValueError(f"tokenizer.json has a pre_tokenizer of type 'Split', which the app does not run with "
                         f"{shown}: it runs only the exact patterns {SPLIT_SHIPPED} ship")
    behavior, invert = step["behavior"], step["invert"]
    if type(invert) is not bool or (behavior, invert) not in SPLIT_CUTS:
        raise ValueError(f"{field}.behavior is {preview(behavior)} with invert {preview(invert)}; with this "
                         "pattern the app runs only \"Isolated\" (invert false) or \"Removed\" (invert true)")


_split.keys = {"pattern", "behavior", "invert"}


BYTE_LEVEL_STEP = _typed(**BYTE_LEVEL)
# The steps each slot accepts, by type name: those the supported families' tokenizer.json files use.
STEPS: dict[str, dict[str, Callable]] = {
    "normalizer": {"NFC": _fixed(), "Prepend": _fixed(prepend=SPACE_MARK),
                   "Replace": _fixed(pattern={"String": " "}, content=SPACE_MARK)},
    "pre_tokenizer": {"ByteLevel": BYTE_LEVEL_STEP, "Digits": _typed(individual_digits=bool), "Metaspace": _metaspace,
                      "Split": _split},
    "post_processor": {"ByteLevel": BYTE_LEVEL_STEP, "TemplateProcessing": _template},
    "decoder": {"ByteLevel": BYTE_LEVEL_STEP, "Metaspace": _metaspace, "ByteFallback": _fixed(), "Fuse": _fixed(),
                "Strip": _strip, "Replace": _fixed(pattern={"String": SPACE_MARK}, content=" ")},
}
SEQUENCE_KEY = {"normalizer": "normalizers", "pre_tokenizer": "pretokenizers", "post_processor": "processors",
                "decoder": "decoders"}


def _checked_step(step: Any, slot: str, n_tokens: int, top: bool) -> None:
    """One normalizer / pre-tokenizer / post-processor / decoder (null only at the top)."""
    field = f"tokenizer.json {slot}"
    if step is None and top:
        return
    kind = step.get("type") if isinstance(step, dict) else None
    if not isinstance(kind, str):
        raise ValueError(f"{field} must be {'null or ' if top else ''}an object with a type")
    if kind == "Sequence" and top:
        key = SEQUENCE_KEY[slot]
        check_keys(step, field, {"type", key})
        inner = step[key]
        if not isinstance(inner, list) or not 1 <= len(inner) <= MAX_SEQUENCE:
            raise ValueError(f"{field}.{key} must be an array of 1 to {MAX_SEQUENCE} steps")
        for sub in inner:
            _checked_step(sub, slot, n_tokens, top=False)
        return
    check = STEPS[slot].get(kind)
    if check is None:
        known = ", ".join(STEPS[slot])
        raise ValueError(f"tokenizer.json has a {slot} of type {preview(kind)}, which the app does not run "
                         f"(it reads {known} and Sequence)")
    check_keys(step, f"{field} {kind}", {"type", *check.keys})
    check(step, f"{field} {kind}", n_tokens)


# ------------------------------------------------------------------ values


def _token(token: Any, field: str) -> str:
    if not isinstance(token, str) or not token:
        raise ValueError(f"{field} must be a non-empty string")
    if len(token) > MAX_HF_TOKEN_BYTES or utf8_len(token) > MAX_HF_TOKEN_BYTES:
        raise ValueError(f"{field} is longer than {MAX_HF_TOKEN_BYTES} bytes")
    if any("\ud800" <= c <= "\udfff" for c in token):
        raise ValueError(f"{field} is not valid Unicode text (a lone surrogate)")
    return token


def _id(value: Any, bound: int, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < bound:
        raise ValueError(f"{field} must be a whole number from 0 to {bound - 1:,}")
    return value


def _flag(value: Any, field: str) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{field} must be true or false")


def _no_constant(name: str) -> None:
    raise ValueError(f"the hf tokenizer's tokenizer.json holds {name}, which is not JSON")
