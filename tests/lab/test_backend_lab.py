"""The lab on a model that nnsight runs (`python app.py --model FOLDER --backend nnsight`): the Explore tools go
through the backend contract (entry.backend) and give what the own engine gives on the same folder (1e-5):
the tokens of a text, every head's attention and scores at each Step, the probabilities, the head roles, an
ablation's and an edit's effect, a comparison, a patching sweep (with Stop between its chunks); the tools
that read the own engine's modules are refused by name; the status says where the model runs and what a Step
cost; and the sources the command line gives are checked before anything loads.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from lab.catalogue.external import ExternalModels, parse_source, run_by, sources_from
from lab.catalogue.models import many_heads
from lab.checks import UserError
from lab.headsettings import changed_attention
from lab.limits import MANY_HEADS
from lab.pairs import pairs_for
from lab.session import Session
from model.backend_decoder import BackendDecoder
from model.config import ModelConfig
from model.generate import Decoder, Sampling
from model.nnsight_backend import nnsight_available
from tests.support.family_folders import family_folder
from viz.heads import COMPACT_HEADS

if not nnsight_available():  # checked without importing it: nnsight gives every object a `.save`, which breaks
    # anyio's typed attributes if gradio is imported after it in the same process (the backend imports it on use)
    pytest.skip("the nnsight backend needs nnsight (requirements-scale.txt)", allow_module_level=True)

FAMILIES = ("gpt2", "llama", "gemma2")  # plain; grouped-query; windows and soft-capped scores
PROMPT = "Once upon a time there was a little fox"
GREEDY = Sampling(temperature=0.0, seed=3)
TOL = 1e-5
ROOT = Path(__file__).resolve().parents[2]


def close(a, b, what: str) -> None:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, (what, a.shape, b.shape)
    hidden = np.isneginf(b)
    assert (np.isneginf(a) == hidden).all(), f"{what}: masked entries differ"
    scale = max(1.0, float(np.abs(b[~hidden]).max()) if (~hidden).any() else 1.0)
    diff = float(np.abs(np.where(hidden, 0, a) - np.where(hidden, 0, b)).max())
    assert diff <= TOL * scale, f"{what} differs by {diff:.2e}"


@pytest.fixture(scope="module")
def labs(tmp_path_factory):
    """family -> (session on the own engine, session on nnsight, model name in each), the same folder."""
    root = tmp_path_factory.mktemp("backend_lab")
    folders = {f: family_folder(f, root) for f in FAMILIES}
    made = {}
    for family, folder in folders.items():
        own, other = Session(), Session()
        own.external = ExternalModels([parse_source(str(folder))], root / f"{family}-own.json")
        other.external = ExternalModels([run_by(str(folder), "nnsight")], root / f"{family}-nnsight.json")
        made[family] = own, other, own.external.names[0], other.external.names[0]
    return made


def stepped(session: Session, name: str, steps: int = 4):
    for _ in range(steps):
        shown = session.step(name, PROMPT, GREEDY)
    return shown


@pytest.mark.parametrize("family", FAMILIES)
def test_a_text_steps_alike_with_every_heads_attention_and_scores(labs, family):
    own, other, own_name, other_name = labs[family]
    assert other_name.endswith(" (nnsight)") and not other.entry_for(other_name).own
    stepped(own, own_name)
    stepped(other, other_name)
    a, b = own.text.decoder, other.text.decoder
    assert isinstance(b, BackendDecoder) and type(a) is Decoder  # cached on the own engine, a forward elsewhere
    assert a.ids == b.ids  # greedy: the same tokens
    att_a, att_b = own.text.attention(), other.text.attention()
    for layer in range(len(att_a.weights)):
        close(att_b.weights[layer], att_a.weights[layer], f"{family} layer {layer} weights")
        close(att_b.scores[layer], att_a.scores[layer], f"{family} layer {layer} scores")
    close(other.text.probabilities().probs, own.text.probabilities().probs, f"{family} probabilities")
    close(other.text.probabilities(2).probs, own.text.probabilities(2).probs, f"{family} a prompt token's")
    roles_a, roles_b = own.heads.head_roles(), other.heads.head_roles()
    for key in roles_a.scores:
        close(roles_b.scores[key], roles_a.scores[key], f"{family} role {key}")
    own.undo()
    other.undo()
    assert own.text.decoder.ids == other.text.decoder.ids


@pytest.mark.parametrize("family", FAMILIES)
def test_ablations_edits_and_a_comparison_have_the_same_effect(labs, family):
    own, other, own_name, other_name = labs[family]
    effects = []
    for session, name in ((own, own_name), (other, other_name)):
        stepped(session, name, 2)
        session.heads.set_ablation(["L1H0", "L0H2"], "mean", False)
        mean = session.heads.effect()
        session.heads.set_ablation(["L0H1"], "zero", False)
        session.heads.set_edit(1, 0, 5, 2)  # window positions: the row of token 5 in L1H0 looks at token 2 alone
        edited = session.heads.effect()
        changed = changed_attention(session.text, session.heads.settings)  # what the picture draws
        compared = session.heads.compare(name, PROMPT, "Once upon a time there was a little cat")
        effects.append((mean, edited, changed, compared))
        session.heads.clear_probe()
    (mean_a, edited_a, changed_a, cmp_a), (mean_b, edited_b, changed_b, cmp_b) = effects
    for layer, (wa, wb) in enumerate(zip(*(c[0] for c in (changed_a, changed_b)))):
        close(wb, wa, f"{family} edited attention layer {layer}")
    for layer, (sa, sb) in enumerate(zip(*(c[1] for c in (changed_a, changed_b)))):
        close(sb, sa, f"{family} edited scores layer {layer}")
    for a, b, what in ((mean_a, mean_b, "mean"), (edited_a, edited_b, "zero + edit")):
        close(b.after, a.after, f"{family} {what} after")
        close(b.before, a.before, f"{family} {what} before")
        assert abs(a.kl_bits - b.kl_bits) <= 1e-4
    assert mean_a.kl_bits > 0 and edited_a.kl_bits > 0  # the changes change something
    for layer, (da, db) in enumerate(zip(cmp_a.diff, cmp_b.diff)):
        close(db, da, f"{family} compare layer {layer}")
    close(cmp_b.probs_b, cmp_a.probs_b, f"{family} compare B's next token")


def sweep_args(session: Session, name: str):
    """A minimal pair the lab made for this tokenizer (lab.pairs), and two of its tokens to tell apart."""
    entry = session.entry_for(name)
    pair = pairs_for(entry)[0]
    ids = entry.tokenizer.encode(pair.a)
    answer, other = entry.tokenizer.piece(ids[1]), entry.tokenizer.piece(ids[2])
    return name, pair.a, pair.b, "logit_diff", answer, other


@pytest.mark.parametrize("family", FAMILIES)
def test_a_patching_sweep_gives_the_same_cells(labs, family):
    own, other, own_name, other_name = labs[family]
    for what in ("heads", "resid"):
        a = own.sweeps.run(*sweep_args(own, own_name), what, "denoising")
        b = other.sweeps.run(*sweep_args(other, other_name), what, "denoising")
        assert a.done == b.done == a.values.size and not b.stopped
        close(b.metric, a.metric, f"{family} {what} sweep")


def test_stop_ends_a_sweep_between_two_chunks(labs):
    _, other, _, name = labs["gpt2"]
    steps = other.sweeps.run_steps(*sweep_args(other, name), "resid", "noising")
    first = next(steps)
    assert first.result is None and 0 < first.done < first.total
    other.sweeps.stop()
    last = list(steps)[-1].result
    assert last.stopped and last.done < last.values.size and np.isnan(last.values).any()


def test_the_tools_beyond_the_contract_are_refused_by_name(labs):
    _, other, _, name = labs["gpt2"]
    stepped(other, name, 1)
    calls = {
        "logit lens": lambda: other.heads.lens(),
        "inside": lambda: other.inside.cell(1, 0),
        "circuits": lambda: other.circuits.dla(),
        "composition": lambda: other.circuits.composition(name),
        "positions": lambda: other.positional(name),
    }
    for what, call in calls.items():
        with pytest.raises(UserError) as refused:
            call()
        said = str(refused.value)
        assert "nnsight" in said and "Traceback" not in said and str(ROOT) not in said, (what, said)
    assert other.text.decoder is not None and other.text.decoder.ids  # the text is still there


def test_the_status_says_where_the_model_runs_and_what_a_step_cost(labs):
    _, other, _, name = labs["llama"]
    shown = stepped(other, name, 1)
    status = other.text.status()
    assert "runs the whole text once on nnsight in this process on cpu" in status
    assert "the last took" in status and "One action per person" in status
    assert "runs on nnsight" in other.entry_for(name).summary
    assert shown is not None


def test_the_command_line_sources_are_checked_first(tmp_path):
    folder = family_folder("gpt2", tmp_path)
    assert run_by(str(folder), "nnsight").name == f"{folder.name} (folder) (nnsight)"
    refusals = {
        ("own", "auto", False): "--device-map and --remote go with --backend nnsight",
        ("nnsight", "auto", True): "placed by NDIF",
        ("nnsight", None, True): None,  # a folder is not a repo id: said below
        ("jax", None, False): "--backend must be one of",
    }
    for (backend, device_map, remote), said in refusals.items():
        with pytest.raises(ValueError) as refused:
            run_by(str(folder) if said else "not a repo id!", backend, device_map, remote)
        assert (said or "Hub repo id") in str(refused.value)
    remote = run_by("meta-llama/Llama-3.1-70B", "nnsight", remote=True)
    assert (remote.kind, remote.name, remote.shown) == ("remote", "meta-llama/Llama-3.1-70B (NDIF)",
                                                        "meta-llama/Llama-3.1-70B on NDIF")
    with pytest.raises(ValueError, match="apply to the models given with --model"):
        sources_from([], None, backend="nnsight")
    ck = tmp_path / "m.safetensors"
    ck.write_bytes(b"not read")
    with pytest.raises(ValueError, match="nnsight runs Hugging Face models"):
        run_by(str(ck), "nnsight")


def test_a_model_of_thousands_of_heads_opens_on_the_roles_map():
    big = ModelConfig(vocab_size=128, block_size=64, n_layers=80, n_heads=64, d_model=128)
    small = ModelConfig(vocab_size=128, block_size=64, n_layers=12, n_heads=12, d_model=96)
    assert many_heads(big) and not many_heads(small) and 80 * 64 >= MANY_HEADS > 12 * 12
    assert MANY_HEADS == COMPACT_HEADS  # the model that opens on the roles map gets the compact map


def test_a_model_spread_with_a_device_map_steps_alike(tmp_path):
    """`--device-map auto` reaches the backend (accelerate places the layers; here all on the CPU)."""
    if importlib.util.find_spec("accelerate") is None:
        pytest.skip("--device-map needs accelerate (requirements-scale.txt)")
    folder = family_folder("llama", tmp_path)
    own, spread = Session(), Session()
    own.external = ExternalModels([parse_source(str(folder))], tmp_path / "own.json")
    spread.external = ExternalModels([run_by(str(folder), "nnsight", device_map="auto")], tmp_path / "spread.json")
    stepped(own, own.external.names[0], 3)
    stepped(spread, spread.external.names[0], 3)
    assert spread.text.decoder.ids == own.text.decoder.ids
    assert "(device_map auto)" in spread.text.status()
