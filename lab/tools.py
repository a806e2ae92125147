"""The lab's tools as pure functions of their arguments: the API's stateless endpoints and, with
`python app.py --mcp`, the MCP server's tools (ui/tools.py wires them).

Every page endpoint acts on the caller's session (the text so far, the heads chosen); a script running a
hundred prompts, or an agent, has no session to manage. Each function here builds a throwaway
`lab.session.Session` on the shared model cache (the built-ins and the operator's models, found by name as
the page finds them: `Session.entry_for`), calls the same verbs the page's endpoints call, reads the numbers
with the same read-outs (lab.export, lab.heads, lab.inside, lab.sweeps), and closes the session: nothing is
kept between calls, so the same arguments give the same numbers, and they are the page's numbers.

The text a tool reads is the prompt alone, nothing sampled: what the page holds after Step then Undo (the
tools take exactly those two verbs to set it up). `generate_tool` is the page's Generate on a new text, with the
seed given. While a call runs its session holds memory from `client`'s share of the server's budget
(lab.server.budget), as a person's session does; the rate and queue shares are the wiring's (ui/door.py).

The Circuits view's methods are tools too (`dla_tool`, `composition_tool`, `head_circuits_tool`, `atp_tool`):
each calls the throwaway session's `circuits` part (lab.circuits), so the server's limits on the long jobs
(composition's and attribution patching's GFLOP and memory, checked before any work) hold for a tool as for
the page, and the composition scores come from, and go into, the one cache of the server the page reads
(lab.circuits_records.COMPOSITION). Each answer holds the page's record's JSON (/dla, /composition,
/circuits, /atp) with a few plain additions.

Units: probabilities are in [0, 1]; KL divergences in bits; attention weights are softmax shares (a row sums
to 1); scores are the logits before the softmax (q·k scaled, as the model computes them); direct logit
attribution and the OV circuit's entries are in logits; composition and copying scores are ratios without a
unit (composition 0 to 1, copying -1 to 1); positions count tokens of the window from 0; layers and heads
count from 0 and heads are named as on the page ("L1H0").
A refusal is a `UserError` whose text is one sentence, as everywhere in the lab.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import numpy as np

from model.circuits import CompositionScores
from model.generate import Sampling

from . import export
from .catalogue.models import DEFAULT_MODEL
from .checks import UserError, check_choice, check_int, check_sampling
from .circuits_records import KIND_NAMES, TOP_PAIRS, json_number
from .export import MAX_TOP
from .heads import LENS_TOP, head_label
from .session import Session

__all__ = ["TOOLS", "scratch", "on_prompt", "models_tool", "generate_tool", "attention_tool", "head_roles_tool",
           "logit_lens_tool", "ablate_tool", "inside_cell_tool", "patch_tool", "dla_tool", "composition_tool",
           "head_circuits_tool", "atp_tool", "CONTINUATION_TOKENS", "ATP_TOOL_TOP", "MAX_PAIRS"]

PROMPT_STEP = Sampling(temperature=0.0, top_k=0, top_p=1.0, seed=0)  # the Step a prompt's text is set up with
CONTINUATION_TOKENS = 24  # tokens each continuation of `ablate_tool` runs by default (the page's Regenerate)
ATP_TOOL_TOP = 5  # cells `atp_tool` re-runs exactly by default (fewer than the page's 10: a call waits for them)
MAX_PAIRS = 1000  # the most head pairs `composition_tool` lists (top=0 answers the whole matrix instead)


@contextlib.contextmanager
def scratch(client: str | None = None) -> Iterator[Session]:
    """A throwaway session counted against `client`'s share of the server's memory, closed when the call
    ends (its text and anything it held go back to the budget, whatever happened)."""
    session = Session()
    session.client = client  # the address its memory counts against (lab.server.rates.client_of)
    try:
        yield session
    finally:
        session.close()


@contextlib.contextmanager
def on_prompt(model: str, prompt: str, client: str | None = None) -> Iterator[Session]:
    """A throwaway session whose text is the prompt alone: the page's Step (greedy) then Undo."""
    with scratch(client) as session:
        session.step(model, prompt, PROMPT_STEP)
        session.undo()
        yield session


