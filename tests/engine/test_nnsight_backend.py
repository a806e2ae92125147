"""The backend contract (model/backend.py) on the own engine and on nnsight (model/nnsight_backend.py): on a
small random folder of every family the nnsight backend reaches, both give the same attention, head outputs,
residual streams and logits (the scores: tests/engine/test_backend_contract_extras.py), the same effects of
zero / mean / uniform / scaled heads and of edited rows, and the same patching cells (1e-5, relative to a
tensor's largest magnitude where that is above 1: the residual streams of these sharpened models reach about
30); the generate CLI prints the same tokens with either; what nnsight cannot do is refused by name; and the
remote path runs through nnsight's own request to a stand-in for NDIF on 127.0.0.1
(tests/support/fake_ndif.py), which answers as nnsight's client expects (a sweep in chunks: one request per
chunk).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
import types
from pathlib import Path

import pytest
import torch

from model import cli
from model.backend import ForwardRequest, HeadScale, OwnBackend, PatchRequest
from model.backend_decoder import make_decoder
from model.families import open_folder
from model.generate import Decoder, Sampling, generate
from model.interventions import AttentionEdit, Intervention
from model.nnsight_backend import (NDIF_HOST_ENV, NDIF_KEY_ENV, NnsightBackend, nnsight_available, plan_run,
                                   records_needed, run_session)
from model.patching import PatchSite
from tests.support.fake_ndif import FakeNDIF
from tests.support.families import TEXT
from tests.support.family_folders import family_folder

if not nnsight_available():  # checked without importing it: nnsight gives every object a `.save`, which breaks
    # anyio's typed attributes if gradio is imported after it in the same process (the backend imports it on use)
    pytest.skip("the nnsight backend needs nnsight (requirements-scale.txt)", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
FAMILIES = ("gpt2", "neox", "llama", "llama3", "qwen2", "qwen3", "smollm3", "phi3", "olmo2", "gemma2", "gemma3")
PROMPT = "Once upon a time there was a little fox"
TOL = 1e-5
KEY = "test-key-not-a-real-one"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {name: family_folder(name, root) for name in (*FAMILIES, "neo")}


@pytest.fixture(scope="module")
def pair(folders):
    """family -> (OwnBackend, NnsightBackend) on the same folder, each opened once."""
    made = {}

    def get(name):
        if name not in made:
            model, tok = open_folder(folders[name])
            made[name] = OwnBackend(model, tok), NnsightBackend(folders[name])
        return made[name]

    return get


def close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.shape == b.shape, (what, a.shape, b.shape)
    scale = max(1.0, float(b.abs().max()))
    diff = float((a - b).abs().max())
    assert diff <= TOL * scale, f"{what} differs by {diff:.2e} (scale {scale:.1f})"


def same_result(a, b, what: str) -> None:
    close(a.logits, b.logits, f"{what}: logits")
    assert a.attention.keys() == b.attention.keys()
    for key in a.attention:
        close(a.attention[key], b.attention[key], f"{what}: attention {key}")
    assert a.scores.keys() == b.scores.keys()
    for key in a.scores:  # -inf where the mask hides a key on both, the rest equal
        hidden = torch.isneginf(a.scores[key])
        assert torch.equal(hidden, torch.isneginf(b.scores[key])), f"{what}: scores {key} masked elsewhere"
        close(a.scores[key][~hidden], b.scores[key][~hidden], f"{what}: scores {key}")
    for name in ("head_outputs", "residuals"):
        mine, theirs = getattr(a, name), getattr(b, name)
        assert (mine is None) == (theirs is None), name
        for i, (x, y) in enumerate(zip(mine or (), theirs or ())):
            close(x, y, f"{what}: {name}[{i}]")


def everything(ids, **changes) -> ForwardRequest:
    return ForwardRequest(ids, attention="all", head_outputs=True, residuals=True, logits="all", **changes)


def text_ids(own) -> tuple[int, ...]:
    return tuple(own.tokenizer.encode(PROMPT))


@pytest.mark.parametrize("family", FAMILIES)
def test_the_reads_are_the_same(pair, family):
    own, nn = pair(family)
    ids = text_ids(own)
    a, b = own.forward(everything(ids)), nn.forward(everything(ids))
    same_result(a, b, family)
    cfg = own.cfg
    assert len(b.residuals) == cfg.n_layers + 1 and b.logits.shape == (len(ids), cfg.vocab_size)
    assert b.head_outputs[0].shape == (cfg.n_heads, len(ids), cfg.head_dim)
    # chosen heads only, and the last position's logits alone
    chosen = ForwardRequest(ids, attention=[(cfg.n_layers - 1, 1), (0, 0)])
    a, b = own.forward(chosen), nn.forward(chosen)
    assert set(b.attention) == {(0, 0), (cfg.n_layers - 1, 1)} and b.logits.shape == (1, cfg.vocab_size)
    same_result(a, b, f"{family} chosen heads")


@pytest.mark.parametrize("family", FAMILIES)
def test_ablations_scales_and_edited_rows_have_the_same_effects(pair, family):
    own, nn = pair(family)
    ids = text_ids(own)
    L, H, q = own.cfg.n_layers, own.cfg.n_heads, len(ids) - 1
    plain = own.forward(everything(ids))
    heads = [(0, 1), (L - 1, H - 1)]
    changes = {mode: {"intervention": Intervention(heads=heads, mode=mode)} for mode in ("zero", "mean", "uniform")}
    changes["scale"] = {"scales": (HeadScale(0, 1, 2.5), HeadScale(L - 1, 0, -0.5))}
    changes["keep_only"] = {"intervention": Intervention(heads=[(0, 0)], mode="zero", keep_only=True)}
    # one row onto the key before the query (inside every local window here), one made uniform
    edits = [AttentionEdit(0, 1, q, q - 1), AttentionEdit(L - 1, 0, q - 1, None)]
    changes["edits"] = {"intervention": Intervention(edits=edits)}
    for name, change in changes.items():
        a, b = own.forward(everything(ids, **change)), nn.forward(everything(ids, **change))
        same_result(a, b, f"{family} {name}")
        assert float((a.logits - plain.logits).abs().max()) > 1e-3, f"{name} changed nothing"
    b = nn.forward(everything(ids, **changes["edits"]))
    row = b.attention[0, 1][q]
    assert float(row[q - 1]) == 1.0 and float(row.sum()) == 1.0  # the edited row is the row that was used
    # a factor of 0 is a zero ablation, a factor of 1 nothing at all
    zero = nn.forward(ForwardRequest(ids, intervention=Intervention(heads=[(0, 1)], mode="zero")))
    close(nn.forward(ForwardRequest(ids, scales=(HeadScale(0, 1, 0.0),))).logits, zero.logits, "scale 0")
    close(own.forward(ForwardRequest(ids, scales=(HeadScale(0, 1, 1.0),))).logits, plain.logits[-1:], "scale 1")


@pytest.mark.parametrize("family", FAMILIES)
def test_patching_gives_the_same_cells(pair, family):
    own, nn = pair(family)
    ids = text_ids(own)
    source = ids[:-3] + (ids[-2], ids[-3], ids[-1])  # the same tokens, two swapped: a minimal pair
    L, H, T = own.cfg.n_layers, own.cfg.n_heads, len(ids)
    sites = ([PatchSite("resid", r, positions=(p,)) for r in range(L + 1) for p in (T - 3, T - 1)]
             + [PatchSite("head", l, head=h) for l in range(L) for h in range(H)]
             + [PatchSite(kind, l, positions=(T - 3,)) for kind in ("attn", "mlp") for l in range(L)])
    a, b = own.patch_cells(ids, source, sites), nn.patch_cells(ids, source, sites)
    close(a, b, f"{family} patching cells")
    plain = own.forward(ForwardRequest(ids)).logits[-1]
    assert float((a - plain).abs().max()) > 1e-3, "no cell changed the answer"
    # several sites in one forward, with everything read
    patch = PatchRequest(source, (PatchSite("resid", 1, positions=(T - 3,)), PatchSite("head", L - 1, head=2)))
    same_result(own.forward(everything(ids, patch=patch)), nn.forward(everything(ids, patch=patch)), family)


def test_both_backends_refuse_the_same_requests(pair):
    own, nn = pair("gemma2")
    ids = text_ids(own)
    q = len(ids) - 1
    bad = [everything(ids, intervention=Intervention(edits=[AttentionEdit(0, 0, q, 0)])),  # outside the window
           ForwardRequest(ids, scales=(HeadScale(0, 0, 2.0),), patch=PatchRequest(ids, (PatchSite("resid", 0),))),
           ForwardRequest(ids, scales=(HeadScale(0, 0, 2.0),), intervention=Intervention(heads=[(0, 0)])),
           ForwardRequest(ids, attention=[(0, 99)]),
           ForwardRequest(ids, patch=PatchRequest(ids[:-1], (PatchSite("resid", 0),))),
           ForwardRequest((own.cfg.vocab_size,))]
    for request in bad:
        said = []
        for backend in (own, nn):
            with pytest.raises(ValueError) as refused:
                backend.forward(request)
            said.append(str(refused.value))
        assert said[0] == said[1] and len(said[0].splitlines()) == 1, said
    with pytest.raises(ValueError, match="same length"):
        nn.patch_cells(ids, ids[:-1], [PatchSite("resid", 0)])


def test_what_nnsight_cannot_do_is_refused_by_name(pair, folders, tmp_path, monkeypatch):
    own, nn = pair("gpt2")
    for tool in ("train", "film", "inside"):
        assert own.refusal(tool) is None
        said = nn.refusal(tool)
        assert said.startswith("The nnsight backend does not offer this") and len(said.splitlines()) == 1
    with pytest.raises(ValueError):
        nn.refusal("fly")
    with pytest.raises(ValueError, match="GPT-Neo computes its attention in its own method"):
        NnsightBackend(folders["neo"])
    with pytest.raises(ValueError, match="does not exist"):
        NnsightBackend(tmp_path / "nothing")
    monkeypatch.delenv(NDIF_KEY_ENV, raising=False)
    with pytest.raises(ValueError, match=NDIF_KEY_ENV):
        NnsightBackend(folders["gpt2"], remote=True)
    with pytest.raises(ValueError, match="placed by NDIF"):
        NnsightBackend(folders["gpt2"], remote=True, device_map="auto")
    if importlib.util.find_spec("accelerate") is None:
        with pytest.raises(ValueError, match="accelerate"):
            NnsightBackend(folders["gpt2"], device_map="auto")
    assert "nnsight in this process on cpu" in nn.where() and "parameters" in nn.where()


def test_the_generation_loop_samples_as_the_decoder_does(pair, folders):
    own, nn = pair("gpt2")
    long = own.tokenizer.encode(TEXT)[:36]  # 36 of 40 positions: the window slides after four steps
    for sampling in (Sampling(temperature=0.0), Sampling(temperature=0.9, top_k=20, top_p=0.9, seed=3)):
        decoder = Decoder(own.model, long, sampling, capture_attention=False, eos_id=None, piece=own.tokenizer.piece)
        want = list(generate(decoder, 8, attention="none"))
        for backend in (own, nn):
            decoder = make_decoder(backend, long, sampling, None, own.tokenizer.piece, capture_attention=False)
            got = list(generate(decoder, 8, attention="none"))
            assert [s.token_id for s in got] == [s.token_id for s in want]
            assert [s.cropped for s in got] == [s.cropped for s in want] == [False] * 4 + [True] * 4
            assert [s.position for s in got] == [s.position for s in want]
            for mine, theirs in zip(got, want):
                close(torch.from_numpy(mine.probs), torch.from_numpy(theirs.probs), "probabilities")


@pytest.mark.parametrize("family", ["gpt2", "llama3"])
def test_the_cli_prints_the_same_tokens_with_either_backend(folders, family):
    common = ["--checkpoint", str(folders[family]), "--prompt", PROMPT, "--temperature", "0", "--max-new-tokens", "5"]
    lines = [[*common, "--backend", b, *extra] for extra in (["--json"], []) for b in ("own", "nnsight")]
    # the four command lines in one child process, each run as `python -m model.generate` would be
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    batch = subprocess.run([sys.executable, "-m", "tests.support.cli_batch", "model.generate"],
                           input=json.dumps(lines), capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert batch.returncode == 0, batch.stderr
    answers = json.loads(batch.stdout)
    for status, _, err in answers:
        assert status == 0, err
    own, theirs = ([json.loads(line) for line in out.splitlines()] for _, out, _ in answers[:2])
    assert [r["token_id"] for r in theirs] == [r["token_id"] for r in own] and len(own) == 5
    assert [r["text"] for r in theirs] == [r["text"] for r in own]
    assert max(abs(a["prob"] - b["prob"]) for a, b in zip(own, theirs)) <= TOL
    assert {tuple(r) for r in theirs} == {tuple(r) for r in own}  # the same fields, in the same order
    assert answers[2][1] == answers[3][1] and answers[2][1]  # the plain text, the same from both


def test_a_model_placed_by_accelerate_gives_the_same_numbers(pair, folders):
    """--device-map auto: transformers places the layers with accelerate (requirements-scale.txt), here all on the
    CPU (this machine has no GPU); the numbers are the own engine's."""
    if importlib.util.find_spec("accelerate") is None:
        pytest.skip("--device-map needs accelerate (requirements-scale.txt)")
    own, _ = pair("llama")
    spread = NnsightBackend(folders["llama"], device_map="auto")
    assert "(device_map auto)" in spread.where()
    ids = text_ids(own)
    request = ForwardRequest(ids, attention="all", scores=True, head_outputs=True, residuals=True, logits="all",
                             intervention=Intervention(heads=[(1, 2)], mode="zero"))
    same_result(own.forward(request), spread.forward(request), "device_map auto")


