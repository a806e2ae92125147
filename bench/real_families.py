"""Real sizes of the newer families, Decoder Lab against transformers (the reference), one torch thread.

bench/real_models.py measures GPT-2 small and Pythia-70m; this file measures, with the same
helpers and the same definitions, random-weight models of the real shapes of the families issue 39
opens, each built with transformers' own classes from a config written here (nothing is
downloaded). The sizes are those of the published config.json files on the Hugging Face Hub,
written from memory of them (the model each comes from is named beside its config below):

* step: one cached Step with attention captured at T = 64 (real_models.bench_step: Decoder.step and
  the engine's forward alone against transformers' forward of one token with its DynamicCache and
  output_attentions=True, eager attention), the three interleaved in one process, medians.
  Targets: ratio ≤ 1.0× for every family; ≤ 150 ms on Gemma-3-270M's shape, ≤ 400 ms on
  Qwen3-0.6B's.
* memory: the resident memory a child process gains opening the model's folder
  (model.families.open_folder, the path the app and the command line use) against the fp32 bytes
  of its weights. Target ≤ 1.2×. The folder is written to a temporary directory, one family at a
  time, and deleted after.

A model whose fp32 weights do not fit (this process holds transformers' copy and the engine's; the
memory child a third) or whose folder does not fit on the temporary disk is skipped with a printed
reason: Phi-3-mini (3.8 B parameters, 15 GB in fp32) is listed so that the skip is on the record.

    python -m bench.real_families [--reps 5] [--families gemma-3-270m,qwen3-0.6b,...] [--skip step,memory]

Absolute times are printed beside each ratio, with the CPU model and the machine load.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from bench.common import emit, parser
from bench.real_models import bench_step, cpu_model, ours

T = 64
# Absolute targets of issue 39 for a cached Step at T = 64 (milliseconds, one thread).
STEP_MS_TARGETS = {"gemma-3-270m": 150.0, "qwen3-0.6b": 400.0}
# This process holds transformers' weights and the engine's copy (from_state clones them once more
# while converting); the memory child holds a third copy while this process holds one.
MEMORY_COPIES = 2.5
DISK_MARGIN = 1.15  # safetensors headers, the tokenizer, and room for the filesystem

# name -> (transformers config class, its arguments, where the numbers come from)
SHAPES: dict[str, tuple[str, dict, str]] = {
    "gemma-3-270m": ("Gemma3TextConfig", dict(
        vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4,
        num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256, sliding_window=512,
        layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 3, max_position_embeddings=32768,
        rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}}),
        "google/gemma-3-270m config.json (rope_theta 1e6, rope_local_base_freq 1e4, 5 local : 1 global)"),
    "qwen3-0.6b": ("Qwen3Config", dict(
        vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, rms_norm_eps=1e-6,
        tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0}),
        "Qwen/Qwen3-0.6B config.json"),
    "qwen2.5-0.5b": ("Qwen2Config", dict(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0}),
        "Qwen/Qwen2.5-0.5B config.json (use_sliding_window false)"),
    "smollm2-135m": ("LlamaConfig", dict(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, max_position_embeddings=8192, rms_norm_eps=1e-5, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 100_000.0}),
        "HuggingFaceTB/SmolLM2-135M config.json (SmolLM3-3B stands aside: too large for a quick run)"),
    "llama-3.2-1b": ("LlamaConfig", dict(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, max_position_embeddings=131072, rms_norm_eps=1e-5,
        tie_word_embeddings=True, rope_parameters={
            "rope_type": "llama3", "rope_theta": 500_000.0, "factor": 32.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
        "meta-llama/Llama-3.2-1B config.json"),
    "olmo-2-0425-1b": ("Olmo2Config", dict(
        vocab_size=100352, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=16,
        num_key_value_heads=16, max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 500_000.0}),
        "allenai/OLMo-2-0425-1B config.json"),
    "phi-3-mini": ("Phi3Config", dict(
        vocab_size=32064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=32, max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000.0}),
        "microsoft/Phi-3-mini-4k-instruct config.json"),
}
CAUSAL_LM = {"Gemma3TextConfig": "Gemma3ForCausalLM", "Qwen3Config": "Qwen3ForCausalLM",
             "Qwen2Config": "Qwen2ForCausalLM", "LlamaConfig": "LlamaForCausalLM",
             "Olmo2Config": "Olmo2ForCausalLM", "Phi3Config": "Phi3ForCausalLM"}


def config_of(name: str):
    import transformers

    cls, kwargs, _ = SHAPES[name]
    return getattr(transformers, CAUSAL_LM[cls]), getattr(transformers, cls)(**kwargs, attn_implementation="eager")


def weight_bytes(name: str) -> int:
    """fp32 bytes of the model's parameters (a tied head counted once), from a model on the meta
    device: nothing is allocated."""
    model_cls, cfg = config_of(name)
    with torch.device("meta"):
        model = model_cls(cfg)
    return sum(p.numel() for p in model.parameters()) * 4


def reference(name: str):
    """transformers' model of `name`'s shape with random weights (its own initialisation), eager."""
    model_cls, cfg = config_of(name)
    torch.manual_seed(0)
    return model_cls(cfg).eval()


def available_bytes() -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))


def why_skip(name: str, parts: set[str]) -> str | None:
    """A sentence when this machine cannot hold `name`'s model now (memory, or disk for its folder)."""
    need = weight_bytes(name)
    gb = need / 1e9
    if MEMORY_COPIES * need > available_bytes():
        return (f"{gb:.1f} GB of fp32 weights need about {MEMORY_COPIES * gb:.0f} GB here (transformers' copy, "
                f"the engine's, the memory child's); {available_bytes() / 1e9:.1f} GB is available")
    if "memory" in parts and DISK_MARGIN * need > shutil.disk_usage(tempfile.gettempdir()).free:
        free = shutil.disk_usage(tempfile.gettempdir()).free / 1e9
        return f"its fp32 folder needs about {DISK_MARGIN * gb:.1f} GB; {tempfile.gettempdir()} has {free:.1f} GB free"
    return None


