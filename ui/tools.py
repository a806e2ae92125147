"""The stateless tools (lab/tools.py) on the API as /tool_<name>, and as MCP tools when the app runs with
`--mcp` (or DECODER_LAB_MCP=1).

Each endpoint is a `gr.api` function whose type hints and docstring are what the API page and an MCP
client read (gradio builds the JSON schema of its arguments and the tool's description from them). It
passes its arguments to one function of lab.tools, which works on a throwaway session: no gr.State, so a
call from a script or an agent acts on exactly what it sends. The calls go through the same door as the
page's (ui/door.py: the address's share of the queue and of its workers, the rate of Generate and of
patching sweeps, charged when the call joins), run in the page's lanes (ui/lanes.py) and refuse in one
sentence (ui/common.py `handler`); the session they make counts against the caller's share of memory. The
Circuits view's tools (dla, composition, head_circuits, atp) run the session's `circuits` part, under the
page's limits for its long jobs (lab/circuits.py), in the page's lanes for the same work.

The MCP server that serves them with `--mcp` is fitted to them in ui/mcp.py.
"""


import gradio as gr

from lab import tools
from lab.catalogue.models import DEFAULT_MODEL
from lab.server.rates import LIMITER

from .clients import request_client
from .common import api_example, handler
from .door import charged_at_door

P = "anna found the key . she gave it to tom because he"
PAIR = ("anna found the key . she gave it to tom because he asked",
        "tom found the key . he gave it to anna because she asked")
ENDPOINT_PREFIX = "tool_"  # /tool_generate and so on: the page's own endpoints keep the plain names


def _client(request: gr.Request | None, rate: str | None = None) -> str | None:
    """The caller's client; a `rate` the door did not charge when the call joined is charged here."""
    client = request_client(request)
    if rate is not None and rate not in charged_at_door(request):
        LIMITER.check(client, rate)
    return client


@handler(exclusive=False)
def tool_models(request: gr.Request = None) -> dict:
    """The names of the models the other tools may be asked about: the built-ins and those the person running
    the app added.

    Returns:
        {"models": [every name, as the page's model list has it], "default": the model the page opens on}.
    """
    return tools.models_tool()


@handler(exclusive=False, rate="generate")
def tool_generate(model: str, prompt: str, max_new_tokens: int = 20, temperature: float = 1.0, top_k: int = 0,
                  top_p: float = 1.0, seed: int = 0, request: gr.Request = None) -> dict:
    """Continue a prompt as the page's Generate does on a new text: the same tokens for the same seed.

    Args:
        model: a model's name, as the models tool lists them.
        prompt: the text to continue (up to 2000 characters; a prompt longer than the model's context keeps its end).
        max_new_tokens: how many tokens to generate, 1 to 256; fewer if the model ends the text.
        temperature: 0 for greedy (always the most probable token), up to 2; 1 samples from the model as it is.
        top_k: sample only among the k most probable tokens, 0 to 50 (0: no limit).
        top_p: sample only among the most probable tokens whose shares add up to p, 0.1 to 1 (1: no limit).
        seed: the sampler's seed, 0 to 2**31-1: the same seed gives the same tokens.

    Returns:
        {"prompt_tokens", "generated": [{"position", "token_id", "piece", "probability": the model's softmax
        for the token (0 to 1), "sampled_probability": its share of the distribution it was drawn from, after
        temperature, top-k and top-p}], "text": the generated text, "ended": whether the model ended it}.
    """
    return tools.generate_tool(model, prompt, max_new_tokens, temperature, top_k, top_p, seed,
                               client=_client(request, "generate"))


@handler(exclusive=False)
def tool_attention(model: str, prompt: str, layer: int, head: int | None = None, request: gr.Request = None) -> dict:
    """The attention of one head (or of every head of a layer) on a prompt, as the page's Explore figure draws it.

    Args:
        model: a model's name, as the models tool lists them.
        prompt: the text to read (nothing is generated: the attention is the prompt's own).
        layer: the layer, from 0.
        head: the head in that layer, from 0; null for every head of the layer.

    Returns:
        {"tokens", "heads", "weights": [head][query][key] softmax shares (each row sums to 1), "scores": the
        same cells' logits before the softmax; null where the causal mask hides a key after its query}.
    """
    return tools.attention_tool(model, prompt, layer, head, client=_client(request))


