"""Pretrained model families opened from Hugging Face model folders.

`open_folder(path)` reads config.json's `model_type`, picks the family's importer and returns
`(DecoderLM, HFFileTokenizer)`:

    model_type   family                                  example checkpoints
    gpt2         GPT-2 (gpt2.py)                         gpt2, distilgpt2
    gpt_neo      GPT-Neo (neo.py)                        roneneldan/TinyStories-*
    gpt_neox     GPT-NeoX (neox.py)                      EleutherAI/pythia-*
    llama        Llama (llama.py)                        Llama 3.2, SmolLM2, TinyLlama
    qwen2        Qwen2 (qwen2.py)                        Qwen/Qwen2.5-0.5B
    qwen3        Qwen3 (qwen3.py)                        Qwen/Qwen3-0.6B
    smollm3      SmolLM3 (smollm3.py)                    HuggingFaceTB/SmolLM3-3B
    olmo2        OLMo 2 (olmo2.py)                       allenai/OLMo-2-0425-1B (and its stage revisions)
    phi3         Phi-3 (phi3.py)                         microsoft/Phi-3-mini-4k-instruct
    gemma2       Gemma 2 (gemma.py)                      google/gemma-2-2b
    gemma3_text  Gemma 3 (gemma.py; also gemma3 when     google/gemma-3-270m, google/gemma-3-1b-pt
                 its folder holds the text model alone)

Any other model_type is refused by name. See common.py for what is checked before loading.
"""

from __future__ import annotations

from pathlib import Path

from ..hf_tokenizer import HFFileTokenizer
from ..transformer import DecoderLM
from . import common, gemma, gpt2, llama, neo, neox, qwen2, qwen3, smollm3, olmo2, phi3
from .common import Family

FAMILIES: tuple[Family, ...] = (gpt2.FAMILY, neo.FAMILY, neox.FAMILY, llama.FAMILY, qwen2.FAMILY, qwen3.FAMILY,
                                smollm3.FAMILY, olmo2.FAMILY, phi3.FAMILY, gemma.GEMMA2, gemma.GEMMA3)


def family_of(hf: dict) -> Family:
    """The importer for config.json's model_type, or a ValueError naming the architecture."""
    model_type = hf.get("model_type")
    for family in FAMILIES:
        if model_type in family.model_types:
            return family
    known = ", ".join(t for f in FAMILIES for t in f.model_types)
    shown = common.short(model_type) if model_type is not None else "missing"
    raise ValueError(f"model_type {shown} is not a supported architecture (supported: {known})")


def open_folder(path: str | Path, expect: Family | None = None, max_params: int = common.MAX_PARAMS,
                stored: bool = False) -> tuple[DecoderLM, HFFileTokenizer]:
    """The model and tokenizer of a Hugging Face model folder (config.json, safetensors weights,
    tokenizer.json). expect: refuse folders of any other family. stored: keep bfloat16 or float16
    weights in their own dtype (half the memory of float32), computing as transformers does in it.
    Bad folders are a ValueError with one sentence; nothing is allocated before the config and the
    weight headers agree."""
    folder = Path(path)
    if not folder.is_dir():
        raise ValueError(f"{folder.name or path} is not a folder")
    hf = common.read_config(folder)
    family = family_of(hf)
    if expect is not None and family is not expect:
        raise ValueError(f"this folder holds a {family.name} model, not a {expect.name} one")
    return common.open_family_folder(folder, family, hf, max_params, stored)


__all__ = ["FAMILIES", "family_of", "open_folder"]
