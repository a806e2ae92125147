"""The lab on a model NDIF runs (`python app.py --model owner/name --backend nnsight --remote`), through nnsight's
own request to the stand-in NDIF on 127.0.0.1 (tests/support/fake_ndif.py): a text steps as on the own engine
with every head's attention, each Step is one request, a patching sweep a few (one per chunk of cells), the
status says the model runs on NDIF and what a Step cost, and the key is in no sentence the lab writes.
"""

from __future__ import annotations

import threading
import types

import numpy as np
import pytest

from lab.catalogue.external import ExternalModels, parse_source, run_by
from lab.checks import UserError
from lab.pairs import pairs_for
from lab.session import Session
from model.generate import Sampling
from model.nnsight_backend import NDIF_HOST_ENV, NDIF_KEY_ENV, nnsight_available
from tests.support.fake_ndif import FakeNDIF
from tests.support.family_folders import family_folder

if not nnsight_available():  # checked without importing it (tests/lab/test_backend_lab.py says why)
    pytest.skip("the nnsight backend needs nnsight (requirements-scale.txt)", allow_module_level=True)

KEY = "lab-test-key-not-a-real-one"
REPO = "fam/llama"  # a repo id as NDIF names models; here also a folder under the test's working directory
PROMPT = "Once upon a time there was a little fox"
GREEDY = Sampling(temperature=0.0, seed=1)


@pytest.fixture
def remote(tmp_path, monkeypatch):
    """(session on NDIF, session on the own engine, fake NDIF): the same llama folder."""
    folder = family_folder("llama", tmp_path / "fam")
    monkeypatch.chdir(tmp_path)
    server = FakeNDIF(KEY, {REPO: folder})
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    import huggingface_hub

    # nnsight asks the Hub how the repo id is spelt; offline, the answer is the id itself
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", lambda self, repo_id, **kw: types.SimpleNamespace(id=repo_id))
    monkeypatch.setenv(NDIF_HOST_ENV, server.url)
    monkeypatch.setenv(NDIF_KEY_ENV, KEY)
    there, here = Session(), Session()
    there.external = ExternalModels([run_by(REPO, "nnsight", remote=True)], tmp_path / "remote.json")
    here.external = ExternalModels([parse_source(str(folder))], tmp_path / "own.json")
    yield there, here, server
    server.shutdown()
    server.server_close()
    thread.join()


def test_a_text_on_ndif_steps_as_on_the_own_engine(remote):
    there, here, server = remote
    name, own = there.external.names[0], here.external.names[0]
    assert name == f"{REPO} (NDIF)"
    for _ in range(3):
        there.step(name, PROMPT, GREEDY)
        here.step(own, PROMPT, GREEDY)
    # the prompt's forward, then one per new token (the picture draws its row); no example runs at opening
    assert len(server.requests) == 1 + 3
    assert there.text.decoder.ids == here.text.decoder.ids
    for a, b in zip(there.text.attention().weights, here.text.attention().weights):
        np.testing.assert_allclose(a, b, atol=1e-5)
    status = there.text.status()
    assert f"runs the whole text once on NDIF ({server.url})" in status and "the last took" in status
    assert f"runs on NDIF ({server.url}), {REPO}" in there.entry_for(name).summary
    assert KEY not in status and KEY not in there.entry_for(name).summary


def test_a_sweep_on_ndif_is_a_request_per_chunk_and_a_refusal_names_ndif(remote):
    there, here, server = remote
    name, own = there.external.names[0], here.external.names[0]
    pair = pairs_for(there.entry_for(name))[0]
    ids = there.entry_for(name).tokenizer.encode(pair.a)
    answer, other = (there.entry_for(name).tokenizer.piece(i) for i in ids[1:3])
    before = len(server.requests)
    a = there.sweeps.run(name, pair.a, pair.b, "logit_diff", answer, other, "heads", "denoising")
    b = here.sweeps.run(own, pair.a, pair.b, "logit_diff", answer, other, "heads", "denoising")
    np.testing.assert_allclose(a.metric, b.metric, atol=1e-5)
    # A and B once each, then the 12 head cells in one chunk (512 patched tokens hold them all)
    assert len(server.requests) - before == 3
    there.step(name, PROMPT, GREEDY)
    with pytest.raises(UserError, match="runs on NDIF") as refused:
        there.heads.lens()
    assert KEY not in str(refused.value)
