"""What every family importer shares: reading a Hugging Face model folder safely.

A folder holds config.json, the weights as model.safetensors or as shards listed in
model.safetensors.index.json, and tokenizer.json. The files are the ones the person running the
app chose, but a folder can still be damaged or mislabelled, so nothing is allocated before it is
checked: the config's sizes give the parameter count (bounded by `MAX_PARAMS`), every tensor's
name, dtype and shape are read from the safetensors headers and compared with what the config
implies, and only then are the tensors read, one at a time, as float32, and checked finite.

Each family module (gpt2, neo, neox, llama) supplies three pure functions, following
TransformerLens's one-file-per-family weight conversions:

* `model_config(hf) -> ModelConfig`: the engine's config, every number read from config.json;
* `expected_shapes(hf, cfg) -> dict[name, shape]`: the tensors the folder must hold (`OPTIONAL`
  names may be absent, `IGNORED` suffixes are buffers older files carry and are skipped);
* `convert(hf, cfg, tensors) -> state dict`: the engine's parameters, re-laid where the layouts
  differ (behaviour lives in the config, never in the weights).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

import torch

from .. import json_bounds
from ..config import ModelConfig
from ..hf_tokenizer import HFFileTokenizer
from ..json_bounds import short
from ..sources import check_links
from ..st_layout import check_layout, read_header as read_st_header
from ..transformer import DecoderLM

# The largest model a folder may describe: 2 billion parameters is 8 GB of float32 (SmolLM2-1.7B
# fits; a config asking for more is refused before anything is allocated).
MAX_PARAMS = 2_000_000_000
# Bounds the parameter count does not give: the layers (a tensor list is made per layer before any is
# read) and the positions (RoPE's tables are computed for every one). The supported families' models
# have a few dozen layers; 131,072 positions is the longest context of a Llama-family model.
MAX_LAYERS = 256
MAX_POSITIONS = 131_072
MAX_WHOLE = 2**31 - 1  # no size in a config.json is larger
MAX_CONFIG_BYTES = 1_000_000  # a config.json is a few kilobytes
MAX_WEIGHTS_HEADER_BYTES = 100_000_000  # a weights file's safetensors JSON header: a few hundred bytes per tensor
MAX_SHARDS = 1_000
# safetensors dtypes an importer reads (each converted to float32 for the engine)
DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}
# transformers' activation names (GPT-2's, GPT-Neo's and GPT-NeoX's configs) -> the engine's GELU form; the
# importers read "relu" as ReLU, whose GELU form is never used
HF_ACTIVATIONS = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu": "none", "relu": "relu"}


class Family:
    """One family's importer: its name, its model_type values and its three functions."""

    def __init__(self, name: str, model_types: tuple[str, ...], model_config: Callable, expected_shapes: Callable,
                 convert: Callable, prefixes: tuple[str, ...] = (), ignored: tuple[str, ...] = (),
                 optional: tuple[str, ...] = (), aliases: dict[str, str] | None = None, adds_bos: bool = False):
        self.name, self.model_types, self.optional = name, model_types, frozenset(optional)
        # whether its tokenizer may put a BOS token first (when its own files say so); GPT-2,
        # GPT-Neo and GPT-NeoX never do
        self.adds_bos = adds_bos
        self.aliases = aliases or {}  # other names files use for a tensor (after the prefix) -> ours
        self.model_config, self.expected_shapes, self.convert = model_config, expected_shapes, convert
        self.prefixes = prefixes  # prefixes a file may put before every name (e.g. "transformer.")
        self.ignored = ignored  # name suffixes of buffers (masks, rotary tables) that are skipped


def read_json(path: Path, what: str) -> Any:
    """A small JSON file (at most MAX_CONFIG_BYTES, nested at most json_bounds.MAX_DEPTH deep), or a
    ValueError naming it."""
    return json_bounds.read(path, what, MAX_CONFIG_BYTES)


