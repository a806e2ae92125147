"""Real model sizes, Decoder Lab against transformers (the reference implementation), one torch thread.

Random weights of the real shapes are built here with transformers' own classes (nothing is
downloaded): GPT-2 small (124 M parameters) and Pythia-70m (GPT-NeoX), imported with
model.families. Measured, each ratio from runs of both sides interleaved in this one process:

* step: one cached Step with attention captured, the context at T = 64 and 256 tokens after it.
  Decoder Lab's `Decoder.step` (sampling, the forward of one token with its KV cache, the
  attention rows, the grown (H, T, T) matrices the app draws) and, apart, its model's forward
  alone; against transformers' forward of the same token with its DynamicCache and
  output_attentions=True (eager attention, which is what returns weights). Target ≤ 1.0×.
* generate: 100 greedy tokens after a 16-token prompt, no attention captured (model.generate's
  `generate(..., attention="none")`) against transformers' `generate` (its default SDPA
  attention, KV cache), tokens per second. Target ≥ 1.0×.
* memory: the resident memory a child process gains opening a GPT-2 small folder
  (`model.families.open_folder`, the path the app and the command line use) against the fp32
  bytes of its weights. Target ≤ 1.2×.

    python -m bench.real_models [--reps 7] [--gen-reps 3] [--models gpt2,pythia]

Absolute times are printed beside each ratio, with the CPU model and the machine load.
"""

from __future__ import annotations

import gc
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.common import emit, parser

LENGTHS = (64, 256)
PROMPT = 16
NEW = 100


def cpu_model() -> str:
    with open("/proc/cpuinfo") as f:
        return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "unknown")


def reference(name: str):
    """A transformers model of `name`'s real shape with random weights (eager attention)."""
    from transformers import GPT2Config, GPT2LMHeadModel, GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(0)
    if name == "gpt2":  # 12 layers × 768, 50257 tokens, 1024 positions: 124 M parameters
        return GPT2LMHeadModel(GPT2Config(attn_implementation="eager")).eval()
    if name == "pythia-70m":
        return GPTNeoXForCausalLM(GPTNeoXConfig(
            vocab_size=50304, hidden_size=512, num_hidden_layers=6, num_attention_heads=8, intermediate_size=2048,
            max_position_embeddings=2048, rotary_pct=0.25, rotary_emb_base=10000, use_parallel_residual=True,
            hidden_act="gelu", tie_word_embeddings=False, attn_implementation="eager")).eval()
    raise SystemExit(f"unknown model {name!r}; choose gpt2 or pythia-70m")


def ours(ref):
    """The same weights imported by model.families (the importer the folders go through)."""
    from model.families import common, family_of

    hf = ref.config.to_dict()
    return common.from_state(family_of(hf), hf, {k: v.detach().clone() for k, v in ref.state_dict().items()})


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def bench_step(name: str, ref, model, T: int, reps: int, bench: str = "real_models.step",
               target: str = "ratio_step <= 1.0") -> None:
    """Decoder.step, the engine's forward alone and transformers' forward at context T, interleaved;
    medians emitted as `bench` (bench/real_families.py reuses this with its own name and targets)."""
    from transformers import DynamicCache

    from model.generate import Decoder, Sampling

    g = torch.Generator().manual_seed(T)
    ids = torch.randint(0, 1000, (T - 1,), generator=g).tolist()
    decoder = Decoder(model, ids, Sampling(temperature=0.0), capture_attention=True)
    token = int(decoder.logits.argmax())  # what the Step takes (greedy): the T-th token
    cache = DynamicCache(config=ref.config)
    with torch.inference_mode():
        ref(torch.tensor([ids]), past_key_values=cache, use_cache=True)
    x = torch.tensor([[token]])
    step_s, forward_s, theirs_s = [], [], []

    @torch.inference_mode()
    def their_step():
        out = ref(x, past_key_values=cache, use_cache=True, output_attentions=True)
        return out.logits, out.attentions

    @torch.inference_mode()
    def our_forward():
        return model(x, return_attention=True, cache=decoder.cache)

    for _ in range(reps):
        theirs_s.append(timed(their_step))
        cache.crop(-1)  # drop the token just added: back to T - 1 cached tokens
        forward_s.append(timed(our_forward))  # the decoder's cache is read, not changed
        step_s.append(timed(decoder.step))
        decoder.undo()  # back to T - 1 tokens (a fresh prefill, not timed)
    med = {k: statistics.median(v) for k, v in (("step", step_s), ("forward", forward_s), ("theirs", theirs_s))}
    emit(bench, model=name, T=T, reps=reps,
         decoder_step_ms=round(med["step"] * 1e3, 2), engine_forward_ms=round(med["forward"] * 1e3, 2),
         transformers_ms=round(med["theirs"] * 1e3, 2),
         ratio_step=round(med["step"] / med["theirs"], 3), ratio_forward=round(med["forward"] / med["theirs"], 3),
         target=target)