def test_the_cli_refuses_unknown_combinations_in_one_line(folders, capsys):
    folder = str(folders["gpt2"])
    cases = [(["--remote"], "add --backend nnsight"), (["--device-map", "auto"], "add --backend nnsight"),
             (["--backend", "nnsight", "--meta", "meta.pkl"], "nanoGPT"),
             (["--backend", "nnsight", "--remote", "--weights", "stored"], "--weights"),
             (["--backend", "nnsight", "--remote", "--device-map", "auto"], "placed by NDIF")]
    for extra, words in cases:
        with pytest.raises(SystemExit) as stopped:
            cli.generate_main(["--checkpoint", folder, "--prompt", "Once", *extra])
        err = capsys.readouterr().err
        assert stopped.value.code == 2 and words in err and len(err.strip().splitlines()) == 1, (extra, err)


def test_importing_the_backends_loads_neither_nnsight_nor_transformers():
    code = ("import sys, model.backend, model.nnsight_backend, model.cli, model.generate; "
            "print([m for m in ('nnsight', 'transformers') if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert done.stdout.strip() == "[]"


def test_the_session_needs_nothing_of_this_project(pair):
    """nnsight's own dry run of a remote request: the session serialized, then deserialized with every module not
    installed on an NDIF server hidden (this project's among them), then run; the same numbers as run here."""
    import nnsight
    from nnsight.intervention.backends.local import LocalSimulationBackend

    own, nn = pair("olmo2")
    ids = text_ids(own)
    source = ids[:-2] + (ids[-1], ids[-2])
    run = plan_run(nn.cfg, len(ids), Intervention(heads=[(0, 1)], mode="mean"), (), (PatchSite("head", 1, head=2),),
                   ((0, 0),), True, True, "all", scores=True)
    here = run_session(nn.model, nnsight, nn.envoys, nn.cfg, ids, source, [run], records_needed([run]))
    there = run_session(nn.model, nnsight, nn.envoys, nn.cfg, ids, source, [run], records_needed([run]),
                        backend=LocalSimulationBackend(nn.model))
    close(there[0]["logits"], here[0]["logits"], "logits")
    assert torch.equal(there[0]["scores"][0], here[0]["scores"][0])  # the softmax's input, mask value and all
    for x, y in zip(there[0]["heads"] + there[0]["resid"], here[0]["heads"] + here[0]["resid"]):
        close(x, y, "heads and residuals")


@pytest.fixture
def ndif(folders, monkeypatch):
    """The stand-in NDIF on 127.0.0.1 serving the llama and gpt2 folders (their paths as repo ids); the Hub's
    answer to nnsight's repo-id lookup faked in this process, since the tests run offline."""
    server = FakeNDIF(KEY, {str(folders[name]): folders[name] for name in ("llama", "gpt2")})
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info",
                        lambda self, repo_id, **kw: types.SimpleNamespace(id=repo_id))
    monkeypatch.setenv(NDIF_HOST_ENV, server.url)
    monkeypatch.setenv(NDIF_KEY_ENV, KEY)
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


