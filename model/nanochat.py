"""nanochat checkpoints (Karpathy's nanochat, 2025-26) opened as Decoder Lab models, computing what nanochat
computes on a CPU in float32.

A checkpoint folder holds `model_<step>.pt` (a `torch.save` of the state dict itself: no wrapper, no
optimizer), `meta_<step>.json` (GPTConfig under "model_config"; Python's json may write Infinity
elsewhere in it) and, beside it or in nanochat's own cache layout (<base>/tokenizer/tokenizer.pkl next to
<base>/base_checkpoints/d20/), the tokenizer (model/nanochat_tokenizer.py). The largest step is opened,
as nanochat's `find_last_step` does, unless a model_<step>.pt file is named.

Reading: the meta's model_config is checked field by field; the tokenizer is read without running it;
the model file's pickle may name only the four globals nanochat's files hold (`PICKLE_GLOBALS`), checked
before anything is loaded, and is then read by `torch.load(weights_only=True)` in a capped child process
(model.safe_unpickle, layout "state_dict"); every tensor's name and shape must be the model's.

The model (nanochat/gpt.py at 92d63d4, its formulas checked against nanochat's own outputs in
tests/engine/test_nanochat.py) in the engine's options (ModelConfig):
parameter-free RMSNorms with float32's epsilon (norm_weight=False, norm_eps=2^-23), also after the
embedding (embed_norm); the smear of the previous token's embedding (smear_width 24); each block reading
resid_lambda * x + x0_lambda * x0 (x0_mix); value embeddings on alternating layers, the last included,
gated 3 * sigmoid over 12 channels (value_embed_layers); rotary of base 100,000 in float32; q/k RMSNorm
times 1.2 (qk_norm="head" without weight, qk_gain 1.2: nanochat norms after the rotary step, the engine
before it, and a parameter-free norm commutes with a rotation, so only rounding differs); windows of
w + 1 keys (nanochat's window w counts the keys before the query); ReLU²; an untied head; the stream after
block L // 2 taken away before the final norm (backout_layer); logits soft-capped at 15; the vocabulary
padded to a multiple of 64 (vocab_used).

Re-laid weights: nanochat rotates the halves of each head (dimension j with j + hs/2) by -θ. The engine
rotates consecutive pairs by +θ; rotating (b, a) by +θ is rotating (a, b) by -θ, so each query and key
head's rows are laid b_0, a_0, b_1, a_1, ... (`rotary_rows`); q·k is unchanged by one permutation of
both, so every score is nanochat's.

The context (block_size) is 10 * sequence_len: the length of nanochat's rotary table and the longest text
its forward accepts. nanochat never crops a text it continues (its engine keeps every token in its
cache), so within that length the app reads every text as nanochat does, windows that slide past
sequence_len included; past it nanochat stops and the app crops.

Refused by name: checkpoints of earlier nanochat versions (other scales, bases and soft-caps that the
files cannot always tell apart), and the bfloat16 numbers of a GPU run (the app computes in float32 as
nanochat does on a CPU: a GPU's bf16 logits differ by ~0.1).
"""

from __future__ import annotations

import json
import pickletools
import re
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from . import json_bounds
from .config import ModelConfig
from .families.common import MAX_LAYERS, MAX_POSITIONS, build, check_model_size
from .json_bounds import is_int, short
from .nanochat_tokenizer import nanochat_tokenizer
from .safe_unpickle import MAX_TORCH_FILE_BYTES, load_torch_weights
from .sources import kind_of, local_path, shortened
from .tokenizer_core import MAX_PRETRAINED_VOCAB
from .tokenizers import Tokenizer
from .transformer import DecoderLM

MODEL_FILE = re.compile(r"model_(\d{1,12})\.pt")
CONFIG_KEYS = ("sequence_len", "vocab_size", "n_layer", "n_head", "n_kv_head", "n_embd")
MAX_META_BYTES = 1_000_000  # a meta file is a few kilobytes (base_train adds its argparse options)
MAX_PICKLE_BYTES = 64 * 1024**2  # the model file's data.pkl: a hundred-odd bytes per tensor
MAX_PATTERN = 1000
# the globals of a nanochat model file's pickle (torch.save of an OrderedDict of float32 and, from a GPU
# run, bfloat16 tensors); anything else is refused before torch reads the file
PICKLE_GLOBALS = frozenset({"collections OrderedDict", "torch._utils _rebuild_tensor_v2", "torch FloatStorage",
                            "torch BFloat16Storage"})
