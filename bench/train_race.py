"""Issue 16's race: wall clock from process start to a whole-held-out validation loss <= 1.89 (Tiny
Shakespeare, the train_bench model), the default against fp32 eager, back to back, each in a fresh
process with an empty torch.compile cache (cold). Prints both runs' JSON lines and one line of ratios.

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

# fp32_eager is the plain loop (autograd on the module, math attention, fused AdamW); fp32_manual shows how much of
# the default's lead is the hand-written step and how much is bf16
VARIANTS = {"default": [], "fp32_eager": ["--no-bf16", "--compile", "none", "--backward", "autograd"],
            "fp32_manual": ["--no-bf16", "--compile", "none", "--backward", "manual"]}


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
    d, e = runs["default"], runs["fp32_eager"]

    def wall(r):
        return r["target_reached_at"]["wall_s_from_process_start"] if r["target_reached_at"] else None

    emit("train_race", device=args.device, target=args.target, default_compile=d["compile"], default_bf16=d["bf16"],
         default_backward=d["backward"],
         ms_per_iter={name: r["ms_per_iter_median"] for name, r in runs.items()},
         per_iter_ratio=round(d["ms_per_iter_median"] / e["ms_per_iter_median"], 3),
         wall_to_target_s={name: wall(r) for name, r in runs.items()},
         wall_ratio=round(wall(d) / wall(e), 3) if wall(d) and wall(e) else None,
         val_loss={name: r["val_loss"] for name, r in runs.items()})


if __name__ == "__main__":
    main()
