"""The circuit methods (model/circuits.py) on GPT-2 small's shape, one torch thread.

GPT-2 small's shape with random weights (12 layers × 12 heads, d_model 768, 50,257 tokens, tied
embedding; nothing downloaded), built directly as a DecoderLM:

* dla: direct logit attribution at one token once the forward is recorded (the recorded forward at
  --tokens positions is timed apart), at the first, a middle and the last position. Target ≤ 5 ms.
* composition: all Q-, K- and V-composition scores (3 × 144 × 144, the 66 pairs of layers), float64,
  once per model; beside it a few pairs checked against the dense C × C definition. Target ≤ 10 s.
* ov: one head's OV circuit (copying score through the hs × hs factor, top tokens of 16 inputs), and
  every head's copying score through W_Uᵀ W_E; qk: one head's QK circuit on the prompt.

    python -m bench.circuits [--reps 20] [--tokens 64] [--skip composition]

Each row prints its target, whether it is met (met: by the median wall time; met_cpu: by the thread's CPU
time, which on a loaded machine comes closer to what an idle core takes), the CPU model, the threads and
the machine load.
"""

from __future__ import annotations

import torch

from bench.common import emit, parser, summary
from bench.real_app import Clock
from bench.real_models import cpu_model
from model.circuits import composition_scores, copying_scores, direct_logit_attribution, ov_circuit, qk_circuit
from model.config import ModelConfig
from model.transformer import DecoderLM

TARGETS = {"dla_ms": 5.0, "composition_s": 10.0, "composition_draw_ms": 50.0}


def gpt2_small() -> DecoderLM:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=50257, block_size=1024, n_layers=12, n_heads=12, d_model=768,
                      gelu_approximate="tanh", tie_weights=True)
    return DecoderLM(cfg).eval()


def common() -> dict:
    return {"cpu": cpu_model(), "threads": torch.get_num_threads()}


def timed(fn, reps: int) -> tuple[dict, dict, object]:
    """(wall ms summary, CPU ms summary, last result) over `reps` runs after one warm-up."""
    result = fn()
    wall, cpu = [], []
    for _ in range(reps):
        with Clock() as c:
            result = fn()
        wall.append(c.s)
        cpu.append(c.cpu)
    return summary(wall, digits=3), summary(cpu, digits=3), result


