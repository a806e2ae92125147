"""Corpora: the registry, the toy/task/grammar corpora, user text, and batches."""

import pytest
import torch

from model.corpora import (
    COPY_LEN,
    CORPUS_NAMES,
    FEMALE_NAMES,
    IGNORE_INDEX,
    MALE_NAMES,
    PRESENT_VERBS,
    SORT_LEN,
    Corpus,
    Split,
    build_corpus,
    grammar_text,
    read_text_file,
    sort_examples,
)
from model.tokenizers import normalise


@pytest.fixture(scope="module")
def sort0() -> Corpus:
    return build_corpus("sort", seed=0)


@pytest.fixture(scope="module")
def copy0() -> Corpus:
    return build_corpus("copy", seed=0)


@pytest.fixture(scope="module")
def grammar0() -> Corpus:
    return build_corpus("grammar", seed=0)


def rows(c: Corpus, split: Split) -> list[str]:
    return [c.tokenizer.decode(r.tolist()) for r in split.x]


def user_text(n_lines: int = 60) -> str:
    return "".join(f"Line {i}: the cat sat on mat number {i * 7 % 13}.\n" for i in range(n_lines))


# ---------------------------------------------------------------- registry


def test_names_and_unknown_names():
    assert CORPUS_NAMES == ("toy", "sort", "copy", "grammar", "text")
    with pytest.raises(ValueError, match="toy"):
        build_corpus("nope")
    with pytest.raises(ValueError, match="char"):
        build_corpus("grammar", tokenizer_kind="sentencepiece")


# ---------------------------------------------------------------- toy


def test_toy_corpus_matches_article_001():
    c = build_corpus("toy", tokenizer_kind="char")  # kind is ignored for toy
    assert c.kind == "examples" and c.tokenizer.kind == "word"
    assert c.tokenizer.unk_id == 7
    assert c.train.x.tolist() == [[0, 1, 2, 3, 4, 6, 5], [2, 3, 4, 1, 0, 6, 5]]
    assert c.train.y.tolist() == [[1, 2, 3, 4, 6, 5, 6], [3, 4, 1, 0, 6, 5, 6]]
    assert torch.equal(c.val.x, c.train.x) and torch.equal(c.val.y, c.train.y)
    assert c.sample_prompts == ["how is living in amsterdam <EOS>", "living in amsterdam is how <EOS>"]


# ---------------------------------------------------------------- sort / copy


def test_sort_examples_function():
    ex = sort_examples(50, seed=3)
    assert ex == sort_examples(50, seed=3)
    for s in ex:
        left, right = s.split("=")
        assert len(left) == SORT_LEN and right == "".join(sorted(left))


def test_sort_targets_and_mask(sort0):
    c = sort0
    eos = c.tokenizer.eos_id
    assert c.kind == "examples" and len(c.train) == 20_000 and len(c.val) >= 200
    assert c.tokenizer.vocab == ["<unk>", *"0123456789", "=", "<EOS>"] and eos == 12
    L = 2 * SORT_LEN + 1  # digits, '=', sorted digits, <EOS>; x lacks the last token
    assert c.train.x.shape == (20_000, L)
    for split in (c.train, c.val):
        x, y = split.x, split.y
        assert (y[:, :SORT_LEN] == IGNORE_INDEX).all()
        assert (y[:, SORT_LEN:] != IGNORE_INDEX).all()  # the loss covers the answer and the end token
        # unmasked targets are the next input tokens, and every example ends with <EOS>
        assert torch.equal(y[:, SORT_LEN:-1], x[:, SORT_LEN + 1 :])
        assert (y[:, -1] == eos).all() and not (x == eos).any()
    for s in rows(c, c.val)[:300]:
        left, right = s.split("=")
        assert right == "".join(sorted(left))  # x holds the whole answer; only <EOS> is a target alone
    for xr, yr in zip(c.train.x[:300].tolist(), c.train.y[:300].tolist()):
        digits = c.tokenizer.decode(xr[:SORT_LEN])
        assert c.tokenizer.decode(yr[SORT_LEN:]) == "".join(sorted(digits)) + "<EOS>"
    assert all(p.endswith("=") and len(p) == SORT_LEN + 1 for p in c.sample_prompts)