@handler(exclusive=False)
def tool_head_roles(model: str, prompt: str, request: gr.Request = None) -> dict:
    """Every head's role scores on a prompt (previous token, first token, induction, duplicate token...), as the
    page's head-role table has them, at full precision.

    Args:
        model: a model's name, as the models tool lists them.
        prompt: the text to score the heads on (repeated text lets induction heads show).

    Returns:
        {"columns", "rows": one per head (layer, head, its scores, the role it passes most clearly or ""),
        "thresholds" and "formulas": by score, "roles": what each score means}.
    """
    return tools.head_roles_tool(model, prompt, client=_client(request))


@handler(exclusive=False)
def tool_logit_lens(model: str, prompt: str, position: int | None = None, top: int = tools.LENS_TOP,
                    request: gr.Request = None) -> dict:
    """The logit lens: what the model would predict after one token of the prompt if it stopped after each layer.

    Args:
        model: a model's name, as the models tool lists them.
        prompt: the text to read.
        position: the token's position in the prompt, from 0; null for the last token.
        top: how many of the most probable next tokens to list at each stage, 1 to 1000.

    Returns:
        {"stages": "embedding", "after layer 0", ... (the last stage is the model's own prediction),
        "columns", "rows": (stage, rank, token_id, piece, probability from 0 to 1)}.
    """
    return tools.logit_lens_tool(model, prompt, position, top, client=_client(request))


@handler(exclusive=False, rate="generate")
def tool_ablate(model: str, prompt: str, heads: list[str], mode: str = "zero", keep_only: bool = False,
                position: int | None = None, tokens: int = tools.CONTINUATION_TOKENS, temperature: float = 0.0,
                top_k: int = 0, top_p: float = 1.0, seed: int = 0, request: gr.Request = None) -> dict:
    """Ablate attention heads on a prompt: the change in the next-token prediction, and where a continuation of
    the prompt first differs with them ablated (the page's /ablate and /regenerate).

    Args:
        model: a model's name, as the models tool lists them.
        prompt: the text to read.
        heads: the heads to ablate, as labels such as "L1H0" (layer 1, head 0).
        mode: "zero" (the head adds nothing), "mean" (its output averaged over positions) or "uniform" (equal shares).
        keep_only: true to ablate every head but these.
        position: the token after which the prediction is compared, from 0; null for the last.
        tokens: how many tokens each continuation runs, 1 to 64.
        temperature: the continuations' sampling (0: greedy); both use the same settings and seed.
        top_k: as for generate.
        top_p: as for generate.
        seed: as for generate.

    Returns:
        {"effect": {"kl_bits": KL(before ‖ after) in bits, "moves": the top candidates' probabilities and ranks
        before and after}, "regeneration": {"normal", "changed": the two continuations' tokens,
        "first_difference": the first index where they differ, or null}}.
    """
    return tools.ablate_tool(model, prompt, heads, mode, keep_only, position, tokens, temperature, top_k, top_p,
                             seed, client=_client(request, "generate"))


@handler(exclusive=False)
def tool_inside_cell(model: str, prompt: str, layer: int, head: int, query: int | None = None,
                     key: int | None = None, request: gr.Request = None) -> dict:
    """One attention cell of a prompt worked through: every number from the head's input to what it adds to the
    residual stream, each with its formula (the page's Inside one cell).

    Args:
        model: a model's name, as the models tool lists them.
        prompt: the text to read.
        layer: the layer, from 0.
        head: the head in that layer, from 0.
        query: the query token's position, from 0; null for the last token.
        key: the key token's position (at most the query's); null for the key the query gives the largest share.

    Returns:
        the cell's arithmetic as JSON: the normed input, q, k, their dot product, the scaled score, the
        softmax share, v and the head's output, each number with the formula that gives it.
    """
    return tools.inside_cell_tool(model, prompt, layer, head, query, key, client=_client(request))


