"""Pretrained models added by whoever runs the app (`python app.py --model SRC`, DECODER_LAB_MODELS),
through the running app's API (gradio_client against a real server): small random GPT-2 and Llama
models built with transformers, one as a local folder, one in a fake Hugging Face cache, so nothing
is downloaded. What the API returns is held to transformers (the reference implementation).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError

from model.families import open_folder
from model.heads import head_scores
from tests.support.api import QUANT, assert_clean_error, panels, words
from tests.support.share_api import value
from tests.support.families import hf_tokenizer, save_reference, sharpen
from tests.support.server import APP, ROOT, AppServer

import transformers  # noqa: F401 - the reference: a missing package fails collection, never skips

VOCAB = 300  # the tokenizers' tokens; the GPT-2 model's embedding has 20 padded rows more
COMMIT = "0123456789abcdef0123456789abcdef01234567"  # the fake hub snapshot's commit
GPT2, LLAMA, CHANGED = "gpt2 (folder)", "tiny/llama@main", "changed (folder)"
MISSING = "nobody/absent@main"
ATTN_TOL = 1e-6
GREEDY = (0.0, 0, 1.0, 0)  # temperature, top-k, top-p, seed


def build_gpt2(folder: Path):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_positions=64, vocab_size=VOCAB + 20, n_embd=16, n_layer=2, n_head=4, bos_token_id=1,
                     eos_token_id=0, attn_implementation="eager")
    torch.manual_seed(0)
    ref = GPT2LMHeadModel(cfg).eval()
    sharpen(ref, seed=3, conv1d=True)
    save_reference(ref, folder, VOCAB)
    (folder / "README.md").write_text("---\nlicense: mit\ntags: [test]\n---\n# A tiny random GPT-2\n")
    return ref


def build_llama(folder: Path):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=VOCAB, max_position_embeddings=64, hidden_size=24, num_hidden_layers=2,
                      num_attention_heads=6, num_key_value_heads=2, intermediate_size=40, rope_theta=100000.0,
                      bos_token_id=1, eos_token_id=0, attn_implementation="eager")
    torch.manual_seed(0)
    ref = LlamaForCausalLM(cfg).eval()
    sharpen(ref, seed=5)
    save_reference(ref, folder, VOCAB, bos=True)
    return ref


def fake_hub(cache: Path, repo: str, files: Path) -> Path:
    """The hub cache's layout for one repo: its snapshot at COMMIT, and refs/main naming it."""
    root = cache / f"models--{repo.replace('/', '--')}"
    snapshot = root / "snapshots" / COMMIT
    shutil.copytree(files, snapshot)
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(COMMIT)
    return snapshot


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("real")
    gpt2 = tmp / "gpt2"
    refs = {GPT2: (build_gpt2(gpt2), gpt2)}
    llama = build_llama(tmp / "llama-files")
    refs[LLAMA] = (llama, fake_hub(tmp / "hub", "tiny/llama", tmp / "llama-files"))
    changed = shutil.copytree(gpt2, tmp / "changed").resolve()
    hashes = tmp / "hashes.json"
    hashes.write_text(json.dumps({str(changed): "0" * 64}))  # recorded before: the files differ from it
    env = {"DECODER_LAB_MODELS": f"{LLAMA};{MISSING}", "DECODER_LAB_MODEL_HASHES": str(hashes),
           "HF_HUB_CACHE": str(tmp / "hub"), "DECODER_LAB_BUSY_WAIT_S": "600"}
    server = AppServer(env, tmp, args=["--model", str(gpt2), "--model", str(changed)]).start()
    # the page answered before any of them was loaded: no hash has been recorded yet
    assert json.loads(hashes.read_text()) == {str(changed): "0" * 64}
    yield SimpleNamespace(server=server, refs=refs, hashes=hashes, gpt2=gpt2.resolve())
    server.stop()


@pytest.fixture
def client(real):
    return Client(real.server.url, verbose=False)


