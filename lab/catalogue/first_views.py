"""The evidence behind each built-in's first view: its head scores on its first example prompt.

Beside the captions it backs (`FirstView` in lab/catalogue/models.py, shown by lab/captions.py): when a built-in
is retrained or a caption rewritten, this prints the numbers to choose the view and word the caption by.

For each built-in this prints, layer × head, the scores of `model.heads` (previous-token,
first-token, self, induction, entropy) on the first example prompt as the app computes it (the
prompt's ids through `model.generate.Decoder`), then the same after a greedy answer (what the
attention shows after Generate; induction is undefined until a token repeats). For sort and copy
it adds the task-match score to the known ideal pattern, and for every model the evidence behind
the caption of its `FirstView` (lab/catalogue/models.py); tests/lab/test_first_views.py checks those claims.

    python -m lab.catalogue.first_views [--new 16]
    python -m lab.catalogue.first_views --model SRC      # a model added with `python app.py --model SRC`

With --model it prints, for a model of someone else's, what lab.catalogue.realmodels.choose_first_view chose its
first view by: every example's best head per role (and the word-start score of a character model), and the view.

A tool for whoever edits the captions, not part of the app: nothing imports it.
"""

from __future__ import annotations

import argparse

import numpy as np

from lab.catalogue.models import BUILTIN_MODELS, BUILTINS, encode_prompt
from model import heads
from model.generate import Decoder, Sampling, generate

GREEDY = Sampling(temperature=0.0)


def decode(name: str, prompt: str, new_tokens: int = 0):
    """The entry, the decoder after `new_tokens` greedy steps, and the window's token pieces."""
    entry = BUILTINS.get(name)
    ids, _ = encode_prompt(prompt, entry)
    d = Decoder(entry.model, ids, GREEDY, eos_id=entry.tokenizer.eos_id, piece=entry.tokenizer.piece)
    if new_tokens:
        for _ in generate(d, new_tokens, GREEDY):
            pass
    return entry, d, [entry.tokenizer.piece(i) for i in d.window]


def table(title: str, scores: np.ndarray) -> str:
    L, H = scores.shape
    lines = [f"  {title}", "           " + "".join(f"  head {h}" for h in range(H))]
    for layer in range(L):
        cells = "".join("     —  " if np.isnan(v) else f"  {v:6.3f}" for v in scores[layer])
        lines.append(f"    layer {layer}{cells}")
    return "\n".join(lines)


def print_scores(label: str, d: Decoder) -> dict[str, np.ndarray]:
    scores = heads.head_scores(d.attention, d.window)
    print(f" {label}")
    for key, values in scores.items():
        print(table(f"{heads.ROLES[key].name}: {heads.ROLES[key].formula}", values))
    roles = {key: heads.role_heads(scores, key) for key in heads.ROLE_ORDER}
    found = "; ".join(f"{heads.ROLES[k].name} {', '.join(f'L{li}H{h} {v:.2f}' for li, h, v in hs)}"
                      for k, hs in roles.items() if hs)
    print(f"  heads over their threshold: {found or 'none'}")
    return scores


def word_start_targets(pieces: list[str]) -> tuple[list[int], list[int]]:
    """Every non-separator character after the first space/line break, and the latest separator
    before it (the start of its word). Separators are the char tokenizer's pieces ␣ and ⏎."""
    seps = [i for i, p in enumerate(pieces) if p in ("␣", "⏎")]
    queries = [i for i, p in enumerate(pieces) if p not in ("␣", "⏎") and seps and seps[0] < i]
    keys = [max(s for s in seps if s < i) for i in queries]
    return queries, keys