@handler(exclusive=False, rate="patch")
def tool_patch(model: str, prompt_a: str, prompt_b: str, answer: str, other: str | None = None, kind: str = "heads",
               direction: str = "denoising", metric: str = "logit_diff", request: gr.Request = None) -> dict:
    """Activation patching between two prompts of the same token count: which heads (or layer × position
    activations) carry the difference between them (the page's /patch).

    Args:
        model: a model's name, as the models tool lists them.
        prompt_a: the clean prompt.
        prompt_b: the corrupted prompt, with as many tokens as prompt_a.
        answer: the answer token, as text (" she") or as its piece ("␣she").
        other: the other answer (" he"); null with metric "prob".
        kind: "heads" (layer × head), or "resid", "attn" or "mlp" (layer × position).
        direction: "denoising" (B's run with one activation from A) or "noising" (A's run with one from B).
        metric: "logit_diff" (answer's logit minus other's, at the last position) or "prob" (answer's probability).

    Returns:
        {"rows", "columns", "values": per cell the share of the A→B difference in the metric that patching it
        restores or makes (1: all of it), "metric_patched", "metric_a", "metric_b", "summary"}.
    """
    return tools.patch_tool(model, prompt_a, prompt_b, answer, other, kind, direction, metric,
                            client=_client(request, "patch"))


# ------------------------------------------------------------------------------- the Circuits view's methods


@handler(exclusive=False)
def tool_dla(model: str, prompt: str, position: int | None = None, answer: str | None = None,
             other: str | None = None, request: gr.Request = None) -> dict:
    """Direct logit attribution: how much each attention head, each MLP and the embedding write straight into
    one logit (or a logit difference) after a token of the prompt, in logits (the page's /dla, Circuits tab).

    Args:
        model: a model's name, as the models tool lists them.
        prompt: the text to read (nothing is generated).
        position: the token after which the logit is read, from 0; null for the last token.
        answer: the answer token, as text (" tom") or as its piece ("␣tom"); null for the model's own top prediction.
        other: a second token (" anna") to read logit(answer) − logit(other); null for the answer's logit alone.

    Returns:
        {"heads": [layer][head] each head's direct term in logits, "mlps": [layer] each MLP's (0 for a layer
        without one), "embedding": the embedding's terms, "direct_sum": all of them added, "remainder": the
        biases and the rest, "actual": the value the model reads out (direct_sum + remainder = actual),
        "label" (and "metric_is"): what was read, such as "logit(␣tom) − logit(␣anna)", "top": the largest
        parts, "units": "logits"}. Direct effects only: what a head changes in later layers is not counted.
    """
    return tools.dla_tool(model, prompt, position, answer, other, client=_client(request))


@handler(exclusive=False)
def tool_composition(model: str, kind: str = "k", top: int = 10, request: gr.Request = None) -> dict:
    """Head composition: how strongly each head writes what a head of a later layer reads with its queries,
    keys or values, and each head's OV copying score (the page's /composition, Circuits tab). The scores are
    the model's weights' alone (no prompt), computed once per model and kept on the server.

    Args:
        model: a model's name, as the models tool lists them.
        kind: "q", "k" or "v": what of the later head the earlier head writes into (its queries, keys or values).
        top: how many of the strongest pairs to list, 1 to 1000; 0 for the whole matrix instead.

    Returns:
        {"pairs": [{"earlier": "L0H1", "later": "L1H2", "score"}] strongest first, "scores": with top 0,
        [earlier layer][earlier head][later layer][later head] (null where the later layer is not after the
        earlier one), each ||W_OV W|| / (||W_OV|| ||W||) from 0 to 1, "copying": [layer][head] each head's OV
        copying score from -1 to 1 (1: it writes the token it reads), "cached": read from the server's cache}.
    """
    return tools.composition_tool(model, kind, top, client=_client(request))


@handler(exclusive=False)
def tool_head_circuits(model: str, prompt: str, layer: int, head: int, request: gr.Request = None) -> dict:
    """One head's OV and QK circuits on a prompt's tokens: what it copies, and which tokens it matches with which
    (the page's /circuits, Circuits tab).

    Args:
        model: a model's name, as the models tool lists them.
        prompt: the text whose tokens the circuits are read on.
        layer: the layer, from 0.
        head: the head in that layer, from 0.

    Returns:
        {"copying": the OV circuit's copying score, Σ Re λ / Σ |λ| over its eigenvalues, -1 to 1, "spectrum":
        the eigenvalues in a few numbers, "inputs": the prompt's distinct tokens, "top_tokens" and "top_values":
        the tokens the head writes most for each, in logits, "qk_tokens", "qk_plain" and "qk_positional":
        [query][key] bilinear scores, logits before the softmax, without and with the tokens' positions,
        "qk_allowed": the keys the mask lets each query read}.
    """
    return tools.head_circuits_tool(model, prompt, layer, head, client=_client(request))


