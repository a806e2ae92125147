"""The training race: wall clock from process start to a whole-held-out validation loss <= 1.89 (Tiny
Shakespeare, the train_bench model), the default against fp32 eager, back to back, each in a fresh
process with an empty torch.compile cache (cold). Prints every run's JSON line and one line of ratios.

fp32 eager runs twice: with the math attention kernel (--sdpa math, what earlier races used) and with
the kernel PyTorch picks itself (--sdpa auto, train_bench's default: flash attention on the CPU, what a
plain loop calling scaled_dot_product_attention gets). Which is faster depends on the CPU, so the ratios are taken
against the faster of the two (per iteration and in wall clock alike), and against each in
ratios_vs.

    python -m bench.train_race                    # CPU, all cores
    python -m bench.train_race --device cuda      # on a GPU
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from bench.common import emit, parser

# the fp32_eager variants are the plain loop (autograd on the module, fused AdamW), on the math attention kernel and on
# the one PyTorch picks; fp32_manual shows how much of the default's lead is the hand-written step and how much is bf16
FP32_EAGER = ["--no-bf16", "--compile", "none", "--backward", "autograd"]
VARIANTS = {"default": [], "fp32_eager": [*FP32_EAGER, "--sdpa", "math"],
            "fp32_eager_sdpa_auto": [*FP32_EAGER, "--sdpa", "auto"],
            "fp32_manual": ["--no-bf16", "--compile", "none", "--backward", "manual"]}
BASELINES = ("fp32_eager", "fp32_eager_sdpa_auto")


def main() -> None:
    p = parser("train_race", __doc__)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--target", type=float, default=1.89)
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--text", default=None)
    p.add_argument("--check-every", type=int, default=250, help="iterations between checks of the held-out loss")
    args = p.parse_args()
    runs = {}
    for name, flags in VARIANTS.items():
        cmd = [sys.executable, "-m", "bench.train_bench", "--device", args.device, "--target", str(args.target),
               "--iters", str(args.iters), "--check-every", str(args.check_every),
               *(["--text", args.text] if args.text else []), *flags]
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(prefix="inductor-cold-")}
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout
        runs[name] = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
        print(json.dumps(runs[name]))
    emit("train_race", device=args.device, target=args.target, **summarize(runs))


def wall(run: dict) -> float | None:
    """Seconds from process start to the target loss (None: never reached)."""
    return run["target_reached_at"]["wall_s_from_process_start"] if run["target_reached_at"] else None


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def summarize(runs: dict[str, dict]) -> dict:
    """The race's line from each variant's train_bench result: the default's ratios per iteration and in
    wall clock against the faster fp32 eager loop (each measure's own fastest; in wall clock only loops
    that reached the target count), and against each loop in ratios_vs."""
    d = runs["default"]
    ms = {name: r["ms_per_iter_median"] for name, r in runs.items()}
    walls = {name: wall(r) for name, r in runs.items()}
    fastest_iter = min(BASELINES, key=lambda name: ms[name])
    reached = [name for name in BASELINES if walls[name]]
    fastest_wall = min(reached, key=lambda name: walls[name]) if reached else None
    return dict(default_compile=d["compile"], default_bf16=d["bf16"], default_backward=d["backward"], ms_per_iter=ms,
                per_iter_ratio=ratio(ms["default"], ms[fastest_iter]), per_iter_baseline=fastest_iter,
                wall_to_target_s=walls,
                wall_ratio=ratio(walls["default"], walls.get(fastest_wall)), wall_baseline=fastest_wall,
                ratios_vs={name: {"per_iter": ratio(ms["default"], ms[name]), "wall": ratio(walls["default"], walls[name])}
                           for name in BASELINES},
                val_loss={name: r["val_loss"] for name, r in runs.items()})


if __name__ == "__main__":
    main()
