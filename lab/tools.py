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

Units: probabilities are in [0, 1]; KL divergences in bits; attention weights are softmax shares (a row sums
to 1); scores are the logits before the softmax (q·k scaled, as the model computes them); positions count
tokens of the window from 0; layers and heads count from 0 and heads are named as on the page ("L1H0").
A refusal is a `UserError` whose text is one sentence, as everywhere in the lab.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from model.generate import Sampling

from . import export
from .catalogue.models import DEFAULT_MODEL
from .checks import UserError, check_int, check_sampling
from .export import MAX_TOP
from .heads import LENS_TOP, head_label
from .session import Session

__all__ = ["TOOLS", "scratch", "on_prompt", "models_tool", "generate_tool", "attention_tool", "head_roles_tool",
           "logit_lens_tool", "ablate_tool", "inside_cell_tool", "patch_tool", "CONTINUATION_TOKENS"]

PROMPT_STEP = Sampling(temperature=0.0, top_k=0, top_p=1.0, seed=0)  # the Step a prompt's text is set up with
CONTINUATION_TOKENS = 24  # tokens each continuation of `ablate_tool` runs by default (the page's Regenerate)


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


# The tools by the names the MCP server gives them (ui/tools.py serves each as /tool_<name>).
TOOLS = {"models": models_tool, "generate": generate_tool, "attention": attention_tool, "head_roles": head_roles_tool,
         "logit_lens": logit_lens_tool, "ablate": ablate_tool, "inside_cell": inside_cell_tool, "patch": patch_tool}