def test_copy_second_half_equals_first(copy0):
    c = copy0
    eos = c.tokenizer.eos_id
    assert c.tokenizer.vocab[-1] == "<EOS>" and eos == c.tokenizer.vocab_size - 1
    assert c.train.x.shape == (20_000, 2 * COPY_LEN + 1)
    for xr, yr in zip(c.train.x[:500].tolist(), c.train.y[:500].tolist()):
        first = c.tokenizer.decode(xr[:COPY_LEN])
        assert c.tokenizer.decode(xr[COPY_LEN : COPY_LEN + 1]) == "|"
        assert all(t == IGNORE_INDEX for t in yr[:COPY_LEN])
        assert c.tokenizer.decode(yr[COPY_LEN:]) == first + "<EOS>" and yr[-1] == eos
    assert all(p.endswith("|") and len(p) == COPY_LEN + 1 for p in c.sample_prompts)


def test_task_tokenizers_keep_eos_as_one_token(sort0, copy0):
    from model.tokenizers import tokenizer_from_dict

    for c, text in ((sort0, "503124=012345<EOS>"), (copy0, "abc|abc<EOS>")):
        tok = c.tokenizer
        ids = tok.encode(text)
        assert len(ids) == len(text) - len("<EOS>") + 1 and ids[-1] == tok.eos_id
        assert tok.decode(ids) == text and tok.piece(tok.eos_id) == "<EOS>"
        assert tok.encode_verbose("<EOS").unknown == ["<", "E", "O", "S"]  # a broken tag is characters
        again = tokenizer_from_dict(tok.to_dict())  # checkpoints carry it; the loader accepts it
        assert again == tok and again.eos_id == tok.eos_id
    trained = build_corpus("text", text=user_text() + "<EOS>").tokenizer  # text training never adds it
    assert trained.eos_id is None and "<" in trained.vocab


@pytest.mark.parametrize("fixture", ["sort0", "copy0"])
def test_train_val_disjoint(fixture, request):
    c = request.getfixturevalue(fixture)
    train = {tuple(r) for r in torch.cat([c.train.x, c.train.y[:, -1:]], 1).tolist()}
    val = [tuple(r) for r in torch.cat([c.val.x, c.val.y[:, -1:]], 1).tolist()]
    assert len(set(val)) == len(val) >= 200
    assert not train.intersection(val)


def test_task_determinism(sort0):
    again = build_corpus("sort", seed=0)
    assert torch.equal(again.train.x, sort0.train.x) and torch.equal(again.val.y, sort0.val.y)
    other = build_corpus("sort", seed=1)
    assert not torch.equal(other.train.x, sort0.train.x)


# ---------------------------------------------------------------- grammar

SUBJ = {"she": "f", "he": "m"}
GENDERED = {"she": "f", "her": "f", "he": "m", "him": "m", "his": "m"}
THIRD = set(PRESENT_VERBS.values()) | {"is"}
BASE = set(PRESENT_VERBS) | {"are"}


def gender(name: str) -> str:
    return "f" if name in FEMALE_NAMES else "m"


def check_story(line: str) -> None:
    names = set(FEMALE_NAMES) | set(MALE_NAMES)
    sentences = [s.split() for s in line.split(" .") if s.strip()]
    story_genders = {gender(w) for w in line.split() if w in names}
    prev_subject: str | None = None  # "f", "m" or "plural"
    for words in sentences:
        first = words[0]
        if first in names:
            subject = "plural" if words[1] == "and" else gender(first)
        else:
            expected = {"she": "f", "he": "m", "they": "plural"}[first]
            assert expected == prev_subject, line
            subject = expected
        prev_subject = subject
        for i, w in enumerate(words):
            if w in GENDERED:
                assert GENDERED[w] in story_genders, line
            if i + 1 < len(words) and words[i + 1] in THIRD | BASE:
                verb = words[i + 1]
                plural = w == "they" or (i >= 2 and words[i - 1] == "and" and words[i - 2] in names)
                if w in names or w in SUBJ or w == "they":
                    assert (verb in BASE) == plural, line


def test_grammar_agreement(grammar0):
    text = grammar_text(0)
    assert 200_000 <= len(text) <= 400_000
    lines = text.splitlines()
    assert len({l.split(" .")[0].split()[1] for l in lines}) > 3  # several templates
    for line in lines[:2000]:
        check_story(line)


def test_grammar_checker_catches_errors():
    with pytest.raises(AssertionError):
        check_story("anna found the key . he gave it to tom because he asked her .")
    with pytest.raises(AssertionError):
        check_story("anna likes tom . she like her red cup every day .")
    with pytest.raises(AssertionError):
        check_story("anna and tom went to the park . they sees the cup there .")