def dla(model: DecoderLM, ids: torch.Tensor, reps: int) -> None:
    T = ids.shape[1]
    with torch.no_grad():
        fwd_wall, fwd_cpu, out = timed(lambda: model(ids, record=True), max(1, reps // 4))
    emit("circuits_recorded_forward", tokens=T, ms=fwd_wall, cpu_ms=fwd_cpu, **common())
    for t in (0, T // 2, T - 1):
        wall, cpu, r = timed(lambda: direct_logit_attribution(model, out, t, 464, 262), reps)
        met, met_cpu = wall["median"] <= TARGETS["dla_ms"], cpu["median"] <= TARGETS["dla_ms"]
        emit("circuits_dla", tokens=T, position=t, ms=wall, cpu_ms=cpu, target_ms=TARGETS["dla_ms"], met=met,
             met_cpu=met_cpu,
             sum_error=abs(r.direct_sum + r.remainder - float(out.logits[0, t, 464] - out.logits[0, t, 262])),
             **common())


def dense_check(model: DecoderLM, scores, pairs) -> float:
    """Largest |score - dense definition| over a few (l1, i, l2, j) pairs, with explicit C × C matrices."""
    from model.circuits_weights import layer_factors

    worst = 0.0
    for l1, i, l2, j in pairs:
        a, b = layer_factors(model, l1), layer_factors(model, l2)
        ov = a.v[a.kv(i)] @ a.o[i]
        qk = b.q[j] @ b.k[b.kv(j)].T
        ov2 = b.v[b.kv(j)] @ b.o[j]
        fro = torch.linalg.matrix_norm
        want = {"q": fro(ov @ qk) / (fro(ov) * fro(qk)), "k": fro(ov @ qk.T) / (fro(ov) * fro(qk)),
                "v": fro(ov @ ov2) / (fro(ov) * fro(ov2))}
        worst = max(worst, *(abs(scores.of(k)[l1, i, l2, j] - float(w)) for k, w in want.items()))
    return worst


def composition(model: DecoderLM) -> None:
    with Clock() as c:
        scores = composition_scores(model)
    err = dense_check(model, scores, [(0, 0, 1, 0), (3, 7, 11, 2), (10, 11, 11, 5)])
    cfg = model.cfg
    flops = 2 * (cfg.n_layers * (cfg.n_layers - 1) // 2) * (cfg.n_heads * cfg.head_dim) * cfg.d_model * \
        3 * cfg.n_heads * cfg.head_dim
    pairs = 3 * (cfg.n_layers * (cfg.n_layers - 1) // 2) * cfg.n_heads ** 2  # kinds × layer pairs × head pairs
    emit("circuits_composition", pairs=pairs, seconds=round(c.s, 2), cpu_s=round(c.cpu, 2),
         gflop=round(flops / 1e9, 1), target_s=TARGETS["composition_s"],
         met=c.s <= TARGETS["composition_s"], met_cpu=c.cpu <= TARGETS["composition_s"],
         max_error_vs_dense=err, strongest_k=scores.top("k", 1), **common())
    draw(scores)


def draw(scores, reps: int = 10) -> None:
    """The composition map of the kept scores, as the page draws it after a kind is chosen: the figure and its
    JSON (what goes to the browser), nothing computed again."""
    from viz import plot_json
    from viz.circuits import composition_map

    def one(kind: str) -> str:
        return plot_json(composition_map(scores.of(kind), kind=kind, top=[tuple(t[:4]) for t in scores.top(kind, 5)],
                                         width_px=1366, max_height_px=900))

    for kind in ("q", "k", "v"):
        wall, cpu, spec = timed(lambda: one(kind), reps)
        emit("circuits_composition_draw", kind=kind, ms=wall, cpu_ms=cpu, json_kb=round(len(spec) / 1024, 1),
             target_ms=TARGETS["composition_draw_ms"], met=wall["median"] <= TARGETS["composition_draw_ms"],
             **common())


def circuits(model: DecoderLM, ids: torch.Tensor, reps: int) -> None:
    inputs = ids[0, :16].tolist()
    wall, cpu, ov = timed(lambda: ov_circuit(model, 5, 1, inputs=inputs, top_k=10), max(1, reps // 4))
    emit("circuits_ov_one_head", inputs=len(inputs), ms=wall, cpu_ms=cpu, copying=round(ov.copying, 6), **common())
    with Clock() as c:
        every = copying_scores(model)
    emit("circuits_ov_every_head", heads=int(every.size), seconds=round(c.s, 2), cpu_s=round(c.cpu, 2),
         same_as_one_head=abs(every[5, 1] - ov.copying), **common())
    tokens = ids[0].tolist()
    wall, cpu, _ = timed(lambda: qk_circuit(model, 5, 1, tokens), reps)
    emit("circuits_qk_one_head", tokens=len(tokens), ms=wall, cpu_ms=cpu, **common())


def main() -> None:
    p = parser("circuits", __doc__)
    p.add_argument("--reps", type=int, default=20, help="timed runs after one warm-up (DLA, QK)")
    p.add_argument("--tokens", type=int, default=64, help="prompt length of the recorded forward")
    p.add_argument("--skip", default="", help="comma-separated parts to leave out: dla, composition, ov")
    args = p.parse_args()
    torch.set_num_threads(1)  # as the app runs a request (DECODER_LAB_THREADS)
    skip = set(args.skip.split(","))
    model = gpt2_small()
    ids = torch.randint(0, 50257, (1, args.tokens), generator=torch.Generator().manual_seed(0))
    if "dla" not in skip:
        dla(model, ids, args.reps)
    if "ov" not in skip:
        circuits(model, ids, args.reps)
    if "composition" not in skip:
        composition(model)


if __name__ == "__main__":
    main()