def reference(real, name: str, prompt: str, new_tokens: int):
    """transformers' greedy ids after the prompt, its attention on the whole text (one (H, T, T) per
    layer), its next-token probabilities there, and our tokenizer (for the pieces the page shows)."""
    ref, folder = real.refs[name]
    ids = hf_tokenizer(folder)(prompt)["input_ids"]
    padded = list(range(VOCAB, ref.config.vocab_size))
    with torch.no_grad():
        out = ref.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
                           eos_token_id=None, suppress_tokens=padded or None)[0].tolist() if new_tokens else ids
        full = ref(torch.tensor([out]), output_attentions=True)
    attention = [a[0].numpy() for a in full.attentions]
    probs = torch.softmax(full.logits[0, -1, :VOCAB].double(), -1).numpy()
    return SimpleNamespace(ids=out, prompt_len=len(ids), attention=attention, probs=probs,
                           tok=open_folder(folder)[1])


def select(client: Client, name: str):
    """/select_model's outputs: the summary, the view it opens on and the first example prompt."""
    out = [value(x) for x in client.predict(name, api_name="/select_model")]
    return SimpleNamespace(summary=out[1], layer=out[4], head=out[5], view=out[6], caption=out[7],
                           prompt=out[9])


def exported(client: Client, what: str, name: str, layer, head) -> dict:
    path = client.predict(what, "json", name, layer, head, api_name="/export_numbers")
    return json.loads(Path(path).read_text(encoding="utf-8"))


# ------------------------------------------------------------------------------ the options