def test_grammar_corpus(grammar0):
    c = grammar0
    assert c.kind == "text" and c.tokenizer.kind == "word"
    assert c.train.y is None and c.train.x.dim() == 1
    n = len(c.train) + len(c.val)
    assert len(c.train) == int(0.9 * n)
    ids = torch.cat([c.train.x, c.val.x]).tolist()
    assert c.tokenizer.decode(ids) == normalise(grammar_text(0))
    assert all(c.tokenizer.encode_verbose(p).unknown == [] for p in c.sample_prompts)
    assert grammar_text(0) == grammar_text(0) != grammar_text(1)


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_grammar_other_tokenizers(kind):
    c = build_corpus("grammar", tokenizer_kind=kind, seed=2, bpe_vocab_size=200)
    assert c.tokenizer.kind == kind
    ids = torch.cat([c.train.x, c.val.x]).tolist()
    assert c.tokenizer.decode(ids) == grammar_text(2)


# ---------------------------------------------------------------- batches


def test_stream_batches_are_shifted_windows(grammar0):
    split = grammar0.train
    g = torch.Generator().manual_seed(0)
    x, y = split.get_batch(8, 32, g)
    assert x.shape == y.shape == (8, 32) and x.dtype == torch.long
    assert torch.equal(x[:, 1:], y[:, :-1])
    # a stream whose values are their positions makes windows easy to verify
    pos = Split(torch.arange(1000), None)
    px, py = pos.get_batch(64, 16, torch.Generator().manual_seed(3))
    assert torch.equal(px, px[:, :1] + torch.arange(16))
    assert torch.equal(py, px + 1)
    assert px.min() >= 0 and py.max() <= 999
    assert len(set(px[:, 0].tolist())) > 1
    x2, _ = split.get_batch(8, 32, torch.Generator().manual_seed(0))
    assert torch.equal(x, x2)


def test_stream_batch_block_clamped():
    s = Split(torch.arange(5), None)
    x, y = s.get_batch(4, 100, torch.Generator().manual_seed(1))
    assert x.shape == (4, 4)
    assert x.tolist()[0] == [0, 1, 2, 3] and y.tolist()[0] == [1, 2, 3, 4]


def test_example_batches(sort0):
    g = torch.Generator().manual_seed(0)
    x, y = sort0.train.get_batch(16, 100, g)
    assert x.shape == y.shape == (16, 2 * SORT_LEN + 1)
    x, y = sort0.train.get_batch(16, 5, g)
    assert x.shape == y.shape == (16, 5)
    assert (y == IGNORE_INDEX).all()


# ---------------------------------------------------------------- user text


def test_text_corpus_all_tokenizers():
    text = user_text()
    for kind in ("char", "word", "bpe"):
        c = build_corpus("text", tokenizer_kind=kind, text=text, bpe_vocab_size=100)
        assert c.kind == "text" and c.tokenizer.kind == kind
        assert len(c.train) == int(0.9 * (len(c.train) + len(c.val)))
        assert c.sample_prompts
        again = build_corpus("text", tokenizer_kind=kind, text=text, bpe_vocab_size=100)
        assert torch.equal(again.train.x, c.train.x)
    c = build_corpus("text", text=text)
    assert c.tokenizer.decode(torch.cat([c.train.x, c.val.x]).tolist()) == text


@pytest.mark.parametrize(
    "text, match",
    [(None, "needs text"), ("   \n ", "empty"), ("x" * 1000, "too short"), ("x" * 1_200_001, "too long")],
)
def test_text_validation(text, match):
    with pytest.raises(ValueError, match=match):
        build_corpus("text", text=text)


def test_read_text_file(tmp_path):
    ok = tmp_path / "ok.txt"
    ok.write_bytes("\ufeffhéllo wörld\r\nline two\n".encode("utf-8"))
    assert read_text_file(ok) == "héllo wörld\nline two\n"

    cases = {
        "binary.bin": (b"\x89PNG\r\n\x1a\n" + bytes(range(256)), "not UTF-8"),
        "latin1.txt": ("café crème".encode("latin-1"), "not UTF-8"),
        "nul.txt": (b"hello\x00world", "NUL"),
        "big.txt": (b"a" * 2001, "too large"),
    }
    for name, (data, match) in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(ValueError, match=match):
            read_text_file(path, max_bytes=2000)
    with pytest.raises(ValueError, match="too large"):
        read_text_file(tmp_path / "big.txt", max_bytes=2000)

    short = tmp_path / "short.txt"
    short.write_text("too short", encoding="utf-8")
    with pytest.raises(ValueError, match="too short"):
        build_corpus("text", text=read_text_file(short))
