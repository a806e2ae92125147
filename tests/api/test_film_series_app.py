"""A film made from a series of checkpoints (`python -m model.film`, tests/engine/test_film_series.py holds
its frames to transformers') opens in the Train tab's film viewer of a running app, both ways the app
takes a model file: added by whoever runs it (`python app.py --model FILE.safetensors`: any size, as a
Pythia-14m film needs) and uploaded by a visitor (within the upload limits). What /film draws is the
file's frames.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from gradio_client import Client, handle_file

from lab.catalogue.external import parse_source
from model.checkpoint import load_checkpoint
from model.film_series import main as film_main
from tests.support.api import QUANT, panels
from tests.support.series import PROBE, build_series, revisions
from tests.support.server import AppServer

NAME = "series-film (file)"  # the file's stem, as the model list names a file added with --model


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("series-app")
    build_series(tmp / "gpt2")
    path = tmp / "series-film.safetensors"
    assert film_main([str(tmp / "gpt2"), "--revisions", ",".join(revisions()), "--probe", PROBE,
                      "--out", str(path)]) == 0
    server = AppServer({"DECODER_LAB_MODEL_HASHES": str(tmp / "hashes.json"), "DECODER_LAB_BUSY_WAIT_S": "600"},
                       tmp, args=["--model", str(path)]).start()
    yield SimpleNamespace(server=server, path=path, film=load_checkpoint(path).film)
    server.stop()


def check_frame(answer, film, i: int, layer: int) -> None:
    attention, _, _, phases, caption = answer
    frame = film.frames[i]
    assert f"Frame {i + 1} of {len(film.frames)}: step {frame.step} of {film.total_steps}" in caption
    assert f"loss on the probe {frame.train_loss:.2f}" in caption  # the probe's own loss, never called "train"
    assert "train" not in caption and "validation" not in caption
    assert film.phases() and film.phases()[0].sentence() in phases
    shown, held = panels(attention), frame.attention[layer]  # (H, T, T): masked cells are NaN on the page
    assert shown.shape == held.shape
    np.testing.assert_array_equal(np.isnan(shown), np.triu(np.ones_like(held, dtype=bool), k=1))
    np.testing.assert_allclose(np.nan_to_num(shown), held, atol=QUANT, rtol=0)


def test_a_series_film_given_with_model_opens_in_the_film_viewer(app):
    c = Client(app.server.url, verbose=False)
    film = app.film
    for i in (0, len(film.frames) - 1):
        check_frame(c.predict(NAME, i, 1, "induction", api_name="/film"), film, i, layer=1)
    # the same file, uploaded by a visitor (it is within the upload limits): the same film
    status, model_dd = c.predict(handle_file(str(app.path)), api_name="/upload_model")
    assert model_dd["value"] == "uploaded: series-film", status
    check_frame(c.predict("uploaded: series-film", 2, 0, "previous_token", api_name="/film"), film, 2, layer=0)


def test_a_decoder_lab_file_is_a_source_of_its_own(app, tmp_path):
    source = parse_source(str(app.path))
    assert (source.kind, source.name, source.shown) == ("file", NAME, "local file series-film.safetensors")
    with pytest.raises(ValueError, match="no file"):
        parse_source(str(tmp_path / "absent.safetensors"))