def read_config(folder: Path) -> dict[str, Any]:
    """config.json of a model folder: the first file every importer reads from a folder, so the
    folder's links are checked here (model.sources.check_links: none may lead out of it)."""
    check_links(folder)
    hf = read_json(folder / "config.json", "model config")
    if not isinstance(hf, dict):
        raise ValueError("config.json must hold a JSON object")
    return hf


# ------------------------------------------------------------------ reading config.json numbers


def whole(hf: dict, key: str, default: Any = None, minimum: int = 1) -> int:
    """hf[key] as a whole number from minimum to MAX_WHOLE (default when absent and a default is given)."""
    value = hf.get(key, default)
    if value is None and default is None:
        raise ValueError(f"config.json has no {key}")
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_WHOLE:
        raise ValueError(f"config.json's {key} must be a whole number from {minimum} to {MAX_WHOLE:,}, "
                         f"got {short(value)}")
    return value


def real(hf: dict, key: str, default: Any = None) -> float:
    value = hf.get(key, default)
    if value is None:
        raise ValueError(f"config.json has no {key}")
    try:  # a whole number too large for a float overflows in isfinite: refused in words like any other
        finite = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    except OverflowError:
        finite = False
    if not finite or value <= 0:
        raise ValueError(f"config.json's {key} must be a positive number, got {short(value)}")
    return float(value)


def flag(hf: dict, key: str, default: bool) -> bool:
    value = hf.get(key, default)
    if not isinstance(value, bool):
        raise ValueError(f"config.json's {key} must be true or false, got {short(value)}")
    return value


def refuse_unless(condition: bool, sentence: str) -> None:
    if not condition:
        raise ValueError(sentence)


def rope_settings(hf: dict, theta_keys: tuple[str, ...], fraction_keys: tuple[str, ...],
                  fraction_default: float, scalings: tuple[str, ...] | None = None,
                  theta_default: float = 10000.0) -> tuple:
    """(theta, rotary fraction) from either config.json form: transformers 5's `rope_parameters`
    dict, or the older top-level keys (rope_theta / rotary_emb_base, rotary_pct, rope_scaling).

    scalings: the rope types among the engine's (ModelConfig's ROPE_SCALINGS: "linear", "llama3")
    that the family's reference applies; given, the result gains a third item, ModelConfig's
    rope_scaling tuple (() for the default rotary). Every other type (yarn, dynamic, longrope, ...;
    without `scalings`, every type) is refused by name, and so is a rotary per layer type (a family
    that has those passes each entry here on its own). theta_default: the family's theta when the
    file names none (transformers' default_theta: 10,000, SmolLM3's 2,000,000)."""
    given = {}
    for key in ("rope_parameters", "rope_scaling"):
        value = hf.get(key)
        if value is not None and not isinstance(value, dict):
            raise ValueError(f"config.json's {key} must be an object")
        if value:
            given[key] = value
    nested = [k for k, v in given.get("rope_parameters", {}).items() if isinstance(v, dict)]
    if nested:
        raise ValueError(f"config.json's rope_parameters gives layer types their own rotary ({short(nested)}); "
                         "this family turns every layer by one rotary")
    accepted = tuple(scalings or ())
    for params in given.values():
        kind = params.get("rope_type", params.get("type", "default"))
        if kind != "default" and kind not in accepted:
            also = "".join(f", {k}" for k in accepted)
            raise ValueError(f"RoPE scaling type {short(kind)} is not supported; only the default rotary{also} "
                             f"{'are' if also else 'is'}")
    if len(given) == 2 and given["rope_parameters"] != given["rope_scaling"]:
        # transformers would take rope_scaling and drop the other without a word
        raise ValueError("config.json gives both rope_parameters and rope_scaling, and they differ")
    where, params = next(iter(given.items()), ("rope_parameters", {}))
    kind = params.get("rope_type", params.get("type", "default"))
    merged = {**hf, **params}
    theta = next((real(merged, k) for k in ("rope_theta", *theta_keys) if k in merged), theta_default)
    fraction = next((real(merged, k) for k in ("partial_rotary_factor", *fraction_keys) if k in merged),
                    fraction_default)
    refuse_unless(theta > 1.0, f"config.json's rope theta must be above 1, got {theta}")
    refuse_unless(fraction <= 1.0, f"config.json's rotary fraction must be at most 1, got {fraction}")
    if scalings is None:
        return theta, fraction
    # each number named as where it sits in the file (rope_scaling.factor), for the refusals
    named = {f"{where}.{k}": v for k, v in params.items()}
    if kind == "linear":
        return theta, fraction, ("linear", real(named, f"{where}.factor"))
    if kind == "llama3":
        low, high = real(named, f"{where}.low_freq_factor"), real(named, f"{where}.high_freq_factor")
        refuse_unless(high > low, f"config.json's {where}.high_freq_factor ({high}) must be above its "
                                  f"low_freq_factor ({low})")
        # without its own, transformers takes max_position_embeddings (never a top-level original_...)
        n0 = whole(named, f"{where}.original_max_position_embeddings") \
            if f"{where}.original_max_position_embeddings" in named else whole(hf, "max_position_embeddings")
        top = hf.get("original_max_position_embeddings", n0)
        refuse_unless(top == n0, f"config.json's original_max_position_embeddings ({short(top)}) differs from the "
                                 f"one the rotary uses ({n0})")
        return theta, fraction, ("llama3", real(named, f"{where}.factor"), low, high, n0)
    return theta, fraction, ()


