"""The Learn tab's section on pieces of words (BPE, ␣ and �) says what a real byte-level BPE tokenizer does,
held here to one trained with the tokenizers library as GPT-2's is (tests/support/families.py), read through
the app's own tokenizer class."""

from __future__ import annotations

from pathlib import Path

import pytest

from model.hf_tokenizer import HFFileTokenizer
from model.tokenizer_core import display_piece
from tests.support.families import write_tokenizer

LEARN = Path(__file__).resolve().parents[2] / "assets" / "learn.md"


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> HFFileTokenizer:
    folder = tmp_path_factory.mktemp("bpe")
    write_tokenizer(folder, 300)
    return HFFileTokenizer.from_folder(folder, False)


def section() -> str:
    text = LEARN.read_text(encoding="utf-8")
    start = text.index("### Pieces of words: BPE, ␣ and �")
    return text[start:text.index("## 2. Positional encoding")]


def test_the_section_is_in_the_learn_tab_before_the_next_one():
    s = section()
    for said in ("byte-pair encoding", "256", "50,257", "␣", "⏎", "⇥", "�", "▁", "Vocabulary", "section 18",
                 "Which words keep the token count"):
        assert said in s, said
    assert 50_257 == 256 + 50_000 + 1  # the vocabulary the section adds up


def test_a_space_belongs_to_the_word_and_shows_as_its_mark(tok):
    """" the" and "the" are two tokens; the spaced one is drawn ␣the; a line break and a tab get their marks."""
    spaced, bare = tok.encode(" the"), tok.encode("the")
    assert len(spaced) == 1 and tok.piece(spaced[0]) == "␣the"  # the space is part of the word's one token
    assert spaced[0] not in bare and "".join(tok.piece(i) for i in bare) == "the"  # another token, or pieces
    assert display_piece("\n") == "⏎" and display_piece("\t") == "⇥"


def test_a_character_of_several_bytes_is_pieces_shown_as_the_replacement_sign(tok):
    """é is two bytes; no merge covers it in this tokenizer, so it is two tokens, each shown as �, and the two
    decode to é again. A four-byte emoji likewise."""
    for char, n_bytes in (("é", 2), ("🙂", 4)):
        assert len(char.encode("utf-8")) == n_bytes
        ids = tok.encode(char)
        assert len(ids) == n_bytes and all(tok.piece(i) == "�" for i in ids)
        assert tok.decode(ids) == char
