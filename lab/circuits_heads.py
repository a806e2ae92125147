"""One head's OV and QK circuits on the person's text, for the Circuits view (model.circuits.ov_circuit and
qk_circuit): the copying score and spectrum of its OV circuit, the tokens it writes most for each distinct token
of the text, and the bilinear query-key scores between the text's tokens, without and with their positions. A
record with its JSON and its download, as lab.circuits_records writes the view's other methods.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from model.circuits import ov_circuit, qk_circuit

from .catalogue.models import ModelEntry
from .checks import check_int
from .circuits_records import engine_refusal, json_grid, json_number
from .downloads import Export, to_csv
from .headsettings import head_label, need_text
from .server.files import file_name, model_stem
from .text import Text

MAX_OV_INPUTS = 32  # distinct tokens of the text whose OV rows are read (the last ones, nearest the selection)
MAX_QK_TOKENS = 64  # the QK circuit is drawn on the text's last tokens, at most this many
OV_TOP = 5  # tokens each input makes the head write, by default
MAX_OV_TOP = 20


@dataclass
class HeadCircuits:
    """One head's OV circuit (copying score, spectrum, the top tokens it writes for each of the text's distinct
    tokens `inputs`) and its QK circuit on the text's last tokens (`qk_tokens`, from window position
    `qk_start`): plain (token embeddings alone) and positional (T, T), rows queries, columns keys; allowed
    (T, T): the keys the layer's mask lets each query read."""

    model: str
    layer: int
    head: int
    kv_head: int
    folded: bool
    copying: float
    eigenvalues: np.ndarray
    inputs: list[int]
    input_pieces: list[str]
    top_ids: np.ndarray
    top_pieces: list[list[str]]
    top_values: np.ndarray
    own_value: np.ndarray
    own_rank: np.ndarray
    qk_tokens: list[str]
    qk_start: int
    plain: np.ndarray
    positional: np.ndarray
    allowed: np.ndarray
    positions: str
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        copied = int((self.own_rank == 0).sum())
        return (f"{head_label(self.layer, self.head)}: copying score {self.copying:+.2f}; it writes the token it "
                f"reads as its top token for {copied} of the text's {len(self.inputs)} distinct tokens")

    def to_json(self) -> dict:
        return {"what": "head circuits", "model": self.model, "layer": self.layer, "head": self.head,
                "head_label": head_label(self.layer, self.head), "kv_head": self.kv_head, "folded": self.folded,
                "copying": json_number(self.copying), "eigenvalues_real": json_grid(self.eigenvalues.real),
                "eigenvalues_imag": json_grid(self.eigenvalues.imag), "inputs": self.input_pieces,
                "input_ids": self.inputs, "top_tokens": self.top_pieces, "top_ids": self.top_ids.tolist(),
                "top_values": json_grid(self.top_values),
                "own_value": json_grid(self.own_value), "own_rank": self.own_rank.tolist(),
                "qk_tokens": self.qk_tokens, "qk_start": self.qk_start, "qk_plain": json_grid(self.plain),
                "qk_positional": json_grid(self.positional), "qk_allowed": self.allowed.tolist(),
                "positions": self.positions, "summary": self.summary(), "notes": self.notes}


def circuit_flops(entry: ModelEntry, n_inputs: int) -> float:
    """Operations of one head's OV circuit (two passes of hs × C over the used vocabulary, then each input's
    row over it); the QK circuit on ≤ MAX_QK_TOKENS tokens is small beside it."""
    cfg = entry.cfg
    vocab = cfg.vocab_used or cfg.vocab_size
    return 2 * vocab * cfg.d_model * (2 * cfg.head_dim + n_inputs)


def _distinct_last(ids: list[int], n: int) -> list[int]:
    """The distinct tokens of `ids` in order of first appearance, the last `n` of them to appear."""
    seen: dict[int, int] = {}
    for i, t in enumerate(ids):
        seen.setdefault(t, i)
    last = {t: i for i, t in enumerate(ids)}
    keep = set(sorted(last, key=lambda t: -last[t])[:n])
    return [t for t in sorted(seen, key=seen.get) if t in keep]


def head_circuits(text: Text, layer, head, top_k=OV_TOP, fold: bool = True) -> HeadCircuits:
    """One head's OV and QK circuits (model.circuits.ov_circuit, qk_circuit) on the text's tokens."""
    need_text(text)
    entry = text.entry
    cfg = entry.cfg
    layer = check_int("layer", layer, 0, cfg.n_layers - 1)
    head = check_int("head", head, 0, cfg.n_heads - 1)
    top_k = check_int("top tokens", top_k, 1, MAX_OV_TOP)
    window = list(text.decoder.window)
    n_used = cfg.vocab_used or cfg.vocab_size
    inputs = [t for t in _distinct_last(window, MAX_OV_INPUTS) if t < n_used]
    qk_ids = window[-MAX_QK_TOKENS:]
    try:
        ov = ov_circuit(entry.model, layer, head, inputs, top_k, fold)
        qk = qk_circuit(entry.model, layer, head, qk_ids, fold)
    except ValueError as exc:
        raise engine_refusal(exc) from None
    pieces = entry.pieces
    notes = []
    if len(set(window)) > len(inputs):
        notes.append(f"The OV table reads the last {len(inputs)} distinct tokens of the text.")
    if len(qk_ids) < len(window):
        notes.append(f"The QK circuit reads the text's last {len(qk_ids)} tokens, placed at positions 0–"
                     f"{len(qk_ids) - 1} as a prompt of their own.")
    return HeadCircuits(entry.name, layer, head, head // (cfg.n_heads // cfg.kv_heads), fold, ov.copying,
                        ov.eigenvalues, list(ov.inputs), [pieces[i] for i in ov.inputs], ov.top_ids,
                        [[pieces[int(i)] for i in row] for row in ov.top_ids], ov.top_values, ov.own_value,
                        ov.own_rank, [pieces[i] for i in qk_ids], len(window) - len(qk_ids), qk.plain,
                        qk.positional, qk.allowed, qk.positions, notes)


CIRCUIT_COLUMNS = ["part", "i", "token_i", "j", "token_j", "value", "allowed"]


def circuits_export(r: HeadCircuits) -> Export:
    """The copying score, the spectrum, the OV table (top tokens, each input's own entry and rank) and both QK
    grids, one CSV line per number."""
    rows: list[list] = [["copying score", None, None, None, None, r.copying, None]]
    rows += [[f"eigenvalue {part}", n, None, None, None, float(getattr(lam, part)), None]
             for n, lam in enumerate(r.eigenvalues) for part in ("real", "imag")]
    for i, piece in enumerate(r.input_pieces):
        rows += [["ov top", i, piece, rank, r.top_pieces[i][rank], float(r.top_values[i, rank]), None]
                 for rank in range(r.top_values.shape[1])]
        rows.append(["ov own (rank in j)", i, piece, int(r.own_rank[i]), piece, float(r.own_value[i]), None])
    for name, grid in (("qk plain", r.plain), ("qk positional", r.positional)):
        rows += [[name, r.qk_start + q, r.qk_tokens[q], r.qk_start + k, r.qk_tokens[k], float(grid[q, k]),
                  bool(r.allowed[q, k])] for q in range(grid.shape[0]) for k in range(grid.shape[1])]
    name = file_name(model_stem(r.model), f"L{r.layer}H{r.head}", "circuits")
    return Export(name, to_csv(CIRCUIT_COLUMNS, rows), r.to_json())