def test_a_remote_model_runs_through_nnsights_request(pair, folders, ndif, monkeypatch):
    own = pair("llama")[0]
    remote = NnsightBackend(folders["llama"], remote=True)
    ids = text_ids(own)
    source = ids[:-2] + (ids[-1], ids[-2])
    changes = everything(ids, scores=True, intervention=Intervention(heads=[(0, 1)], mode="mean"),
                         patch=PatchRequest(source, (PatchSite("resid", 1, positions=(len(ids) - 2,)),)))
    same_result(own.forward(changes), remote.forward(changes), "remote")  # the scores too
    sites = [PatchSite("head", l, head=h) for l in range(own.cfg.n_layers) for h in range(own.cfg.n_heads)]
    close(remote.patch_cells(ids, source, sites), own.patch_cells(ids, source, sites), "remote cells")
    assert len(ndif.requests) == 2  # one request per session: a forward, a whole sweep
    # a sweep in chunks of 5 cells: one request per chunk, the same cells
    chunks = list(remote.patch_steps(ids, source, sites, batch_tokens=5 * len(ids)))
    assert [len(c) for c in chunks] == [5, 5, len(sites) - 10] and len(ndif.requests) == 5
    close(torch.cat(chunks), own.patch_cells(ids, source, sites), "remote chunks")
    sent = ndif.requests[0]
    key = json.loads(sent["model_key"].split(":", 1)[1])
    assert sent["model_key"].startswith("nnsight.modeling.transformers.TransformersModel:")
    assert key["repo_id"] == str(folders["llama"]) and sent["key_ok"] and sent["compress"]
    assert sent["nnsight_version"] == "0.8.1" and sent["blob_bytes"] > 0
    assert "NDIF (http://127.0.0.1:" in remote.where()
    kept = [v for v in vars(remote).values() if isinstance(v, (str, dict, list, tuple))]
    assert not any(KEY in repr(v) for v in kept), "the key is kept on the backend"
    # a wrong key: NDIF's answer, in one sentence
    monkeypatch.setenv(NDIF_KEY_ENV, "not-the-key")
    with pytest.raises(ValueError, match="NDIF refused or failed the request: .*not valid") as refused:
        remote.forward(ForwardRequest(ids))
    assert "not-the-key" not in str(refused.value)
    # a job that fails on NDIF (here: a model this server does not hold) comes back as its sentence
    monkeypatch.setenv(NDIF_KEY_ENV, KEY)
    elsewhere = NnsightBackend(folders["qwen2"], remote=True)
    with pytest.raises(ValueError, match="NDIF refused or failed the request: KeyError"):
        elsewhere.forward(ForwardRequest(ids[:4]))


def test_the_cli_generates_remotely_as_it_does_here(folders, ndif, capsys):
    args = ["--checkpoint", str(folders["gpt2"]), "--prompt", PROMPT, "--temperature", "0", "--max-new-tokens", "3",
            "--json"]
    assert cli.generate_main(args) == 0
    here = capsys.readouterr()
    assert cli.generate_main([*args, "--backend", "nnsight", "--remote"]) == 0
    there = capsys.readouterr()
    assert KEY not in there.out + there.err
    mine, theirs = ([json.loads(line) for line in out.splitlines()] for out in (here.out, there.out))
    assert [r["token_id"] for r in theirs] == [r["token_id"] for r in mine] and len(mine) == 3
    assert len(ndif.requests) == 3  # one forward of the window per new token