def test_help_prints_the_options_and_a_bad_source_is_a_sentence():
    shown = subprocess.run([sys.executable, str(APP), "--help"], cwd=ROOT, capture_output=True, text=True,
                           timeout=600)
    assert shown.returncode == 0, shown.stderr
    assert "--model SRC" in shown.stdout and "DECODER_LAB_MODELS" in shown.stdout and "owner/name@revision" in shown.stdout
    bad = subprocess.run([sys.executable, str(APP), "--model", "someone/model"], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert bad.returncode == 2 and "needs a pinned revision" in bad.stderr and "Traceback" not in bad.stderr


def test_without_options_the_model_list_is_the_built_ins(monkeypatch, tmp_path):
    import app
    from lab.catalogue.external import ENV_VAR, EXTERNAL
    from lab.catalogue.models import BUILTIN_MODELS
    from lab.session import Session

    import huggingface_hub.constants

    monkeypatch.delenv(ENV_VAR, raising=False)
    # an empty hub cache: the README's preloaded models are offered only where they are cached
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    assert app.parse_args([]) == [] and EXTERNAL.names == []
    assert Session().model_names() == list(BUILTIN_MODELS)


def test_the_list_names_each_model_and_its_summary_says_what_it_is(real, client):
    from lab.catalogue.models import BUILTIN_MODELS

    choices = [c[0] if isinstance(c, (list, tuple)) else c for c in
               client.view_api(return_format="dict", print_info=False)["named_endpoints"]["/select_model"]
               ["parameters"][0]["type"]["enum"]]
    assert choices == [*BUILTIN_MODELS, GPT2, CHANGED, LLAMA, MISSING]  # --model first, then the variable
    gpt2 = select(client, GPT2).summary
    for part in ("GPT-2", "12,736 parameters", "2 layers × 4 heads", "context 64", "Hugging Face tokenizer",
                 "300 tokens, 20 padded rows never shown", "no BOS token first", "source local folder gpt2",
                 "licence mit"):
        assert part in gpt2, gpt2
    llama = select(client, LLAMA).summary
    for part in ("Llama", "2 layers × 6 heads", "context 64", "puts “<s>” first", "source tiny/llama@main"):
        assert part in llama, llama
    assert "licence" not in llama  # its files state none
    assert str(real.gpt2) in json.loads(real.hashes.read_text())  # recorded on its first load


@pytest.mark.parametrize("name", [GPT2, LLAMA])
def test_first_view_is_where_the_model_shows_most_on_its_examples(real, client, name):
    """The rule of lab.catalogue.realmodels.choose_first_view, with transformers' attention: of induction then
    previous-token, the first role some head reaches on some example, at its highest score, on that example (it comes first);
    else the head nearest to a role, and a caption that says no head stands out."""
    from lab.catalogue.realmodels import example_prompts

    s = select(client, name)
    tok = reference(real, name, s.prompt, 0).tok
    best = {}
    for prompt in example_prompts(tok, 64):
        ref = reference(real, name, prompt, 0)
        scores = head_scores(ref.attention, ref.ids)
        for key in ("induction", "previous_token"):
            table = np.asarray(scores[key], dtype=np.float64)
            if np.isfinite(table).any() and (key not in best or np.nanmax(table) > best[key][0]):
                best[key] = (np.nanmax(table), prompt, np.unravel_index(np.nanargmax(table), table.shape))
    thresholds = {"induction": 0.4, "previous_token": 0.5}
    reached = [k for k in ("induction", "previous_token") if k in best and best[k][0] >= thresholds[k]]
    key = reached[0] if reached else max(best, key=lambda k: best[k][0] / thresholds[k])
    score, prompt, cell = best[key]
    assert (s.layer, s.head, s.view, s.prompt) == (*cell, "weights", prompt)
    assert f"{score:.2f}" in s.caption and f"layer {s.layer}, head {s.head}" in s.caption
    assert s.caption.startswith("No head") is not bool(reached)


# ------------------------------------------------------------------------------ Explore


@pytest.mark.parametrize("name", [GPT2, LLAMA])
def test_step_generate_undo_reset_are_the_models_own_tokens_and_attention(real, client, name):
    s = select(client, name)
    ref = reference(real, name, s.prompt, 5)
    pieces = [ref.tok.piece(i) for i in ref.ids]
    for k in (1, 2):
        tokens, status, _, attn = client.predict(name, s.prompt, *GREEDY, s.layer, "all", "weights", api_name="/step")
        T = ref.prompt_len + k
        assert words(tokens) == pieces[:T], status
        # the payload's rounding, and transformers' attention within 1e-6 of ours
        assert np.nanmax(np.abs(panels(attn) - ref.attention[s.layer][:, :T, :T])) <= QUANT + ATTN_TOL
    for layer in range(len(ref.attention)):  # every layer's numbers, unrounded, from the export
        values = np.array(exported(client, "weights", name, layer, "all")["values"], dtype=float)
        assert np.nanmax(np.abs(values - ref.attention[layer][:, :T, :T])) <= ATTN_TOL
    probs = exported(client, "probabilities", name, s.layer, "all")
    assert len(probs["rows"]) == VOCAB and max(r[1] for r in probs["rows"]) < VOCAB  # no padded row
    *_, attn = client.predict(name, s.prompt, *GREEDY, 3, s.layer, "all", "weights", api_name="/generate")
    tokens, status, _, attn = client.predict(s.layer, "all", "weights", api_name="/undo")
    T = ref.prompt_len + 4
    assert words(tokens) == pieces[:T] and f"{T} tokens in view (4 generated)" in status
    assert np.nanmax(np.abs(panels(attn) - ref.attention[s.layer][:, :T, :T])) <= QUANT + ATTN_TOL
    probs = exported(client, "probabilities", name, s.layer, "all")
    want = reference(real, name, s.prompt, 3).probs  # what the 4th generated token was drawn from
    rows = sorted(probs["rows"], key=lambda r: r[0])
    assert [r[1] for r in rows[:5]] == [int(i) for i in np.argsort(-want, kind="stable")[:5]]
    assert [r[3] for r in rows] == pytest.approx([float(want[r[1]]) for r in rows], abs=1e-6)
    tokens, status, *_ = client.predict(name, api_name="/reset")
    assert tokens == [] and status == ""


@pytest.mark.parametrize("name", [GPT2, LLAMA])
def test_head_tools_work_on_the_model(real, client, name):
    s = select(client, name)
    client.predict(name, s.prompt, *GREEDY, s.layer, "all", "weights", api_name="/step")
    ref = reference(real, name, s.prompt, 1)
    L, H = len(ref.attention), ref.attention[0].shape[0]
    table = client.predict(api_name="/head_roles")
    rows = {(r[0], r[1]): dict(zip(table["columns"], r)) for r in table["data"]}
    assert len(rows) == L * H
    want = head_scores(ref.attention, ref.ids)
    for (layer, head), row in rows.items():
        for key in ("previous_token", "first_token", "induction"):
            assert row[key] == pytest.approx(float(want[key][layer, head]), abs=1e-4)
    # the logit lens's last stage is the model's own distribution, without padded rows
    _, data = client.predict(ref.prompt_len - 1, api_name="/logit_lens")
    last = [r for r in data["data"] if r[0] == f"after layer {L - 1}"]
    before = reference(real, name, s.prompt, 0)
    top = np.argsort(-before.probs, kind="stable")[: len(last)]
    assert [r[2] for r in last] == [ref.tok.piece(int(i)) for i in top]
    assert [r[3] for r in last] == pytest.approx([float(before.probs[i]) for i in top], abs=1e-6)
    # ablation with its effect and regeneration, an edited row, Compare A/B
    _, summary, _, data = client.predict([f"L{L - 1}H0"], "zero", False, L - 1, "all", api_name="/ablate")
    assert data["active"] and "KL(before ‖ after)" in summary
    page, regen = client.predict(*GREEDY, 4, api_name="/regenerate")
    after = reference(real, name, s.prompt, 5).ids[ref.prompt_len + 1:]  # the plain model goes on greedily
    assert regen["normal"] == [ref.tok.piece(i) for i in after] and len(regen["changed"]) == 4
    _, _, data = client.predict("L0H0", "uniform", api_name="/edit_attention")
    assert data["active"]
    client.predict(0, "all", api_name="/clear_changes")
    _, _, _, notes, data = client.predict(name, "The fox ran", "The bear ran", 0, api_name="/compare")
    assert data["kl_bits"] >= 0 and data["tokens_b"][-1] == ref.tok.piece(ref.tok.encode("The bear ran")[-1])


def test_a_session_file_names_the_source_and_hash_and_reopens(real, client, tmp_path):
    s = select(client, GPT2)
    form = (GPT2, s.prompt, *GREEDY)
    shown = client.predict(*form, 0, "all", "weights", api_name="/step")
    path, _ = client.predict(*form, 0, "all", "weights", api_name="/export_session")
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    assert doc["model"] == {"external": "local folder gpt2", "sha256": json.loads(real.hashes.read_text())[str(real.gpt2)]}
    page = client.predict(*form, 0, "all", "weights", api_name="/link")
    assert 'href="?model=gpt2+%28folder%29&amp;prompt=' in page and "steps=1" in page
    standalone = client.predict(0, "all", "weights", api_name="/export_page")
    html_page = Path(standalone["path"] if isinstance(standalone, dict) else standalone).read_text(encoding="utf-8")
    assert shown[0][-1]["token"] in html_page and str(real.gpt2) not in html_page
    other = Client(real.server.url, verbose=False)
    out = [value(x) for x in other.predict(handle_file(path), api_name="/import_session")]
    assert out[0] == GPT2 and out[4] == shown[0]
    for change, pattern in [({"sha256": "1" * 64}, "other weights"), ({"external": "local folder other"}, "does not offer")]:
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps({**doc, "model": {**doc["model"], **change}}), encoding="utf-8")
        with pytest.raises(AppError) as info:
            other.predict(handle_file(str(bad)), api_name="/import_session")
        assert_clean_error(info.value, pattern)