def _text(session: Session) -> dict:
    """What every answer about a text starts with: its model, tokens, ids and where the window starts."""
    d = session.decoder
    return {"model": session.entry.name, "tokens": [p for p, _ in session.tokens()], "token_ids": list(d.window),
            "text_offset": int(d.start), "notices": list(session.notices)}


def models_tool() -> dict:
    """The models a tool may name: the built-ins and those the person running the app added."""
    session = Session()
    return {"models": session.model_names(), "default": DEFAULT_MODEL}


def generate_tool(model: str, prompt: str, max_new_tokens=20, temperature=1.0, top_k=0, top_p=1.0, seed=0, *,
                  client: str | None = None) -> dict:
    """The page's Generate on a new text: up to `max_new_tokens` tokens sampled after the prompt with these
    settings and seed (temperature 0: greedy). Each generated token comes with `probability`, the model's
    softmax for it, and `sampled_probability`, its share of the distribution it was drawn from (after
    temperature, top-k and top-p)."""
    sampling = check_sampling(temperature, top_k, top_p, seed)
    with scratch(client) as session:
        for _ in session.generate(model, prompt, sampling, max_new_tokens):
            pass
        d = session.decoder
        piece = session.entry.tokenizer.piece
        generated = [{"position": d.prompt_len + j, "token_id": int(s.token_id), "piece": s.piece,
                      "probability": float(s.probs[s.token_id]), "sampled_probability": float(s.adjusted[s.token_id])}
                     for j, s in enumerate(session.drawn)]
        return {"model": session.entry.name, "prompt_tokens": [piece(i) for i in d.ids[:d.prompt_len]],
                "prompt_token_ids": list(d.ids[:d.prompt_len]), "generated": generated,
                "text": session.generated_text(), "ended": bool(generated) and session.last_step.eos,
                "sampling": {"temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p,
                             "seed": sampling.seed},
                "notices": list(session.notices)}


def attention_tool(model: str, prompt: str, layer, head=None, *, client: str | None = None) -> dict:
    """One head's attention on the prompt (`head` None: every head of `layer`), as the Explore figure draws
    it: `weights[h][query][key]`, the softmax shares, and `scores[h][query][key]`, the logits before the
    softmax; null where the causal mask hides a key after its query. `heads` names the h of each matrix."""
    with on_prompt(model, prompt, client) as session:
        weights = export.attention(session, layer, head, "weights").json
        scores = export.attention(session, layer, head, "scores").json
        return {**_text(session), "layer": weights["layer"], "heads": weights["heads"], "causal": weights["causal"],
                "masked": weights["masked"], "weights": weights["values"], "scores": scores["values"]}


def head_roles_tool(model: str, prompt: str, *, client: str | None = None) -> dict:
    """Every head's role scores on the prompt (the page's /head_roles table at full precision): one row per
    head with `columns`, each score's formula, threshold and meaning, and the role each head passes most
    clearly ("" for none)."""
    with on_prompt(model, prompt, client) as session:
        data = export.head_roles(session).json
        return {**_text(session), **{k: data[k] for k in ("columns", "rows", "roles", "thresholds", "formulas")}}


def logit_lens_tool(model: str, prompt: str, position=None, top=LENS_TOP, *, client: str | None = None) -> dict:
    """What the model would predict after the token at `position` (None: the last) if it stopped after each
    layer: the `top` most probable next tokens read out after the embedding and after every layer (the
    last stage is the model's own prediction), rows of (stage, rank, token_id, piece, probability)."""
    top = check_int("top", top, 1, MAX_TOP)
    with on_prompt(model, prompt, client) as session:
        data = export.lens_export(session, position, top).json
        return {**_text(session), **{k: data[k] for k in ("index", "token", "top", "stages", "columns", "rows")}}


