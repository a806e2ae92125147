"""The page's numbers for the stateless tools' arguments, through the page's own endpoints (gradio_client), and
the checks that a tool's answer holds them (tests/api/test_tools_api.py over the API, tests/api/test_mcp.py over
MCP).

Each page function takes a fresh `Client` (a session of its own) and does what a person does: Step the prompt
greedily then Undo it (the prompt alone, as the tools read it), then ask the head tools, Inside one cell, the
numbers download; or Generate on a new text, or a patching sweep. Each `check_*` compares one tool's answer
with the page's numbers for the same arguments.
"""

from __future__ import annotations

import json
from pathlib import Path

from gradio_client import Client

GRAMMAR = "grammar (built-in)"
P = "anna found the key . she gave it to tom because he"
A = "anna found the key . she gave it to tom because he asked"
B = "tom found the key . he gave it to anna because she asked"


def prompt_text(c: Client, model: str, prompt: str) -> None:
    """The page's text of the prompt alone: Step (greedy), then Undo."""
    c.predict(model, prompt, 0.0, 0, 1.0, 0, 0, "all", "weights", api_name="/step")
    c.predict(0, "all", "weights", api_name="/undo")


def download(c: Client, what: str, model: str, layer=0, head="all") -> dict:
    return json.loads(Path(c.predict(what, "json", model, layer, head, api_name="/export_numbers")).read_text())


def check_generate(c: Client, got: dict, model, prompt, n, temperature, top_k, top_p, seed) -> None:
    tokens = c.predict(model, prompt, temperature, top_k, top_p, seed, n, 0, "all", "weights",
                       api_name="/generate")[0]
    assert [g["piece"] for g in got["generated"]] == [t["token"] for t in tokens
                                                      if t["class_or_confidence"] == "generated"]
    last = download(c, "probabilities", model)  # what the last token was drawn from
    chosen = next(row for row in last["rows"] if row[-1])
    assert (got["generated"][-1]["token_id"], got["generated"][-1]["probability"],
            got["generated"][-1]["sampled_probability"]) == (chosen[1], chosen[3], chosen[4])


def check_attention(c: Client, got: dict, model, prompt, layer, head) -> None:
    prompt_text(c, model, prompt)
    weights, scores = download(c, "weights", model, layer, head), download(c, "scores", model, layer, head)
    assert got["tokens"] == weights["tokens"] and got["heads"] == weights["heads"] == [head]
    assert got["weights"] == weights["values"] and got["scores"] == scores["values"]


def check_head_roles(c: Client, got: dict, model, prompt) -> None:
    prompt_text(c, model, prompt)
    page = c.predict(api_name="/head_roles")
    assert got["columns"] == page["columns"] and got["thresholds"] == page["thresholds"]
    rounded = [[round(v, 4) if isinstance(v, float) else v for v in row] for row in got["rows"]]
    assert rounded == page["data"]


def check_logit_lens(c: Client, got: dict, model, prompt, position) -> None:
    prompt_text(c, model, prompt)
    page = c.predict(position, api_name="/logit_lens")[1]
    assert (got["index"], got["token"]) == (page["index"], page["token"])
    assert [[s, r, piece, round(p, 6)] for s, r, _, piece, p in got["rows"]] == page["data"]


def check_ablate(c: Client, got: dict, model, prompt, heads, mode, n) -> None:
    prompt_text(c, model, prompt)
    effect = c.predict(heads, mode, False, 0, 0, api_name="/ablate")[3]
    regeneration = c.predict(0.0, 0, 1.0, 0, n, api_name="/regenerate")[1]
    assert {"active": True, **got["effect"]} == effect and got["regeneration"] == regeneration


def check_inside_cell(c: Client, got: dict, model, prompt, layer, head, query, key) -> None:
    prompt_text(c, model, prompt)
    assert got == c.predict(layer, head, query, key, api_name="/inside")


def check_patch(c: Client, got: dict, model, a, b, answer, other, kind, direction) -> None:
    assert got == c.predict(model, a, b, "logit_diff", answer, other, kind, direction, api_name="/patch")


# one call of every tool: its arguments by name, and the check of its answer against the page
CALLS = {
    "models": ({}, None),
    "generate": (dict(model=GRAMMAR, prompt=P, max_new_tokens=6, temperature=0.9, top_k=0, top_p=1.0, seed=5),
                 lambda c, got: check_generate(c, got, GRAMMAR, P, 6, 0.9, 0, 1.0, 5)),
    "attention": (dict(model=GRAMMAR, prompt=P, layer=1, head=2),
                  lambda c, got: check_attention(c, got, GRAMMAR, P, 1, 2)),
    "head_roles": (dict(model=GRAMMAR, prompt=P), lambda c, got: check_head_roles(c, got, GRAMMAR, P)),
    "logit_lens": (dict(model=GRAMMAR, prompt=P, position=9, top=5),
                   lambda c, got: check_logit_lens(c, got, GRAMMAR, P, 9)),
    "ablate": (dict(model=GRAMMAR, prompt=P, heads=["L1H1", "L2H2"], mode="zero", tokens=8),
               lambda c, got: check_ablate(c, got, GRAMMAR, P, ["L1H1", "L2H2"], "zero", 8)),
    "inside_cell": (dict(model=GRAMMAR, prompt=P, layer=2, head=1, query=11, key=5),
                    lambda c, got: check_inside_cell(c, got, GRAMMAR, P, 2, 1, 11, 5)),
    "patch": (dict(model=GRAMMAR, prompt_a=A, prompt_b=B, answer=" she", other=" he", kind="heads",
                   direction="denoising"),
              lambda c, got: check_patch(c, got, GRAMMAR, A, B, " she", " he", "heads", "denoising")),
}