@handler(exclusive=False, rate="patch")
def tool_atp(model: str, prompt_a: str, prompt_b: str, answer: str, other: str | None = None, kind: str = "heads",
             direction: str = "denoising", k: int = tools.ATP_TOOL_TOP, metric: str = "logit_diff",
             request: gr.Request = None) -> dict:
    """Attribution patching beside exact patching: every cell of a patching sweep estimated from one backward
    pass, the cells of largest estimate re-run exactly, and the whole exact sweep when the server's limit allows
    it (the page's /atp, Circuits tab).

    Args:
        model: a model's name, as the models tool lists them.
        prompt_a: the clean prompt.
        prompt_b: the corrupted prompt, with as many tokens as prompt_a.
        answer: the answer token, as text (" she") or as its piece ("␣she").
        other: the other answer (" he"); null with metric "prob".
        kind: "heads" (layer × head), or "resid", "attn" or "mlp" (layer × position).
        direction: "denoising" (B's run with one activation from A) or "noising" (A's run with one from B).
        k: how many cells of largest estimate to re-run exactly, 1 to 50.
        metric: "logit_diff" (answer's logit minus other's, at the last position) or "prob" (answer's probability).

    Returns:
        {"rows", "columns", "estimate": per cell the estimated change of the metric (logits, or probability),
        "estimate_share" and "exact_share": the estimate's and the exact run's share of the A→B difference,
        "exact_metric": the exact patched metric (null where not run), "exact_mode": "sweep" (every cell run
        exactly) or "top-k", "verified": the k re-run cells, "disagree": where the estimate is off}.
    """
    return tools.atp_tool(model, prompt_a, prompt_b, answer, other, kind, direction, k, metric,
                          client=_client(request, "patch"))


ENDPOINTS = {"models": tool_models, "generate": tool_generate, "attention": tool_attention,
             "head_roles": tool_head_roles, "logit_lens": tool_logit_lens, "ablate": tool_ablate,
             "inside_cell": tool_inside_cell, "patch": tool_patch, "dla": tool_dla, "composition": tool_composition,
             "head_circuits": tool_head_circuits, "atp": tool_atp}  # the MCP tool's name → its endpoint's function
# each tool's example call (view_api's examples, which a test calls): the values after model and prompt
EXAMPLES = {"models": (), "generate": (DEFAULT_MODEL, P, 5, 0.0, 0, 1.0, 0), "attention": (DEFAULT_MODEL, P, 1, 0),
            "head_roles": (DEFAULT_MODEL, P), "logit_lens": (DEFAULT_MODEL, P, None, 5),
            "ablate": (DEFAULT_MODEL, P, ["L1H1"], "zero", False, None, 8, 0.0, 0, 1.0, 0),
            "inside_cell": (DEFAULT_MODEL, P, 1, 0, None, None),
            "patch": (DEFAULT_MODEL, *PAIR, " she", " he", "heads", "denoising", "logit_diff"),
            "dla": (DEFAULT_MODEL, P, None, " tom", " anna"), "composition": (DEFAULT_MODEL, "k", 10),
            "head_circuits": (DEFAULT_MODEL, P, 1, 2),
            "atp": (DEFAULT_MODEL, *PAIR, " she", " he", "heads", "denoising", 5, "logit_diff")}
# The Circuits view's tools are bound after the page's Circuits endpoints (app.py): every endpoint bound before
# them keeps its place, and so its number (fn_index), on the API page (tests/api/test_api_contract.py).
CIRCUIT_TOOLS = ("dla", "composition", "head_circuits", "atp")
FIRST_TOOLS = tuple(name for name in ENDPOINTS if name not in CIRCUIT_TOOLS)


def bind_tools_api(blocks: gr.Blocks, names=None) -> None:
    """The endpoints /tool_<name> of `names` (None: every tool not bound yet), in ENDPOINTS' order (call inside
    the page's Blocks, after the other endpoints: `FIRST_TOOLS` before the Circuits endpoints, the rest after)."""
    bound = {f.api_name for f in blocks.fns.values()}
    for name, fn in ENDPOINTS.items():
        if (names is not None and name not in names) or ENDPOINT_PREFIX + name in bound:
            continue
        gr.api(fn, api_name=ENDPOINT_PREFIX + name)
        block_fn = next(f for f in blocks.fns.values() if f.api_name == ENDPOINT_PREFIX + name)
        for component, example in zip(block_fn.inputs, EXAMPLES[name]):
            api_example(component, example)