# ------------------------------------------------------------------------------ refusals


def test_changed_files_and_an_uncached_repo_are_refused_with_a_sentence(real, client):
    for name, pattern in [(CHANGED, "have changed since this server first loaded them"),
                          (MISSING, "is not in this server's Hugging Face cache.*hf download nobody/absent")]:
        with pytest.raises(AppError) as info:
            client.predict(name, api_name="/select_model")
        assert_clean_error(info.value, pattern)
    assert json.loads(real.hashes.read_text())[str(real.gpt2.parent / "changed")] == "0" * 64  # kept
    tokens, *_ = client.predict(GPT2, "The fox", *GREEDY, 0, "all", "weights", api_name="/step")  # still works
    assert len(tokens) == 3


def test_any_text_encodes_and_a_prompt_past_the_context_keeps_its_last_tokens(real, client):
    prompt = "Zebras ☃ quietly x-ray 𝔘nicode " * 12  # no "unknown word" for a byte-level tokenizer
    n = len(open_folder(real.gpt2)[1].encode(prompt))
    assert n > 64
    tokens, status, *_ = client.predict(GPT2, prompt, *GREEDY, 0, "all", "weights", api_name="/step")
    assert f"The prompt has {n} tokens but the model's context is 64; it keeps the last 64." in status
    assert len(tokens) == 64
    with pytest.raises(AppError) as info:
        client.predict(GPT2, "x" * 2001, *GREEDY, 0, "all", "weights", api_name="/step")
    assert_clean_error(info.value, "the limit is 2,000")