PAD_TO = 64  # nanochat pads its vocabulary to a multiple of this
SMEAR_WIDTH, GATE_WIDTH, GATE_SCALE, QK_GAIN, ROPE_BASE, SOFTCAP = 24, 12, 3.0, 1.2, 100_000.0, 15.0
EPS = 2.0**-23  # torch.finfo(torch.float32).eps, F.rms_norm's epsilon for float32


@dataclass
class NanochatRun:
    """A nanochat checkpoint opened: the model, its tokenizer and where it came from."""

    model: DecoderLM
    tokenizer: Tokenizer
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class NanochatFiles:
    """The three files of one checkpoint step; `root`: the folder they must all lie in (links are not
    followed out of it): the checkpoint folder, or nanochat's base folder in its cache layout."""

    model: Path
    meta: Path
    tokenizer: Path
    root: Path
    step: int

    @property
    def all(self) -> list[Path]:
        return [self.model, self.meta, self.tokenizer]


def steps_in(folder: Path) -> dict[int, Path]:
    """The model files of a folder by step."""
    try:
        names = [p.name for p in folder.iterdir()]
    except OSError:
        return {}
    return {int(m.group(1)): folder / n for n in names if (m := MODEL_FILE.fullmatch(n))}


def is_nanochat(path: str | Path) -> bool:
    """Whether `path` is a nanochat checkpoint: a folder of model_<step>.pt files (and no config.json of a
    Hugging Face folder), or one such file with its meta_<step>.json beside it."""
    path = Path(path)
    if path.is_dir():
        return bool(steps_in(path)) and not (path / "config.json").exists()
    m = MODEL_FILE.fullmatch(path.name)
    return bool(m) and path.is_file() and (path.parent / f"meta_{m.group(1)}.json").is_file()


def locate(src: str | Path) -> NanochatFiles:
    """The files of the checkpoint at `src` (a checkpoint folder: its largest step; or a model_<step>.pt)."""
    path = local_path(src)
    kind = kind_of(path)
    if kind == "folder":
        steps = steps_in(path)
        if not steps:
            if (path / "tokenizer" / "tokenizer.pkl").is_file():
                raise ValueError(f"{shortened(src)} is nanochat's base folder; give one checkpoint folder in it "
                                 "(e.g. base_checkpoints/d20)")
            raise ValueError(f"{shortened(src)} holds no nanochat model_<step>.pt file")
        step = max(steps)
        folder, model = path, steps[step]
    elif kind == "file" and (m := MODEL_FILE.fullmatch(path.name)):
        step, folder, model = int(m.group(1)), path.parent, path
    else:
        raise ValueError(f"{shortened(src)} is neither a nanochat checkpoint folder nor a model_<step>.pt file")
    meta = folder / f"meta_{model.name[len('model_'):-len('.pt')]}.json"
    if not meta.is_file():
        raise ValueError(f"{model.name} has no {meta.name} beside it (nanochat writes the two together)")
    candidates = [(folder / "tokenizer.pkl", folder), (folder / "tokenizer" / "tokenizer.pkl", folder)]
    if folder.parent.name.endswith("_checkpoints"):  # <base>/base_checkpoints/d20: <base>/tokenizer/tokenizer.pkl
        candidates.append((folder.parent.parent / "tokenizer" / "tokenizer.pkl", folder.parent.parent))
    found = next(((t, r) for t, r in candidates if t.is_file()), None)
    if found is None:
        raise ValueError("no nanochat tokenizer.pkl beside the checkpoint, in its tokenizer/ folder, or in "
                         "nanochat's base folder (<base>/tokenizer/tokenizer.pkl)")
    files = NanochatFiles(model, meta, found[0], found[1].resolve(), step)
    for p in files.all:  # a link is followed only when it stays in the model's folder
        real = p.resolve()
        if not real.is_relative_to(files.root) or not real.is_file():
            raise ValueError(f"{p.name} is a link to a file outside the checkpoint's folder, which is not followed; "
                             "copy the file into the folder instead")
    return files