def bench_memory(name: str, ref) -> None:
    """Write `ref` as a folder in a temporary directory, have a child open it, delete the folder."""
    from tests.support.families import write_tokenizer

    with tempfile.TemporaryDirectory(prefix="decoder-lab-families-") as tmp:
        ref.save_pretrained(tmp)
        write_tokenizer(Path(tmp), 300)
        env = dict(os.environ, OMP_NUM_THREADS="1")
        done = subprocess.run([sys.executable, "-m", "bench.real_models", "--memory-child", tmp], env=env,
                              capture_output=True, text=True)
    if done.returncode != 0:
        emit("real_families.memory", model=name, error=(done.stderr.strip().splitlines() or ["?"])[-1])
        return
    m = json.loads(done.stdout.strip().splitlines()[-1])
    emit("real_families.memory", model=name, rss_added_mb=round(m["rss_added"] / 2**20, 1),
         fp32_weights_mb=round(m["weight_bytes"] / 2**20, 1), ratio=round(m["rss_added"] / m["weight_bytes"], 3),
         target="ratio <= 1.2")


def run_family(name: str, parts: set[str], reps: int) -> None:
    reason = why_skip(name, parts)
    if reason:
        emit("real_families.skipped", model=name, reason=reason, source=SHAPES[name][2])
        return
    ref = reference(name)
    emit("real_families.model", model=name, parameters=sum(p.numel() for p in ref.parameters()),
         source=SHAPES[name][2])
    if "memory" in parts:
        bench_memory(name, ref)  # before the engine's copy exists: the child has the room
    if "step" in parts:
        try:
            model = ours(ref)
        except ValueError as e:  # an importer that refuses this config: on the record, the others go on
            emit("real_families.step", model=name, error=str(e))
        else:
            target = STEP_MS_TARGETS.get(name)
            bench_step(name, ref, model, T, reps, bench="real_families.step",
                       target="ratio_step <= 1.0" + (f" and decoder_step_ms <= {target:g}" if target else ""))
            del model
    del ref
    gc.collect()


def main() -> None:
    p = parser("real_families", __doc__)
    p.add_argument("--reps", type=int, default=5, help="timed Steps per side")
    p.add_argument("--families", default=",".join(SHAPES), help="comma-separated: " + ", ".join(SHAPES))
    p.add_argument("--skip", default="", help="comma-separated parts to skip: step, memory")
    args = p.parse_args()
    torch.set_num_threads(1)
    emit("real_families.machine", cpu=cpu_model(), torch_threads=torch.get_num_threads(), torch=torch.__version__)
    parts = {"step", "memory"} - set(args.skip.split(","))
    for name in args.families.split(","):
        if name not in SHAPES:
            raise SystemExit(f"unknown family {name!r}; choose from {', '.join(SHAPES)}")
        run_family(name, parts, args.reps)


if __name__ == "__main__":
    main()