def test_the_hash_recorded_on_first_load_refuses_a_changed_file(real, tmp_path):
    from lab.checks import UserError
    from lab.catalogue.external import ExternalModels, parse_source

    folder = shutil.copytree(real.gpt2, tmp_path / "m")
    hashes = tmp_path / "hashes.json"
    first = ExternalModels([parse_source(str(folder))], hashes)
    assert first.get("m (folder)").sha256 == json.loads(hashes.read_text())[str(folder.resolve())]
    config = folder / "config.json"
    config.write_text(config.read_text() + "\n")  # the same JSON, another file
    later = ExternalModels([parse_source(str(folder))], hashes)
    with pytest.raises(UserError, match="have changed"):
        later.get("m (folder)")


def test_a_nanogpt_run_is_listed_described_and_steps(tmp_path):
    from lab.catalogue.external import ExternalModels, sources_from
    from lab.session import Session
    from model.generate import Sampling
    from tests.support.nanogpt_runs import reference as nanogpt_reference
    from tests.support.nanogpt_runs import save_run

    ckpt = save_run(tmp_path / "out-chars", nanogpt_reference(vocab=35))
    s = Session()
    s.external = ExternalModels(sources_from([str(ckpt)], None), tmp_path / "hashes.json")
    name = "out-chars/ckpt.pt (nanoGPT)"
    entry = s.entry_for(name)
    for part in ("nanoGPT (GPT-2 layout)", "2 layers × 4 heads", "context 32", "char tokenizer",
                 "source local file out-chars/ckpt.pt"):
        assert part in entry.summary, entry.summary
    prompt = next(e for e in entry.examples if e[: len(e) // 2] == e[len(e) // 2:])  # letters, twice
    assert entry.first_view is not None and prompt in entry.examples
    s.step(name, prompt, Sampling(temperature=0.0))
    assert len(s.tokens()) == len(prompt) + 1 and s.probabilities().probs.shape == (36,)


def test_sources_are_read_as_given_and_bad_ones_are_one_sentence(tmp_path):
    from lab.catalogue.external import parse_source, sources_from

    folder = tmp_path / "m"
    folder.mkdir()
    assert parse_source(str(folder)).kind == "folder" and parse_source(str(folder)).shown == "local folder m"
    hub = parse_source("EleutherAI/pythia-14m@step1000")
    assert (hub.kind, hub.repo, hub.revision, hub.shown) == ("hub", "EleutherAI/pythia-14m", "step1000",
                                                              "EleutherAI/pythia-14m@step1000")
    # --model first, then the variable's sources separated by ';', each once
    got = sources_from([str(folder)], f" a/b@main ;;{folder}; c/d@{COMMIT}")
    assert [s.shown for s in got] == ["local folder m", "a/b@main", f"c/d@{COMMIT}"]
    for text, pattern in [("", "empty"), ("a/b", "needs a pinned revision"), (str(tmp_path / "x.pt"), "no file"),
                          ("not a source", "neither a model folder"), ("a/b@../../etc", "neither a model folder")]:
        with pytest.raises(ValueError, match=pattern):
            parse_source(text)
