"""Building a corpus from hostile training text: seconds per build and longest time without a Stop check.

An independent fuzz of the Train tab once found a BPE tokenizer trained on 320,000 identical
characters holding the one training slot for 40 s, and 1.2 MB of "abab…" for 1,044 s with Stop
doing nothing. `model.corpora.build_corpus` now refuses hopeless text before any tokenizer trains,
learns BPE merges on a bounded sample and encodes the text in parts, asking its `should_stop`
between every two steps. tests/engine/test_corpus_bounds.py holds those step sizes and check counts; this
measures what they cost in time: for each text in `TEXTS` and each tokenizer kind, the median over
`--reps` builds of the whole build ("total_s"), the longest stretch between two `should_stop`
calls, build start and end included ("longest_gap_s": how long a Stop could wait), and the number
of checks; and the median time of `check_trainable` on the same text (the check every build starts
with, which refuses what cannot build).

    python -m bench.corpus_build [--reps 3] [--kinds char,word,bpe]
"""

from __future__ import annotations

import random
import statistics
import string
import time

from bench.common import emit, parser
from model.corpora import MAX_TEXT_CHARS, build_corpus, check_trainable

_rng = random.Random(0)
TEXTS = {
    "320,000 identical characters": "a" * 320_000,
    "1.2 MB of abab": "ab" * (MAX_TEXT_CHARS // 2),
    "1.2 MB of random letters without spaces": "".join(_rng.choices(string.ascii_letters, k=MAX_TEXT_CHARS)),
    "1.2 MB of one repeated word": "hello " * (MAX_TEXT_CHARS // 6),
    "only 2 distinct characters": "a " * (MAX_TEXT_CHARS // 2),
    "1.2 MB of punctuation and digits": "".join(_rng.choices(string.punctuation + string.digits, k=MAX_TEXT_CHARS)),
}
# The texts the word tokenizer refuses (they have no word boundaries)
NO_WORDS = {"320,000 identical characters", "1.2 MB of abab", "1.2 MB of random letters without spaces"}


def timed_build(text: str, kind: str) -> tuple[str, float, float, int]:
    """("built" or "refused", total seconds, longest seconds between two should_stop calls, checks)."""
    marks = [time.perf_counter()]

    def should_stop() -> bool:
        marks.append(time.perf_counter())
        return False

    try:
        build_corpus("text", kind, text=text, should_stop=should_stop)
        outcome = "built"
    except ValueError:
        outcome = "refused"
    marks.append(time.perf_counter())
    return outcome, marks[-1] - marks[0], max(b - a for a, b in zip(marks, marks[1:])), len(marks) - 2


def timed_check(text: str, kind: str) -> float:
    t0 = time.perf_counter()
    try:
        check_trainable(text, kind)
    except ValueError:
        pass
    return time.perf_counter() - t0


def main() -> None:
    p = parser("corpus_build", __doc__)
    p.add_argument("--reps", type=int, default=3, help="builds per text and tokenizer (the median is reported)")
    p.add_argument("--kinds", default="char,word,bpe", help="comma-separated tokenizer kinds")
    args = p.parse_args()
    for name, text in TEXTS.items():
        for kind in args.kinds.split(","):
            runs = [timed_build(text, kind) for _ in range(args.reps)]
            checks = [timed_check(text, kind) for _ in range(args.reps)]
            emit("corpus_build", text=name, chars=len(text), kind=kind, outcome=runs[0][0], reps=args.reps,
                 total_s=round(statistics.median(r[1] for r in runs), 3),
                 longest_gap_s=round(statistics.median(r[2] for r in runs), 3),
                 max_longest_gap_s=round(max(r[2] for r in runs), 3), checks=runs[0][3],
                 check_trainable_s=round(statistics.median(checks), 4))


if __name__ == "__main__":
    main()