def read_meta(path: Path) -> dict[str, Any]:
    """meta_<step>.json's model_config, every field checked (window_pattern "L" when absent, as nanochat
    patches old files)."""
    meta = json_bounds.read(path, "nanochat meta file", MAX_META_BYTES)
    where = f"{path.name}'s model_config"
    mc = meta.get("model_config") if isinstance(meta, dict) else None
    if not isinstance(mc, dict):
        raise ValueError(f"{path.name} has no model_config (is it a nanochat meta file?)")
    unknown = sorted(set(mc) - {*CONFIG_KEYS, "window_pattern"})
    if unknown:
        raise ValueError(f"{where} has fields nanochat's GPTConfig does not: {short(unknown, 80)}")
    out: dict[str, Any] = {}
    caps = {"sequence_len": MAX_POSITIONS // 10, "vocab_size": MAX_PRETRAINED_VOCAB, "n_layer": MAX_LAYERS}
    for key in CONFIG_KEYS:
        value = mc.get(key)
        top = caps.get(key, 2**31 - 1)
        if not is_int(value) or not 1 <= value <= top:
            raise ValueError(f"{where}['{key}'] must be a whole number from 1 to {top:,}, got {short(value)}")
        out[key] = value
    pattern = mc.get("window_pattern", "L")
    if not isinstance(pattern, str) or not 0 < len(pattern) <= MAX_PATTERN or set(pattern.upper()) - {"S", "L"}:
        raise ValueError(f"{where}['window_pattern'] must be letters S and L, got {short(pattern)}")
    out["window_pattern"] = pattern.upper()
    C, H, KV = out["n_embd"], out["n_head"], out["n_kv_head"]
    if C % H or H % KV or (C // H) % 2:
        raise ValueError(f"{where}: n_embd ({C}) must split into n_head ({H}) heads of an even size, and n_head "
                         f"into groups of n_kv_head ({KV})")
    if C < SMEAR_WIDTH:
        raise ValueError(f"{where}: n_embd is {C}; nanochat's smear reads {SMEAR_WIDTH} channels")
    return out


def windows(mc: dict[str, Any]) -> tuple[int, ...]:
    """Each layer's window as the engine counts it (keys, the query's own included): nanochat's w keys
    before the query, plus its own. S layers: a quarter of sequence_len rounded up to 128; L layers and the
    last: sequence_len."""
    long = mc["sequence_len"]
    short_w = -(-(long // 4) // 128) * 128
    sizes = [short_w if mc["window_pattern"][i % len(mc["window_pattern"])] == "S" else long
             for i in range(mc["n_layer"])]
    sizes[-1] = long
    return tuple(w + 1 for w in sizes)


def value_embed_layers(n_layer: int) -> tuple[int, ...]:
    """nanochat's has_ve: alternating layers, the last always among them."""
    return tuple(i for i in range(n_layer) if i % 2 == (n_layer - 1) % 2)


def model_config(mc: dict[str, Any]) -> ModelConfig:
    """The engine's config of a nanochat model (see the module docstring)."""
    V, L, C = mc["vocab_size"], mc["n_layer"], mc["n_embd"]
    padded = -(-V // PAD_TO) * PAD_TO
    return ModelConfig(
        vocab_size=padded, vocab_used=V if padded != V else None, block_size=10 * mc["sequence_len"],
        n_layers=L, n_heads=mc["n_head"], n_kv_heads=mc["n_kv_head"], d_model=C, d_ff=4 * C,
        pos_encoding="rope", pe_base=ROPE_BASE, rope_precision="float32", norm="pre", norm_kind="rmsnorm",
        norm_eps=EPS, norm_weight=False, activation="relu2", bias=False, tie_weights=False, init="torch",
        attn_window=windows(mc), qk_norm="head", qk_gain=QK_GAIN, logit_softcap=SOFTCAP, embed_norm=True,
        smear_width=SMEAR_WIDTH, x0_mix=True, value_embed_layers=value_embed_layers(L), value_gate_width=GATE_WIDTH,
        value_gate_scale=GATE_SCALE, backout_layer=L // 2,
    )


def expected_shapes(mc: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every tensor of a current nanochat model of this config, by nanochat's name."""
    V, L, C, H, KV = -(-mc["vocab_size"] // PAD_TO) * PAD_TO, mc["n_layer"], mc["n_embd"], mc["n_head"], mc["n_kv_head"]
    kvd = KV * (C // H)
    shapes = {"resid_lambdas": (L,), "x0_lambdas": (L,), "smear_lambda": (1,), "backout_lambda": (1,),
              "transformer.wte.weight": (V, C), "lm_head.weight": (V, C), "smear_gate.weight": (1, SMEAR_WIDTH)}
    ve = value_embed_layers(L)
    for i in range(L):
        p = f"transformer.h.{i}."
        shapes.update({p + "attn.c_q.weight": (C, C), p + "attn.c_k.weight": (kvd, C), p + "attn.c_v.weight": (kvd, C),
                       p + "attn.c_proj.weight": (C, C), p + "mlp.c_fc.weight": (4 * C, C),
                       p + "mlp.c_proj.weight": (C, 4 * C)})
        if i in ve:
            shapes[p + "attn.ve_gate.weight"] = (KV, GATE_WIDTH)
            shapes[f"value_embeds.{i}.weight"] = (V, kvd)
    return shapes


def version_refusal(names: set[str], tensors: dict[str, torch.Tensor]) -> str | None:
    """Why these weights are not of nanochat's current model (with the smear, 2026-03-14 on), or None.
    Earlier versions differ in numbers the files do not hold (rotary base, q/k scale, soft-cap)."""
    if "smear_gate.weight" in names:
        return None
    gates = [t for n, t in tensors.items() if n.endswith("attn.ve_gate.weight")]
    if gates and gates[0].shape[-1] == GATE_WIDTH:
        era = "nanochat of 2026-03-09 to 03-14 (value-embedding gates but no smear), whose q/k scale and windows differ"
    elif gates:
        era = ("nanochat of January to March 2026 (value-embedding gates of width 32), whose rotary base, q/k scale "
               "and soft-cap (15 or 20, which the file does not say) differ")
    else:
        era = "nanochat before 2026 (no value embeddings), whose rotary base and q/k scale differ"
    return (f"these weights come from {era}; only checkpoints of nanochat's current model (with smear_gate, "
            "2026-03-14 on) are opened, as nanochat itself opens only those")


def check_tensors(tensors: dict[str, torch.Tensor], mc: dict[str, Any]) -> None:
    """Names and shapes exactly as the meta's model_config says, and every value finite."""
    why = version_refusal(set(tensors), tensors)
    if why:
        raise ValueError(why)
    shapes = expected_shapes(mc)
    missing, extra = sorted(set(shapes) - set(tensors)), sorted(set(tensors) - set(shapes))
    if missing or extra:
        raise ValueError(f"the weights do not match the meta file's model_config: missing {short(missing[:3], 120)}, "
                         f"unexpected {short(extra[:3], 120)}")
    for name, t in tensors.items():
        if tuple(t.shape) != shapes[name]:
            raise ValueError(f"tensor {name} has shape {list(t.shape)}, but the model_config says {list(shapes[name])}")
        if not torch.isfinite(t).all():
            raise ValueError(f"tensor {name} contains NaN or infinite values")


def rotary_rows(w: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    """A query or key projection's rows (heads * hs, C), each head's re-laid from nanochat's halves turned
    by -θ to the engine's consecutive pairs turned by +θ: b_0, a_0, b_1, a_1, ... (module docstring)."""
    half = head_dim // 2
    order = torch.stack([torch.arange(half) + half, torch.arange(half)], dim=1).reshape(-1)
    return w.reshape(heads, head_dim, -1)[:, order].reshape(w.shape)


def convert(tensors: dict[str, torch.Tensor], mc: dict[str, Any], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """The engine's state dict (float32) from nanochat's tensors."""
    t = {k: v.to(torch.float32) for k, v in tensors.items()}
    H, KV, hs = cfg.n_heads, cfg.kv_heads, cfg.head_dim
    state = {"tok_emb.weight": t["transformer.wte.weight"], "head.weight": t["lm_head.weight"],
             "smear_gate.weight": t["smear_gate.weight"], "smear_lambda": t["smear_lambda"],
             "backout_lambda": t["backout_lambda"]}
    for i in range(cfg.n_layers):
        p, b = f"transformer.h.{i}.", f"blocks.{i}."
        q, k = rotary_rows(t[p + "attn.c_q.weight"], H, hs), rotary_rows(t[p + "attn.c_k.weight"], KV, hs)
        state[b + "attn.qkv.weight"] = torch.cat([q, k, t[p + "attn.c_v.weight"]])
        state[b + "attn.proj.weight"] = t[p + "attn.c_proj.weight"]
        state[b + "ffn.up.weight"], state[b + "ffn.down.weight"] = t[p + "mlp.c_fc.weight"], t[p + "mlp.c_proj.weight"]
        state[b + "resid_lambda"], state[b + "x0_lambda"] = t["resid_lambdas"][i : i + 1], t["x0_lambdas"][i : i + 1]
        if i in cfg.value_embed_layers:
            state[b + "attn.ve_gate.weight"] = t[p + "attn.ve_gate.weight"]
            state[f"value_embeds.{i}.weight"] = t[f"value_embeds.{i}.weight"]
    return {k: v.contiguous() for k, v in state.items()}


def check_pickle_globals(path: Path) -> None:
    """Refuse a model file whose pickle names a global nanochat's files never hold (PICKLE_GLOBALS), before
    torch reads it; the pickle is read opcode by opcode, never run."""
    try:
        with zipfile.ZipFile(path) as z:
            entries = [i for i in z.infolist() if i.filename.endswith("/data.pkl") or i.filename == "data.pkl"]
            if len(entries) != 1 or entries[0].file_size > MAX_PICKLE_BYTES:
                raise ValueError(f"{path.name} is not a torch.save file with one pickle of at most "
                                 f"{MAX_PICKLE_BYTES:,} bytes")
            data = z.read(entries[0])
    except (zipfile.BadZipFile, OSError, RuntimeError):
        raise ValueError(f"{path.name} is not a torch.save zip archive (nanochat writes one)") from None
    try:
        for op, arg, _ in pickletools.genops(data):
            if op.name == "STACK_GLOBAL" or (op.name == "GLOBAL" and arg not in PICKLE_GLOBALS):
                named = arg.replace(" ", ".") if isinstance(arg, str) else "a global named on the stack"
                raise ValueError(f"{path.name}'s pickle asks for {short(named, 80)}, which a nanochat model file "
                                 "never holds; it was refused and nothing in it was run")
    except ValueError as exc:
        if path.name in str(exc):
            raise
        raise ValueError(f"{path.name} holds a pickle that cannot be read") from None
    except Exception:
        raise ValueError(f"{path.name} holds a pickle that cannot be read") from None


def read_weights(files: NanochatFiles, max_bytes: int = MAX_TORCH_FILE_BYTES, **limits: Any) -> dict[str, torch.Tensor]:
    """The model file's tensors (float32), read in a capped child process after its globals are checked."""
    check_pickle_globals(files.model)
    with tempfile.TemporaryDirectory(prefix="decoder-lab-nanochat-") as tmp:
        load_torch_weights(files.model, tmp, max_bytes=max_bytes, layout="state_dict", **limits)
        return load_file(str(Path(tmp) / "tensors.safetensors"))


def load_nanochat(src: str | Path, **limits: Any) -> NanochatRun:
    """Open the nanochat checkpoint at `src` (a checkpoint folder or a model_<step>.pt); any problem is a
    ValueError sentence."""
    files = locate(src)
    mc = read_meta(files.meta)
    cfg = model_config(mc)
    check_model_size(cfg, source=f"the nanochat {files.meta.name}")  # before the tokenizer or a tensor is read
    tok = nanochat_tokenizer(files.tokenizer, mc["vocab_size"])
    tensors = read_weights(files, **limits)
    check_tensors(tensors, mc)
    model = build(cfg, convert(tensors, mc, cfg))
    notes = {"source": "nanochat", "step": files.step, "name": files.model.parent.name,
             "model_config": json.loads(json.dumps(mc))}
    return NanochatRun(model, tok, notes)