# ------------------------------------------------------------------ safetensors, checked first


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a folder (one file, or the shards its index lists)."""
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if index.is_file():
        doc = read_json(index, "shard index")
        weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise ValueError("model.safetensors.index.json has no weight_map of tensor names to files")
        names = sorted(set(weight_map.values()))
        if len(names) > MAX_SHARDS:
            raise ValueError(f"the index lists {len(names):,} shards; at most {MAX_SHARDS:,} are read")
        files = []
        for name in names:
            path = folder / name
            # a shard is a plain file in this folder: no path into another directory
            if Path(name).name != name or not name.endswith(".safetensors") or not path.is_file():
                raise ValueError(f"the shard {short(name)} listed in the index is not a .safetensors file in the folder")
            files.append(path)
        return files
    if any(folder.glob("*.bin")) or any(folder.glob("*.pt")) or any(folder.glob("*.pth")):
        raise ValueError("this folder holds PyTorch pickle weights (.bin), which are not opened because "
                         "unpickling can run code; use the model's safetensors files instead")
    raise ValueError("the folder has no model.safetensors (or model.safetensors.index.json)")


def read_tensor_specs(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """{name: (dtype, shape)} from a safetensors file's header, without reading any tensor: the one
    reader (model.st_layout.read_header), then the byte layout (every tensor's bytes its own)."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            header, start = read_st_header(f, size, path.name, MAX_WEIGHTS_HEADER_BYTES)
    except OSError:
        raise ValueError(f"{path.name} is not a readable safetensors file") from None
    check_layout(header, size - start, path.name)
    return {name: (entry["dtype"], tuple(entry["shape"])) for name, entry in header.items() if name != "__metadata__"}


def read_tensors(files: list[Path], family: Family, expected: dict[str, tuple[int, ...]],
                 optional: frozenset[str] = frozenset(), stored: bool = False) -> dict[str, torch.Tensor]:
    """Every expected tensor as float32 (stored: in the dtype the file holds it, float64 made float32),
    after the headers were checked against `expected`."""
    from safetensors import SafetensorError, safe_open

    where: dict[str, tuple[Path, str]] = {}  # canonical name -> (file, name in the file)
    for path in files:
        for name, (dtype, shape) in read_tensor_specs(path).items():
            canonical = _canonical(name, family)
            if canonical not in expected and canonical.endswith(family.ignored):
                continue  # a buffer (causal mask, rotary table) that older files carry
            if canonical not in expected:
                raise ValueError(f"the weights hold a tensor {short(name)} that a {family.name} model "
                                 "with this config.json does not have; the config and the weights disagree")
            if canonical in where:
                raise ValueError(f"the weights hold {short(canonical)} twice")
            if dtype not in DTYPES:
                raise ValueError(f"tensor {short(name)} is stored as {short(dtype)}; only "
                                 f"{', '.join(DTYPES)} weights are read")
            if shape != expected[canonical]:
                raise ValueError(f"tensor {short(name)} has shape {list(shape)} but this config.json needs "
                                 f"{list(expected[canonical])}; the config and the weights disagree")
            where[canonical] = (path, name)
    missing = sorted(set(expected) - set(where) - optional)
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise ValueError(f"the weights lack the tensor {missing[0]}{more} that this config.json needs")
    tensors: dict[str, torch.Tensor] = {}
    try:
        for path in sorted({p for p, _ in where.values()}):
            with safe_open(str(path), framework="pt") as f:
                for canonical, (p, name) in where.items():
                    if p == path:
                        # a copy of its own: a float32 tensor would otherwise stay a view of the
                        # file's memory map and keep the whole file resident beside the model
                        t = f.get_tensor(name)
                        keep = stored and t.dtype in (torch.bfloat16, torch.float16)
                        tensors[canonical] = t.to(t.dtype if keep else torch.float32, copy=True)
    except (OSError, RuntimeError, ValueError, SafetensorError):  # the layout was checked: a file changed since
        raise ValueError("the safetensors data could not be read (did a file change while it was read?)") from None
    for name, t in tensors.items():
        if not torch.isfinite(t).all():
            raise ValueError(f"tensor {name} holds NaN or infinite values")
    return tensors


def _canonical(name: str, family: Family) -> str:
    for prefix in family.prefixes:
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    return family.aliases.get(name, name)


def pairs_from_halves(w: torch.Tensor, n_heads: int, head_dim: int, rope_dim: int) -> torch.Tensor:
    """Re-lay the rows of a query or key projection (n_heads * head_dim, ...) from rotate-half order
    (GPT-NeoX, Llama: dimension i turns with i + rope_dim/2) to the engine's consecutive pairs
    (2i turns with 2i + 1). q.k is unchanged by permuting both the same way, so attention is too."""
    half = rope_dim // 2
    order = torch.arange(rope_dim).view(2, half).t().reshape(-1)  # 0, h, 1, h+1, ...
    order = torch.cat([order, torch.arange(rope_dim, head_dim)])  # dimensions past rope_dim stay
    return w.reshape(n_heads, head_dim, *w.shape[1:])[:, order].reshape(w.shape)


def head_width(hf: dict, d: int, H: int, default: int | None = None) -> int:
    """Each head's width as transformers reads it: config.json's head_dim when the key is there (the
    attention is then H * head_dim wide, whatever hidden_size is), else the family's default (Qwen3: 128),
    else hidden_size / num_attention_heads."""
    if "head_dim" not in hf and default is not None:
        width = default
    elif "head_dim" not in hf:
        refuse_unless(d % H == 0, f"hidden_size ({d}) must be a multiple of num_attention_heads ({H}) "
                                  "when config.json gives no head_dim")
        width = d // H
    else:
        refuse_unless(hf["head_dim"] is not None, "config.json's head_dim must be a whole number, got null")
        width = whole(hf, "head_dim")
    # the rotary step turns pairs of dimensions: transformers' rotate-half fails on an odd width
    refuse_unless(width % 2 == 0, f"each head is {width} dimensions wide (head_dim); the rotary step needs "
                                  "an even width")
    return width


def param_limit(max_params: int, stored: bool) -> int:
    """The most parameters a model may have: max_params in float32 (8 GB at 2 billion), twice as many kept
    as stored in a 16-bit dtype (the same 8 GB)."""
    return 2 * max_params if stored else max_params


def embedding_and_head(cfg: ModelConfig, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The engine's embedding, final norm and output head from a Llama-layout file (embed_tokens, norm,
    lm_head): a tied head must be the embedding itself when the file holds one; an untied one must be there."""
    state = {"tok_emb.weight": t["embed_tokens.weight"], "norm_f.weight": t["norm.weight"]}
    if cfg.tie_weights:
        head = t.get("lm_head.weight")
        refuse_unless(head is None or torch.equal(head, t["embed_tokens.weight"]),
                      "config.json ties the output head to the embedding but the weights hold a different lm_head")
    else:
        refuse_unless("lm_head.weight" in t, "config.json has an untied output head but the weights lack lm_head.weight")
        state["head.weight"] = t["lm_head.weight"]
    return state


def check_model_size(cfg: ModelConfig, max_params: int = MAX_PARAMS, source: str = "config.json") -> None:
    """The size bounds every importer applies to a model's description (`source`: config.json, a
    nanoGPT run's model_args) before anything is made from it."""
    if cfg.n_layers > MAX_LAYERS:
        raise ValueError(f"{source} describes a model of {cfg.n_layers:,} layers; at most {MAX_LAYERS} are read")
    if cfg.block_size > MAX_POSITIONS:
        raise ValueError(f"{source} describes a context of {cfg.block_size:,} positions; at most "
                         f"{MAX_POSITIONS:,} are read")
    n = cfg.n_params()
    if n > max_params:
        raise ValueError(f"{source} describes a model of {n:,} parameters; the limit is {max_params:,}")


def build(cfg: ModelConfig, state: dict[str, torch.Tensor]) -> DecoderLM:
    """A DecoderLM holding exactly `state` (every parameter given, nothing left over)."""
    with torch.device("meta"):
        model = DecoderLM(cfg)  # no memory for random weights that are replaced right away
    want = {k for k in model.state_dict() if not (cfg.tie_weights and k == "head.weight")}
    if set(state) != want:
        lost = sorted(want - set(state)) or sorted(set(state) - want)
        raise ValueError(f"the converted weights do not match the model ({lost[0]})")
    model.load_state_dict(state, strict=False, assign=True)
    if cfg.tie_weights:
        model.head.weight = model.tok_emb.weight
    # buffers (positional tables, rotary angles) are not in the state: compute them for real
    _rebuild_buffers(model, cfg)
    return model.eval()


def _rebuild_buffers(model: DecoderLM, cfg: ModelConfig) -> None:
    from ..transformer import sinusoidal_table

    if cfg.pos_encoding == "sinusoidal":
        model.register_buffer("pe_table", sinusoidal_table(cfg.block_size, cfg.d_model, cfg.pe_base), persistent=False)
    model.make_rope_tables()


def weights_dtype(tensors: dict[str, torch.Tensor], stored: bool) -> torch.dtype:
    """The dtype a model keeps its weights in: float32, or with `stored` the one 16-bit dtype every tensor
    of the file has (bfloat16 halves a model's memory; a file mixing dtypes is read as float32)."""
    kinds = {t.dtype for t in tensors.values()}
    return kinds.pop() if stored and len(kinds) == 1 and kinds <= {torch.bfloat16, torch.float16} else torch.float32


def from_state(family: Family, hf: dict, tensors: dict[str, torch.Tensor], vocab_used: int | None = None,
               max_params: int = MAX_PARAMS, stored: bool = False, consume: bool = False) -> DecoderLM:
    """A DecoderLM from a family's config.json dict and its tensors (names with or without the
    family's prefix); every expected tensor but the optional ones must be there. stored: keep 16-bit
    weights in their dtype (`weights_dtype`); the forward then computes as transformers does in it.
    consume: empty `tensors` as they are taken (a folder's reader passes its own), so the file's tensors are
    let go as soon as the re-laid ones exist, not held beside the model."""
    tensors = {_canonical(k, family): (tensors.pop(k) if consume else tensors[k]) for k in list(tensors)}
    cfg = family.model_config(hf)
    if vocab_used is not None and vocab_used < cfg.vocab_size:
        cfg = cfg.replace(vocab_used=vocab_used)
    check_model_size(cfg, param_limit(max_params, stored))
    expected = family.expected_shapes(hf, cfg)
    for name, t in tensors.items():
        if name not in expected:
            raise ValueError(f"a {family.name} model with this config has no tensor {short(name)}")
        if tuple(t.shape) != expected[name]:
            raise ValueError(f"tensor {name} has shape {list(t.shape)}; this config needs {list(expected[name])}")
        if not torch.isfinite(t).all():
            raise ValueError(f"tensor {name} holds NaN or infinite values")
    missing = sorted(set(expected) - set(tensors) - family.optional)
    if missing:
        raise ValueError(f"the weights lack the tensor {missing[0]} that this config needs")
    dtype = weights_dtype(tensors, stored)
    if dtype == torch.float32:
        check_model_size(cfg, max_params)  # only 16-bit weights kept as stored may be larger
    converted = {k: tensors.pop(k).to(dtype) for k in list(tensors)}
    state = family.convert(hf, cfg, converted)
    del converted  # the pieces convert joined (q, k, v; gate, up) go now, before the model is built
    return build(cfg, state)


def open_family_folder(folder: Path, family: Family, hf: dict, max_params: int = MAX_PARAMS, stored: bool = False):
    """(DecoderLM, HFFileTokenizer) of a folder whose config.json (read as `hf`) is `family`'s."""
    cfg = family.model_config(hf)  # refuse unsupported options before reading anything else
    check_model_size(cfg, param_limit(max_params, stored))
    tokenizer = HFFileTokenizer.from_folder(folder, family.adds_bos, hf, model_rows=cfg.vocab_size)
    if tokenizer.vocab_size > cfg.vocab_size:
        raise ValueError(f"tokenizer.json has {tokenizer.vocab_size:,} tokens but the model only "
                         f"{cfg.vocab_size:,} embedding rows; they do not belong together")
    return open_weights(folder, family, hf, tokenizer.vocab_size, max_params, stored), tokenizer


def open_weights(folder: Path, family: Family, hf: dict, vocab_used: int | None = None,
                 max_params: int = MAX_PARAMS, stored: bool = False) -> DecoderLM:
    """The model of a folder whose config.json was read as `hf`."""
    cfg = family.model_config(hf)
    check_model_size(cfg, param_limit(max_params, stored))  # before any header is read or tensor allocated
    files = weight_files(folder)
    if cfg.n_params() > max_params:  # larger than float32 allows: only as one 16-bit dtype kept as stored
        kinds = {dtype for path in files for dtype, _ in read_tensor_specs(path).values()}
        if len(kinds) != 1 or not kinds <= {"BF16", "F16"}:
            raise ValueError(f"config.json describes a model of {cfg.n_params():,} parameters; in float32 the limit "
                             f"is {max_params:,} (a folder of bfloat16 or float16 weights kept as stored may have "
                             f"up to {param_limit(max_params, True):,})")
    expected = family.expected_shapes(hf, cfg)
    tensors = read_tensors(files, family, expected, family.optional, stored)
    model = from_state(family, hf, tensors, vocab_used, max_params, stored, consume=True)
    _return_freed_memory()
    return model


def _return_freed_memory() -> None:
    """Hand the memory freed while loading back to the system (glibc keeps it in its heap otherwise: about
    a fifth of a small model's size stays resident); a no-op where there is no glibc."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass

