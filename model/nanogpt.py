"""nanoGPT checkpoints (Karpathy's `train.py` writes `out_dir/ckpt.pt`) opened as Decoder Lab models.

A ckpt.pt is a `torch.save` pickle: {'model': state dict, 'model_args': {n_layer, n_head, n_embd,
block_size, bias, vocab_size, dropout}, 'optimizer': ..., 'iter_num', 'best_val_loss', 'config'}.
It is read by `model.safe_unpickle.load_torch_weights` (weights_only, in a capped child process);
this module then checks the tensors against model_args and builds the model through the GPT-2
importer: nanoGPT's network is GPT-2's, with exact GELU instead of the tanh approximation and,
with bias=False, no biases in its Linear and LayerNorm layers. Names are GPT-2's already; only
the layout differs: nanoGPT's nn.Linear weights are (out, in), GPT-2's Conv1D ones (in, out).

The vocabulary: a character-level run (shakespeare_char) has a meta.pkl beside its data with
{'vocab_size', 'itos', 'stoi'}, read by `safe_unpickle.load_plain_pickle` (no class can load);
it becomes the app's CharTokenizer. That tokenizer keeps id 0 for `<unk>`, so the model gains
one row in front: an embedding of zeros and an output logit of UNK_LOGIT, whose probability
underflows to exactly 0 (the other logits are the checkpoint's, unchanged). A run on GPT-2's
byte-level BPE (no meta.pkl, vocab_size 50257, or 50304 padded) uses GPT-2's tokenizer.json:
the one given, or the one in the local Hugging Face cache (never downloaded).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from .families.common import MAX_WHOLE, short
from .safe_unpickle import MAX_TORCH_FILE_BYTES, TOO_LARGE, load_plain_pickle, load_torch_weights
from .sources import check_links, kind_of, local_path, shortened
from .tokenizers import MAX_VOCAB, CharTokenizer, Tokenizer
from .transformer import DecoderLM

GPT2_VOCAB = 50257  # GPT-2's byte-level BPE; nanoGPT pads it to 50304 (a multiple of 64) for speed
GPT2_TOKENIZER_REPOS = ("openai-community/gpt2", "gpt2")  # looked up in the local cache only
# The output logit of the `<unk>` row added in front of a character vocabulary: exp(-1e9 - max)
# is exactly 0 in float32 and float64, so the row is never sampled and leaves every other
# probability as the checkpoint computes it.
UNK_LOGIT = -1e9
# model_args entries: name -> the Python types it may have
_ARGS = {"n_layer": int, "n_head": int, "n_embd": int, "block_size": int, "vocab_size": int}
# Linear layers whose weights GPT-2's Conv1D stores transposed
_CONV1D = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")


@dataclass
class NanoGPTRun:
    """What a ckpt.pt holds besides the optimizer: the model, its tokenizer and the run's notes."""

    model: DecoderLM
    tokenizer: Tokenizer
    meta: dict[str, Any] = field(default_factory=dict)


def read_meta(path: str | Path) -> CharTokenizer:
    """nanoGPT's meta.pkl ({'vocab_size', 'itos', 'stoi'}) as a character tokenizer (ids + 1)."""
    path = local_path(path, "the meta.pkl")
    try:
        data = path.read_bytes()
    except OSError:
        raise ValueError(f"cannot read {short(path.name)}") from None
    meta = load_plain_pickle(data, what=path.name)
    return char_vocabulary(meta, path.name)


def char_vocabulary(meta: Any, what: str = "meta.pkl") -> CharTokenizer:
    """The characters of a meta.pkl's plain dict, checked, in id order."""
    if not isinstance(meta, dict) or not {"vocab_size", "itos"} <= set(meta):
        raise ValueError(f"{what} is not a nanoGPT vocabulary: it needs 'vocab_size' and 'itos'")
    n, itos, stoi = meta["vocab_size"], meta["itos"], meta.get("stoi")
    if not isinstance(n, int) or isinstance(n, bool) or not 0 < n <= MAX_VOCAB - 1:
        raise ValueError(f"{what}: vocab_size must be a whole number from 1 to {MAX_VOCAB - 1}")
    if not isinstance(itos, dict) or set(itos) != set(range(n)):
        raise ValueError(f"{what}: 'itos' must map every id from 0 to {n - 1} to a character")
    chars = [itos[i] for i in range(n)]
    for i, c in enumerate(chars):
        if not isinstance(c, str) or len(c) != 1:
            raise ValueError(f"{what}: id {i} is not a single character")
    if stoi is not None and (not isinstance(stoi, dict) or stoi != {c: i for i, c in enumerate(chars)}):
        raise ValueError(f"{what}: 'stoi' does not invert 'itos'")
    try:
        return CharTokenizer(chars)
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None


def gpt2_tokenizer_file(given: str | Path | None = None) -> Path:
    """GPT-2's tokenizer.json: `given`, or the one in the local Hugging Face cache."""
    if given is not None:
        path = local_path(given, "the tokenizer")
        if kind_of(path) == "folder":
            path = path / "tokenizer.json"
        if path.name != "tokenizer.json" or kind_of(path) != "file":
            raise ValueError(f"no tokenizer.json at {shortened(given)} (give the file, or the folder "
                             "that holds it)")
        return path
    from huggingface_hub import try_to_load_from_cache

    for repo in GPT2_TOKENIZER_REPOS:
        found = try_to_load_from_cache(repo, "tokenizer.json")
        if isinstance(found, str):
            return Path(found)
    raise ValueError("this run used GPT-2's tokenizer: give its tokenizer.json with --tokenizer "
                     "(it is not in the local Hugging Face cache, and nothing is downloaded)")


def check_model_args(args: Any) -> dict[str, Any]:
    """nanoGPT's model_args, every field present and of its type."""
    if not isinstance(args, dict):
        raise ValueError("the checkpoint has no 'model_args' (is it a nanoGPT ckpt.pt?)")
    out: dict[str, Any] = {}
    for name in _ARGS:
        value = args.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= MAX_WHOLE:
            raise ValueError(f"model_args['{name}'] must be a whole number from 1 to {MAX_WHOLE:,}, "
                             f"got {value if value == TOO_LARGE else short(value)}")
        out[name] = value
    bias = args.get("bias", True)  # nanoGPT's default; runs from before the option had biases
    if not isinstance(bias, bool):
        raise ValueError("model_args['bias'] must be true or false")
    out["bias"] = bias
    if out["n_embd"] % out["n_head"]:
        raise ValueError(f"n_embd ({out['n_embd']}) is not divisible by n_head ({out['n_head']})")
    return out


def expected_shapes(a: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every tensor of a nanoGPT model of these model_args, by name (lm_head may be absent: tied)."""
    C, V, b = a["n_embd"], a["vocab_size"], a["bias"]
    shapes: dict[str, tuple[int, ...]] = {
        "transformer.wte.weight": (V, C),
        "transformer.wpe.weight": (a["block_size"], C),
        "transformer.ln_f.weight": (C,),
        "lm_head.weight": (V, C),
    }
    if b:
        shapes["transformer.ln_f.bias"] = (C,)
    for i in range(a["n_layer"]):
        p = f"transformer.h.{i}."
        layer = {"ln_1": (C,), "ln_2": (C,), "attn.c_attn": (3 * C, C), "attn.c_proj": (C, C),
                 "mlp.c_fc": (4 * C, C), "mlp.c_proj": (C, 4 * C)}
        for name, shape in layer.items():
            shapes[p + name + ".weight"] = shape
            if b:
                shapes[p + name + ".bias"] = (shape[0],)
    return shapes


def check_tensors(tensors: dict[str, torch.Tensor], args: dict[str, Any]) -> None:
    """Names and shapes exactly as model_args say, and every value finite."""
    shapes = expected_shapes(args)
    optional = {"lm_head.weight"}
    missing = sorted(set(shapes) - set(tensors) - optional)
    extra = sorted(set(tensors) - set(shapes))
    if missing or extra:
        raise ValueError(f"the weights do not match model_args: missing {missing[:3]}, unexpected {extra[:3]}")
    for name, t in tensors.items():
        if tuple(t.shape) != shapes[name]:
            raise ValueError(f"tensor {name} has shape {list(t.shape)}, but model_args say {list(shapes[name])}")
        if not torch.isfinite(t).all():
            raise ValueError(f"tensor {name} contains NaN or infinite values")


def gpt2_config(args: dict[str, Any], tied: bool) -> dict[str, Any]:
    """The GPT-2 config.json dict of a nanoGPT model of these model_args."""
    return {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "n_layer": args["n_layer"],
        "n_head": args["n_head"],
        "n_embd": args["n_embd"],
        "n_positions": args["block_size"],
        "n_ctx": args["block_size"],
        "vocab_size": args["vocab_size"],
        "n_inner": None,
        "activation_function": "gelu",  # nanoGPT's nn.GELU() is exact, GPT-2's gelu_new is not
        "layer_norm_epsilon": 1e-5,  # torch's LayerNorm default, which nanoGPT's LayerNorm uses
        "tie_word_embeddings": tied,
        "scale_attn_weights": True,
    }


def check_args_size(args: dict[str, Any], tied: bool) -> None:
    """The bounds a config.json gets (layers, positions, parameters: model.families.common.check_model_size),
    applied to model_args before a tensor list is made from them."""
    from .families import common, gpt2

    common.check_model_size(gpt2.model_config(gpt2_config(args, tied)), source="the nanoGPT checkpoint")


def gpt2_state(tensors: dict[str, torch.Tensor], args: dict[str, Any]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(GPT-2 config.json dict, GPT-2-named tensors) for these nanoGPT weights.

    Conv1D weights are passed as transposed views (no copy). Without biases (bias=False) the
    biases are zeros: x + 0 is x, so the model computes what nanoGPT computes.
    """
    tied = "lm_head.weight" not in tensors or torch.equal(tensors["lm_head.weight"], tensors["transformer.wte.weight"])
    config = gpt2_config(args, tied)
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if name == "lm_head.weight" and tied:
            continue
        if name.endswith(".weight") and name.removesuffix(".weight").endswith(_CONV1D):
            t = t.t()  # (out, in) -> Conv1D's (in, out)
        out[name] = t
    if not args["bias"]:
        for name, shape in expected_shapes({**args, "bias": True}).items():
            if name.endswith(".bias"):
                out[name] = torch.zeros(shape)
    return config, out


def with_unk_row(model: DecoderLM) -> DecoderLM:
    """The same model with one vocabulary row in front for CharTokenizer's `<unk>` (id 0).

    The row's embedding is zeros and its output logit is UNK_LOGIT (a head bias of 0 for every
    other row), so every other token's logit is unchanged and `<unk>` has probability 0.
    """
    cfg = model.cfg
    state = {k: v.detach() for k, v in model.state_dict().items()}
    C = cfg.d_model
    new_cfg = cfg.replace(vocab_size=cfg.vocab_size + 1, tie_weights=False, head_bias=True)
    emb = state["tok_emb.weight"]
    head = state["head.weight"]
    state["tok_emb.weight"] = torch.cat([torch.zeros(1, C), emb])
    state["head.weight"] = torch.cat([torch.zeros(1, C), head])
    old_bias = state.get("head.bias", torch.zeros(cfg.vocab_size))
    state["head.bias"] = torch.cat([torch.full((1,), UNK_LOGIT), old_bias])
    from .families.common import build

    return build(new_cfg, state)  # every parameter given: no random initialisation first


def read_checkpoint(path: str | Path, max_bytes: int = MAX_TORCH_FILE_BYTES,
                    **limits: Any) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, Any]]:
    """(checked tensors, model_args, the run's notes) of a ckpt.pt, read in a capped child process."""
    with tempfile.TemporaryDirectory(prefix="decoder-lab-nanogpt-") as tmp:
        load_torch_weights(path, tmp, max_bytes=max_bytes, **limits)
        tensors = load_file(str(Path(tmp) / "tensors.safetensors"))
        plain = json.loads(Path(tmp, "plain.json").read_text())
    args = check_model_args(plain.get("model_args"))
    check_args_size(args, tied="lm_head.weight" not in tensors)  # before a list of every layer's tensors is made
    check_tensors(tensors, args)
    notes = {"source": "nanoGPT", "iter_num": plain.get("iter_num")}
    config = plain.get("config")
    if isinstance(config, dict) and isinstance(config.get("dataset"), str):
        notes["dataset"] = config["dataset"]
    return tensors, args, notes


def load_nanogpt(path: str | Path, meta: str | Path | None = None, tokenizer: str | Path | None = None,
                 **limits: Any) -> NanoGPTRun:
    """Open a nanoGPT ckpt.pt. meta: its meta.pkl (also looked for beside the checkpoint);
    tokenizer: GPT-2's tokenizer.json for a BPE run. Any problem is a ValueError sentence."""
    path = Path(path)
    if meta is None and (path.parent / "meta.pkl").is_file():
        check_links(path.parent, ("meta.pkl",))  # found beside it: a link out of the run's folder is not followed
        meta = path.parent / "meta.pkl"
    chars = read_meta(meta) if meta is not None else None  # a bad meta.pkl is refused before the big file
    tensors, args, notes = read_checkpoint(path, **limits)
    config, state = gpt2_state(tensors, args)
    from .families.gpt2 import from_gpt2_state  # the GPT-2 importer builds the model

    if chars is not None:
        if chars.vocab_size - 1 != args["vocab_size"]:
            raise ValueError(f"meta.pkl has {chars.vocab_size - 1} characters but the model has "
                             f"{args['vocab_size']} vocabulary rows")
        model = with_unk_row(from_gpt2_state(config, state))
        return NanoGPTRun(model, chars, notes)
    if args["vocab_size"] < GPT2_VOCAB:
        raise ValueError(f"this run has a vocabulary of {args['vocab_size']} tokens, not GPT-2's: "
                         f"give its meta.pkl with --meta")
    from .hf_tokenizer import HFFileTokenizer

    # GPT-2 never puts a BOS token first; <|endoftext|> (50256) ends a text, as between nanoGPT's documents
    tok = HFFileTokenizer.from_folder(gpt2_tokenizer_file(tokenizer).parent, False,
                                      {"bos_token_id": GPT2_VOCAB - 1, "eos_token_id": GPT2_VOCAB - 1},
                                      model_rows=args["vocab_size"])
    model = from_gpt2_state(config, state, tokenizer=tok)
    return NanoGPTRun(model, tok, notes)
