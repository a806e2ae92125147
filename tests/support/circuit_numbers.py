"""The page's numbers for the Circuits view's stateless tools (dla, composition, head_circuits, atp), through the
page's own endpoints (/dla, /composition, /circuits, /atp with gradio_client), and the checks that a tool's
answer holds them (tests/api/test_tools_circuits_api.py over the API, tests/api/test_mcp_circuits.py over MCP).

Each check takes a fresh `Client` (a session of its own) and does what a person does: for the methods that read a
text, Step the prompt greedily then Undo it (the prompt alone, as the tools read it), then ask the Circuits
endpoint; composition and attribution patching name their model and prompts themselves. A tool's answer is the
page's record with a few keys added, so every key of the page's answer must be in the tool's with the same value.
"""

from __future__ import annotations

from gradio_client import Client

from tests.support.page_numbers import A, B, GRAMMAR, P, prompt_text


def same_as_page(got: dict, page: dict) -> None:
    """Every number and word of the page's answer is the tool's (the tool only adds keys)."""
    missing = [k for k in page if k not in got]
    assert not missing, f"the tool's answer lacks {missing}"
    differ = [k for k in page if got[k] != page[k]]
    assert not differ, f"the tool's answer differs from the page's at {differ}"


def check_dla(c: Client, got: dict, model, prompt, position, answer, other) -> None:
    prompt_text(c, model, prompt)
    page = c.predict(answer, other, position, api_name="/dla")
    same_as_page(got, page)
    assert got["label"] == page["metric_is"] and got["units"] == "logits"
    assert abs(got["direct_sum"] + got["remainder"] - got["actual"]) < 1e-4


def check_composition(c: Client, got: dict, model, kind, top) -> None:
    page = c.predict(model, api_name="/composition")
    assert got["copying"] == page["copying"] and got["model"] == page["model"] and got["kind"] == kind
    if top:
        assert got["scores"] is None and got["pairs"] == page["top"][kind][:top]
    else:
        assert got["pairs"] == [] and got["scores"] == page[kind]


def check_head_circuits(c: Client, got: dict, model, prompt, layer, head) -> None:
    prompt_text(c, model, prompt)
    page = c.predict(layer, head, api_name="/circuits")
    same_as_page(got, page)
    spectrum = got["spectrum"]
    assert spectrum["count"] == len(page["eigenvalues_real"])
    assert abs(spectrum["sum_real"] / spectrum["sum_abs"] - page["copying"]) < 1e-9


def check_atp(c: Client, got: dict, model, a, b, answer, other, kind, direction, k) -> None:
    page = c.predict(model, a, b, "logit_diff", answer, other, kind, direction, k, api_name="/atp")
    assert got == page
    assert len(got["verified"]) == k and got["exact_mode"] == "sweep"


# one call of every Circuits tool: its arguments by name, and the check of its answer against the page
CIRCUIT_CALLS = {
    "dla": (dict(model=GRAMMAR, prompt=P, position=None, answer=" tom", other=" anna"),
            lambda c, got: check_dla(c, got, GRAMMAR, P, None, " tom", " anna")),
    "composition": (dict(model=GRAMMAR, kind="v", top=6),
                    lambda c, got: check_composition(c, got, GRAMMAR, "v", 6)),
    "head_circuits": (dict(model=GRAMMAR, prompt=P, layer=1, head=2),
                      lambda c, got: check_head_circuits(c, got, GRAMMAR, P, 1, 2)),
    "atp": (dict(model=GRAMMAR, prompt_a=A, prompt_b=B, answer=" she", other=" he", kind="heads",
                 direction="denoising", k=4),
            lambda c, got: check_atp(c, got, GRAMMAR, A, B, " she", " he", "heads", "denoising", 4)),
}