def bench_generate(name: str, ref, model, reps: int) -> None:
    from model.generate import Decoder, Sampling, generate

    ids = torch.randint(0, 1000, (PROMPT,), generator=torch.Generator().manual_seed(1)).tolist()
    fast = ref
    if hasattr(ref, "set_attn_implementation"):
        ref.set_attn_implementation("sdpa")  # transformers at its fastest: no weights returned
    got: dict[str, list[int]] = {}

    @torch.inference_mode()
    def ours_run():
        decoder = Decoder(model, ids, Sampling(temperature=0.0), capture_attention=False)
        got["ours"] = [s.token_id for s in generate(decoder, NEW, attention="none")]

    @torch.inference_mode()
    def theirs_run():
        out = fast.generate(torch.tensor([ids]), max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
                            pad_token_id=0, eos_token_id=None)
        got["theirs"] = out[0, PROMPT:].tolist()

    ours_s, theirs_s = [], []
    for _ in range(reps):
        theirs_s.append(timed(theirs_run))
        ours_s.append(timed(ours_run))
    if hasattr(ref, "set_attn_implementation"):
        ref.set_attn_implementation("eager")
    a, b = NEW / statistics.median(ours_s), NEW / statistics.median(theirs_s)
    emit("real_models.generate", model=name, new_tokens=NEW, prompt=PROMPT, reps=reps,
         decoder_lab_tok_s=round(a, 2), transformers_tok_s=round(b, 2), ratio=round(a / b, 3),
         same_tokens=got["ours"] == got["theirs"], target="ratio >= 1.0")


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def memory_child(folder: str) -> None:
    """Run in a child: print the RSS an open_folder of `folder` adds, and the weights' fp32 bytes."""
    import json

    from model.families import open_folder

    gc.collect()
    before = rss_bytes()
    model, _ = open_folder(folder)
    gc.collect()
    after = rss_bytes()
    weights = sum(p.numel() for p in model.parameters()) * 4  # a tied head is one tensor, counted once
    print(json.dumps({"rss_added": after - before, "weight_bytes": weights}))


def bench_memory(ref) -> None:
    import json

    from tests.support.families import write_tokenizer

    with tempfile.TemporaryDirectory(prefix="decoder-lab-bench-") as tmp:
        ref.save_pretrained(tmp)
        write_tokenizer(Path(tmp), 300)
        env = dict(os.environ, OMP_NUM_THREADS="1")
        done = subprocess.run([sys.executable, "-m", "bench.real_models", "--memory-child", tmp], env=env,
                              capture_output=True, text=True, check=True)
    m = json.loads(done.stdout.strip().splitlines()[-1])
    emit("real_models.memory", model="gpt2", rss_added_mb=round(m["rss_added"] / 2**20, 1),
         fp32_weights_mb=round(m["weight_bytes"] / 2**20, 1), ratio=round(m["rss_added"] / m["weight_bytes"], 3),
         target="ratio <= 1.2")


def main() -> None:
    p = parser("real_models", __doc__)
    p.add_argument("--reps", type=int, default=7, help="timed Steps per side and length")
    p.add_argument("--gen-reps", type=int, default=3, help="timed 100-token generations per side")
    p.add_argument("--models", default="gpt2,pythia-70m", help="comma-separated: gpt2, pythia-70m")
    p.add_argument("--skip", default="", help="comma-separated parts to skip: step, generate, memory")
    p.add_argument("--memory-child", help=argparse_hidden())
    args = p.parse_args()
    if args.memory_child:
        return memory_child(args.memory_child)
    torch.set_num_threads(1)
    emit("real_models.machine", cpu=cpu_model(), torch_threads=torch.get_num_threads(), torch=torch.__version__)
    skip = set(args.skip.split(","))
    for name in args.models.split(","):
        ref = reference(name)
        model = ours(ref)
        if "step" not in skip:
            for T in LENGTHS:
                bench_step(name, ref, model, T, args.reps)
        if "generate" not in skip:
            bench_generate(name, ref, model, args.gen_reps)
        del model, ref
        gc.collect()
    if "memory" not in skip:
        bench_memory(reference("gpt2"))


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
