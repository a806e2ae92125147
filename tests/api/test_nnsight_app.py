"""`python app.py --model FOLDER --backend nnsight` through the running app (gradio_client against real servers):
the same small random Hugging Face folders of three families (GPT-2; Llama with grouped queries, 6 query heads
on 2 key/value heads; Gemma 2 with a window of 3 keys shorter than the prompts and soft-capped scores and
logits, tests/support/family_folders.py) served twice by one server started for this module: by nnsight
(`--model F --backend nnsight`) and by the own engine (the same folders in DECODER_LAB_MODELS, which the
flag leaves on the own engine), each "own" and "nn" below a client of its own session.

Every Explore tool the backend contract carries (model/backend.py) answers the same numbers on both: greedy
Generate's tokens, each layer's attention (weights and scores), the head-role scores, a zero and a mean
ablation (the effect and the continuations), and a heads patching sweep (1e-5, relative to the largest
magnitude where that is above 1, as tests/engine/test_nnsight_backend.py compares the backends). The tools
that read the own engine's modules (the logit lens, Inside one cell, direct logit attribution) refuse on the
nnsight model in one clean sentence that names nnsight, and answer on the own engine's. The model list names
the nnsight model "(nnsight)", and the page's Step says where the model runs and what a Step costs there.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

from model.nnsight_backend import nnsight_available
from tests.support.api import assert_clean_error
from tests.support.family_folders import FAMILIES as SHAPES
from tests.support.family_folders import family_folder
from tests.support.server import AppServer

if not nnsight_available():  # checked without importing it: nnsight gives every object a `.save`, which breaks
    # anyio's typed attributes if gradio is imported after it in the same process (the backend imports it on use)
    pytest.skip("the nnsight backend needs nnsight (requirements-scale.txt)", allow_module_level=True)

FAMILIES = ("gpt2", "llama", "gemma2")
TOL = 1e-5
GREEDY = (0.0, 0, 1.0, 0)  # temperature, top-k, top-p, seed
PROMPT = "Once upon a time the fox"
REPEATED = "the fox met a bear . the fox met a bear"  # a repeat: the induction score has something to read
# a minimal pair of the same token count in the folders' byte-level tokenizer, and two answers that are one
# token each (" fox" and " bear" are merges of its vocabulary; tests/api/test_new_families_app.py)
A, B = "the fox met a bear", "the bear met a fox"
ANSWER, OTHER = " fox", " bear"
ENV = {"DECODER_LAB_BUSY_WAIT_S": "600"}  # a slow machine waits for its turn, never refuses


def layers(family: str) -> int:
    options = SHAPES[family][2]
    return options.get("n_layer", options.get("num_hidden_layers"))


def heads(family: str) -> int:
    options = SHAPES[family][2]
    return options.get("n_head", options.get("num_attention_heads"))


def own_name(family: str) -> str:
    return f"{family} (folder)"


def nn_name(family: str) -> str:
    return f"{family} (folder) (nnsight)"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("nnsight_folders")
    return {family: family_folder(family, root) for family in FAMILIES}


@pytest.fixture(scope="module")
def server(tmp_path_factory, folders):
    tmp = tmp_path_factory.mktemp("nnsight_app")
    args = [a for folder in folders.values() for a in ("--model", str(folder))] + ["--backend", "nnsight"]
    env = {**ENV, "DECODER_LAB_MODELS": ";".join(str(f) for f in folders.values()),
           "DECODER_LAB_MODEL_HASHES": str(tmp / "hashes.json")}  # nothing written outside the test's folder
    started = AppServer(env, tmp, args=args).start()
    yield started
    started.stop()


@pytest.fixture(scope="module")
def own(server):
    return SimpleNamespace(server=server, client=Client(server.url, verbose=False))


@pytest.fixture(scope="module")
def nn(server):
    return SimpleNamespace(server=server, client=Client(server.url, verbose=False))


def both(own, nn, family: str, *args, api: str) -> tuple:
    """The same call of the tool /tool_<api> on the own engine's model and on nnsight's."""
    return (own.client.predict(own_name(family), *args, api_name=f"/tool_{api}"),
            nn.client.predict(nn_name(family), *args, api_name=f"/tool_{api}"))


def as_array(values) -> np.ndarray:
    """JSON numbers as floats, null (a key the mask hides) as NaN."""
    return np.array(values, dtype=object).astype(float)


def close(got, want, what: str) -> None:
    """nnsight's numbers `got` are the own engine's `want` to TOL, relative to want's largest magnitude where
    that is above 1; the nulls are in the same places."""
    got, want = as_array(got), as_array(want)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    assert np.array_equal(np.isnan(got), np.isnan(want)), f"{what}: the masked entries differ"
    if np.isnan(want).all():
        return
    scale = max(1.0, float(np.nanmax(np.abs(want))))
    diff = float(np.nanmax(np.abs(got - want)))
    assert diff <= TOL * scale, f"{what} differs by {diff:.2e} (scale {scale:.1f})"


# ------------------------------------------------------------------------------ the model list


def test_the_model_list_names_the_nnsight_models(own, nn):
    listed = nn.client.predict(api_name="/tool_models")
    added = [name for name in listed["models"] if "(built-in)" not in name]
    # --model's sources first, run by nnsight; then DECODER_LAB_MODELS's, on the own engine
    assert added == [nn_name(f) for f in FAMILIES] + [own_name(f) for f in FAMILIES]
    assert listed["default"] == "grammar (built-in)"  # the page still opens on the built-in default
    assert set(listed) == {"models", "default"}  # the tool has no summary: the page's model summary says it
    for family in FAMILIES:
        summary = nn.client.predict(nn_name(family), api_name="/select_model")[1]
        assert summary.startswith(f"{nn_name(family)}: {family} through nnsight"), summary
        assert "runs on nnsight in this process on " in summary and " parameters" in summary, summary
        assert "runs on" not in own.client.predict(own_name(family), api_name="/select_model")[1]


# ------------------------------------------------------------------------------ the same numbers on both


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_generate_gives_the_same_tokens(own, nn, family):
    mine, theirs = both(own, nn, family, PROMPT, 6, *GREEDY, api="generate")
    assert theirs["prompt_token_ids"] == mine["prompt_token_ids"]
    assert len(mine["generated"]) == 6 and not mine["ended"]
    assert [g["token_id"] for g in theirs["generated"]] == [g["token_id"] for g in mine["generated"]]
    assert theirs["text"] == mine["text"] and theirs["model"] == nn_name(family)
    close([g["probability"] for g in theirs["generated"]], [g["probability"] for g in mine["generated"]],
          f"{family}: the generated tokens' probabilities")


@pytest.mark.parametrize("family", FAMILIES)
def test_every_layers_attention_is_the_same(own, nn, family):
    for layer in range(layers(family)):
        mine, theirs = both(own, nn, family, REPEATED, layer, None, api="attention")
        assert theirs["token_ids"] == mine["token_ids"] and theirs["heads"] == mine["heads"]
        assert theirs["layer"] == layer and mine["heads"] == list(range(heads(family)))
        weights = as_array(mine["weights"])
        assert np.allclose(np.nansum(weights, axis=-1), 1.0, atol=1e-5)  # each row is a softmax
        close(theirs["weights"], mine["weights"], f"{family} layer {layer}: weights")
        close(theirs["scores"], mine["scores"], f"{family} layer {layer}: scores")
    if family == "gemma2":  # the window of 3 keys: the keys before it hold no weight on either
        assert np.all(as_array(theirs["weights"])[:, -1, :-3] == 0.0)


@pytest.mark.parametrize("family", FAMILIES)
def test_head_role_scores_are_the_same(own, nn, family):
    mine, theirs = both(own, nn, family, REPEATED, api="head_roles")
    assert theirs["columns"] == mine["columns"] and theirs["token_ids"] == mine["token_ids"]
    columns = mine["columns"]
    numeric = [i for i, c in enumerate(columns) if c not in ("layer", "head", "kv_head", "role")]
    assert {"previous_token", "first_token", "induction"} <= {columns[i] for i in numeric}
    assert [row[:2] for row in theirs["rows"]] == [row[:2] for row in mine["rows"]]
    assert len(mine["rows"]) == layers(family) * heads(family)
    for i in numeric:
        close([row[i] for row in theirs["rows"]], [row[i] for row in mine["rows"]], f"{family}: {columns[i]}")
    # a role is a score past its threshold: the same scores pass the same thresholds
    assert [row[-1] for row in theirs["rows"]] == [row[-1] for row in mine["rows"]]


@pytest.mark.parametrize("mode", ["zero", "mean"])
@pytest.mark.parametrize("family", FAMILIES)
def test_an_ablated_head_has_the_same_effect(own, nn, family, mode):
    head = f"L{layers(family) - 1}H0" if mode == "zero" else "L0H1"
    mine, theirs = both(own, nn, family, A, [head], mode, False, None, 5, *GREEDY, api="ablate")
    assert theirs["ablated"] == mine["ablated"] == [head] and theirs["mode"] == mine["mode"] == mode
    e, f = mine["effect"], theirs["effect"]
    assert (f["index"], f["token"], f["what"]) == (e["index"], e["token"], e["what"])
    assert e["kl_bits"] > 1e-4, e  # the head does something, so there is a number to compare
    close(f["kl_bits"], e["kl_bits"], f"{family} {mode}: KL")
    assert [m["piece"] for m in f["moves"]] == [m["piece"] for m in e["moves"]]
    for key in ("before", "after"):
        close([m[key] for m in f["moves"]], [m[key] for m in e["moves"]], f"{family} {mode}: {key}")
    for key in ("rank_before", "rank_after"):
        assert [m[key] for m in f["moves"]] == [m[key] for m in e["moves"]], key
    # the greedy continuations, plain and ablated, are the same tokens
    assert theirs["regeneration"] == mine["regeneration"]
    assert len(mine["regeneration"]["normal"]) == 5


@pytest.mark.parametrize("family", FAMILIES)
def test_a_heads_patching_sweep_is_the_same(own, nn, family):
    mine, theirs = both(own, nn, family, A, B, ANSWER, OTHER, "heads", "denoising", "logit_diff", api="patch")
    assert len(mine["tokens_a"]) == len(mine["tokens_b"]) and theirs["tokens_b"] == mine["tokens_b"]
    assert (theirs["rows"], theirs["columns"]) == (mine["rows"], mine["columns"])
    assert len(mine["rows"]) == layers(family)
    assert theirs["done"] == theirs["cells"] == mine["cells"] and not theirs["stopped"]
    assert abs(mine["metric_a"] - mine["metric_b"]) > 1e-3  # the pair differs in the metric
    close([theirs["metric_a"], theirs["metric_b"]], [mine["metric_a"], mine["metric_b"]], f"{family}: A and B")
    close(theirs["metric_patched"], mine["metric_patched"], f"{family}: patched metric")
    close(theirs["values"], mine["values"], f"{family}: shares restored")


# ------------------------------------------------------------------------------ the own engine's tools


OWN_TOOLS = {  # tool -> (its arguments after model and prompt, a word its refusal says, a key its answer has)
    "logit_lens": ((None, 5), "logit lens", "rows"),
    "inside_cell": ((0, 0, None, None), "attention cell", "weight"),
    "dla": ((None, ANSWER, OTHER), "Circuits", "actual"),
}


@pytest.mark.parametrize("tool", list(OWN_TOOLS))
@pytest.mark.parametrize("family", FAMILIES)
def test_the_own_engines_tools_refuse_by_name_on_nnsight(own, nn, family, tool):
    args, word, key = OWN_TOOLS[tool]
    with pytest.raises(AppError) as info:
        nn.client.predict(nn_name(family), A, *args, api_name=f"/tool_{tool}")
    assert_clean_error(info.value, "nnsight")  # no traceback, file or server path either
    assert word in str(info.value) and "\n" not in str(info.value), str(info.value)
    # the same call on the own engine's model answers
    answer = own.client.predict(own_name(family), A, *args, api_name=f"/tool_{tool}")
    assert answer[key] is not None and answer.get("model", own_name(family)) == own_name(family)


# ------------------------------------------------------------------------------ the page's Step


def test_the_pages_step_says_where_the_model_runs_and_what_a_step_costs(own, nn):
    family = "llama"
    step = (PROMPT, *GREEDY, 0, "all", "weights")
    tokens, status, _, _ = Client(nn.server.url, verbose=False).predict(nn_name(family), *step, api_name="/step")
    mine, own_status, _, _ = Client(own.server.url, verbose=False).predict(own_name(family), *step,
                                                                         api_name="/step")
    assert tokens == mine  # the greedy token after the prompt, and the prompt's, are the same
    assert "(1 generated)" in status and f"Model: {nn_name(family)}: " in status, status
    assert "runs on nnsight in this process on " in status, status
    assert "Each Step, Generate token, ablation or edit runs the whole text once on nnsight in this process" \
        in status, status
    assert "a patching sweep runs it once per cell" in status, status
    # the own engine keeps its model in this process: no line of what each action costs elsewhere
    assert "runs the whole text once" not in own_status and "nnsight" not in own_status, own_status