def ablate_tool(model: str, prompt: str, heads, mode="zero", keep_only=False, position=None,
                tokens=CONTINUATION_TOKENS, temperature=0.0, top_k=0, top_p=1.0, seed=0, *,
                client: str | None = None) -> dict:
    """Ablate `heads` (labels such as "L1H0"; `mode` "zero", "mean" or "uniform"; with `keep_only`, every
    other head) on the prompt, as the page's head tools do. `effect`: the next-token distribution after
    `position` (None: the last token) without and with the ablation, KL(before ‖ after) in bits and the top
    candidates' probabilities and ranks before and after (the page's /ablate). `regeneration`: the prompt
    continued `tokens` tokens twice with the same sampling and seed, plainly and ablated, and the index of
    the first generated token where they differ (None: they agree; the page's /regenerate)."""
    sampling = check_sampling(temperature, top_k, top_p, seed)
    if heads in (None, []) and keep_only is False:  # the page's "no ablation": nothing to compare
        raise UserError("Name at least one head to ablate, such as L1H0.")
    with on_prompt(model, prompt, client) as session:
        session.heads.set_ablation(heads, mode, keep_only)
        e = session.heads.effect(position)
        r = session.heads.regenerate(sampling, tokens)
        return {**_text(session), "ablated": [head_label(*h) for h in session.heads.ablated()],
                "mode": session.heads.settings.mode, "keep_only": session.heads.settings.keep_only,
                "effect": {"what": e.what, "index": e.index, "token": e.token, "kl_bits": e.kl_bits,
                           "moves": [vars(m) for m in e.moves]},
                "regeneration": {"normal": r.normal, "changed": r.changed, "first_difference": r.first_difference,
                                 "what": r.what}}


def inside_cell_tool(model: str, prompt: str, layer, head, query=None, key=None, *,
                     client: str | None = None) -> dict:
    """One attention cell of the prompt worked through (the page's Inside one cell, /inside): every number
    from the head's input at `query` and `key` (window positions; None: the last token as the query and,
    as the key, the one it gives the largest share) to what the head adds to the residual stream, each
    with its formula."""
    with on_prompt(model, prompt, client) as session:
        return session.inside.cell(layer, head, query, key)


def patch_tool(model: str, prompt_a: str, prompt_b: str, answer, other=None, kind="heads", direction="denoising",
               metric="logit_diff", *, client: str | None = None) -> dict:
    """Activation patching between two prompts of the same length (the page's /patch): for every layer ×
    head (`kind` "heads") or layer × position ("resid", "attn", "mlp"), the share of the A→B difference in
    the metric (logit of `answer` minus logit of `other` at the last position, or with `metric` "prob" the
    probability of `answer`) that patching that one activation restores ("denoising": B's run with A's
    activation) or makes ("noising": A's run with B's)."""
    with scratch(client) as session:
        return session.sweeps.run(model, prompt_a, prompt_b, metric, answer, other, kind, direction).to_json()


# ------------------------------------------------------------------------------- the Circuits view's methods


def _blank(value):
    """An answer box left empty is no answer, as on the page (ui/circuits.py's `_optional`)."""
    return None if value is None or (isinstance(value, str) and not value.strip()) else value


def _ids(session: Session) -> dict:
    """What a Circuits answer adds to the page's record: the prompt's token ids and the text's notices."""
    return {"token_ids": list(session.decoder.window), "notices": list(session.notices)}


def dla_tool(model: str, prompt: str, position=None, answer=None, other=None, *, client: str | None = None) -> dict:
    """Direct logit attribution on the prompt (the page's /dla): at window position `position` (None: the last
    token), how much of logit(answer) − logit(other) each head, each MLP and the embedding write straight into
    the read-out, in logits (`answer` None: the model's own top prediction there; `other` None: the answer's
    logit alone). `direct_sum` + `remainder` (the biases and what the final norm's frozen scale leaves) equals
    `actual`, the value the model reads out; `metric_is` names it."""
    with on_prompt(model, prompt, client) as session:
        record = session.circuits.dla(position, _blank(answer), _blank(other))
        return {**record.to_json(), **_ids(session), "label": record.label, "units": "logits"}


def _pairs(record, kind: str, n: int) -> list[dict]:
    """The `n` strongest pairs of one kind, strongest first: the engine's ranking, of which the page's record
    lists the first TOP_PAIRS."""
    scores = CompositionScores(record.q, record.k, record.v, record.folded, record.done, record.total,
                               record.stopped)
    return [{"earlier": head_label(a, b), "later": head_label(c, d), "score": s}
            for a, b, c, d, s in scores.top(kind, n)]