def evidence(name: str, prompts: tuple[str, ...], new_tokens: int) -> None:
    view = BUILTIN_MODELS[name].first_view
    li, h = view.layer, view.head
    print(f" first view: layer {li}, head {h} — {view.caption}")
    _, d, t = decode(name, prompts[0])
    A = np.stack(d.attention)
    if name.startswith("grammar"):
        q, k = len(t) - 1 - t[::-1].index("he"), len(t) - 1 - t[::-1].index("tom")  # the last of each
        row = A[li, h, q]
        print(f"  query 'he' ({q}) → key 'tom' ({k}): {row[k]:.3f}; "
              f"row max {row.max():.3f} on {t[int(row.argmax())]!r}; "
              f"weight on 'tom' in every head of the row: max {A[:, :, q, k].max():.3f}")
    elif name.startswith("sort"):
        q, k = heads.ideal_keys_sort(t)
        row = A[li, h, q[0]]
        print(f"  '=' row: {row[k[0]]:.3f} on {t[k[0]]!r} (row max {row.max():.3f} on {t[int(row.argmax())]!r})")
        _, d2, t2 = decode(name, prompts[0], new_tokens)
        A2 = np.stack(d2.attention)
        q2, k2 = heads.ideal_keys_sort(t2)
        match = heads.task_match(A2, q2, k2)
        print(f"  after the greedy answer {''.join(t2)!r}:")
        print(table(f"sort match: {heads.MATCH_FORMULA}", match))
        hits = A2[li, h, q2].argmax(-1) == k2
        print(f"  answer rows of L{li}H{h} whose largest weight is on the next digit to write: "
              f"{hits.sum()} of {len(hits)}")
    elif name.startswith("copy"):
        q, k = heads.ideal_keys_copy(t)
        row = A[li, h, q[0]]
        print(f"  '|' row: {row[k[0]]:.3f} on {t[k[0]]!r} (row max {row.max():.3f} on {t[int(row.argmax())]!r})")
        _, d2, t2 = decode(name, prompts[0], new_tokens)
        A2 = np.stack(d2.attention)
        q2, k2 = heads.ideal_keys_copy(t2)
        print(f"  after the greedy answer {''.join(t2)!r}:")
        print(table(f"copy match: {heads.MATCH_FORMULA}", heads.task_match(A2, q2, k2)))
        ind = heads.induction(A2, d2.window)
        print(f"  induction of L{li}H{h}: {ind[li, h]:.4f} (max over heads {np.nanmax(ind):.4f})")
    elif name.startswith("article toy"):
        for p in prompts[:2]:
            _, dp, tp = decode(name, p)
            row = np.stack(dp.attention)[li, h, -1]
            print(f"  {p!r}: '<EOS>' row " + ", ".join(f"{tp[j]} {row[j]:.2f}" for j in range(len(tp))))
    elif name.startswith("shakespeare"):
        q, k = word_start_targets(t)
        w = A[:, :, q, k]
        print(table("mean weight of a character on the space/line break before its word", w.mean(-1)))
        print(f"  rows of L{li}H{h} whose largest weight is on that separator: "
              f"{int((A[li, h, q].argmax(-1) == np.array(k)).sum())} of {len(q)}")


def external(source: str) -> None:
    """An added model's examples, each role's best head on each, and the view `choose_first_view` chose from them."""
    import tempfile
    from pathlib import Path

    from lab.catalogue.external import ExternalModels, parse_source
    from lab.catalogue.realmodels import SHOWN, SHOWN_ROLES, example_scores

    with tempfile.TemporaryDirectory() as tmp:  # the app's record of hashes stays as it is
        found = ExternalModels([parse_source(source)], Path(tmp) / "hashes.json")
        entry = found.get(found.names[0])
    print(f"== {entry.summary}")
    for prompt, scores in zip(entry.examples, example_scores(entry)):
        print(f" example {prompt!r}")
        for key in SHOWN_ROLES:
            table = np.asarray(scores.get(key, np.nan), dtype=np.float64)
            if np.isfinite(table).any():
                layer, head = np.unravel_index(np.nanargmax(table), table.shape)
                print(f"  {SHOWN[key].name}: best L{layer}H{head} {table[layer, head]:.3f} "
                      f"(a role from {SHOWN[key].threshold:g})")
    fv = entry.first_view
    print(" first view: none" if fv is None else f" first view: layer {fv.layer}, head {fv.head} on the first "
          f"example — {fv.caption}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new", type=int, default=16, help="greedy tokens to add after the prompt")
    ap.add_argument("--model", metavar="SRC", help="a model as `python app.py --model SRC` takes it")
    args = ap.parse_args(argv)
    np.set_printoptions(precision=3, suppress=True)
    if args.model:
        external(args.model)
        return
    for name, builtin in BUILTIN_MODELS.items():
        prompt = builtin.examples[0]
        entry = BUILTINS.get(name)
        c = entry.cfg
        print(f"== {name}: {c.n_layers} layers × {c.n_heads} heads; first example {prompt!r}")
        _, d, t = decode(name, prompt)
        print_scores(f"prompt ({len(t)} tokens)", d)
        _, d, t = decode(name, prompt, args.new)
        new = t[d.prompt_len - d.start:]
        answer = " ".join(new) if entry.tokenizer.kind == "word" else "".join(new)
        print_scores(f"prompt + greedy answer {answer!r} ({len(t)} tokens)", d)
        if builtin.first_view is not None:
            evidence(name, builtin.examples, args.new)
        print()


if __name__ == "__main__":
    main()