def composition_tool(model: str, kind="k", top=TOP_PAIRS, *, client: str | None = None) -> dict:
    """The model's head composition scores of one `kind` ("q", "k" or "v": what of the later head's queries,
    keys or values the earlier head writes, ||W_OV W|| / (||W_OV|| ||W||), 0 to 1) and every head's OV copying
    score (-1 to 1), as the page's /composition has them. `top` > 0: the `top` strongest pairs of heads in
    different layers, strongest first; `top` 0: the whole matrix instead, scores[earlier layer][earlier head]
    [later layer][later head] (null where the later layer is not after the earlier one). The scores are a
    model's, computed once and kept for everyone (`cached`: read from the server's cache), under the page's
    limits of work and memory."""
    kind = check_choice("kind", kind, KIND_NAMES)
    top = check_int("top", top, 0, MAX_PAIRS)
    with scratch(client) as session:
        record = session.circuits.composition(model)
        data = record.to_json()
        return {"what": data["what"], "model": record.model, "folded": record.folded, "kind": kind,
                "kind_is": KIND_NAMES[kind], "index_order": data["index_order"],
                "pairs": _pairs(record, kind, top) if top else [], "scores": None if top else data[kind],
                "copying": data["copying"], "done": record.done, "total": record.total, "stopped": record.stopped,
                "cached": record.cached, "summary": data["summary"]}


def _spectrum(eigenvalues: np.ndarray) -> dict:
    """The OV circuit's spectrum in a few numbers (its copying score is sum_real / sum_abs)."""
    lam = np.asarray(eigenvalues)
    biggest = int(np.argmax(np.abs(lam))) if lam.size else None
    return {"count": int(lam.size), "positive_real": int((lam.real > 0).sum()),
            "sum_real": json_number(lam.real.sum()), "sum_abs": json_number(np.abs(lam).sum()),
            "largest_abs": None if biggest is None else json_number(abs(lam[biggest])),
            "largest_real": None if biggest is None else json_number(lam[biggest].real),
            "largest_imag": None if biggest is None else json_number(lam[biggest].imag)}


def head_circuits_tool(model: str, prompt: str, layer, head, *, client: str | None = None) -> dict:
    """One head's OV and QK circuits on the prompt's tokens (the page's /circuits): the OV circuit's copying
    score (Σ Re λ / Σ |λ| over its eigenvalues, -1 to 1) and spectrum (`eigenvalues_*`, and `spectrum` in a
    few numbers), the tokens it writes most (in logits) for each distinct token of the prompt, and the QK
    circuit's bilinear scores between the prompt's tokens (logits before the softmax, without and with their
    positions; `qk_allowed`: the keys the mask lets each query read)."""
    with on_prompt(model, prompt, client) as session:
        record = session.circuits.circuits(layer, head)
        return {**record.to_json(), **_ids(session), "spectrum": _spectrum(record.eigenvalues)}


def atp_tool(model: str, prompt_a: str, prompt_b: str, answer, other=None, kind="heads", direction="denoising",
             k=ATP_TOOL_TOP, metric="logit_diff", *, client: str | None = None) -> dict:
    """Attribution patching beside exact patching (the page's /atp): the first-order estimate of every cell of
    the patching sweep `kind` from one backward pass, the `k` cells of largest estimate re-run exactly, and the
    exact sweep of every cell when it is within the server's limit (`exact_mode` "sweep", else "top-k"), each
    as a change of the metric (logit difference in logits, or probability) and as a share of the A→B
    difference; `disagree` flags where the estimate is off."""
    with scratch(client) as session:
        return session.circuits.atp(model, prompt_a, prompt_b, metric, answer, _blank(other), kind, direction,
                                    k).to_json()


# The tools by the names the MCP server gives them (ui/tools.py serves each as /tool_<name>).
TOOLS = {"models": models_tool, "generate": generate_tool, "attention": attention_tool, "head_roles": head_roles_tool,
         "logit_lens": logit_lens_tool, "ablate": ablate_tool, "inside_cell": inside_cell_tool, "patch": patch_tool,
         "dla": dla_tool, "composition": composition_tool, "head_circuits": head_circuits_tool, "atp": atp_tool}
