"""The contract of model/backend.py on a Hugging Face model run by nnsight: in this process (on the CPU, or
spread over the machine's GPUs and CPU with `device_map`), or on NDIF's shared cluster (`remote`).

Decoder Lab's own engine is exact and fast up to about a billion parameters on a CPU; a 7B-70B model needs
GPUs or NDIF. nnsight runs the model's own transformers code and lets a trace read and set any module's
input or output, and any operation inside a forward (`.source`). Every forward here is one nnsight session:
an optional trace over the patch's source prompt, which keeps the activations a patch needs, then one trace
per run (one for a forward, one per cell of a sweep). A sweep (`patch_steps`) is one session per chunk of
max(1, batch_tokens // T) cells, so that a caller sees progress between chunks and a remote sweep is a few
requests, not one per cell. For NDIF each session is one request.

Where each number is read (`run_session`, at the end of this file, runs the session):

* attention probabilities: the attention module's second output, computed eagerly (attn_implementation
  "eager": the fused kernels never form the probabilities); an edited row or a uniform head is set on the
  output of the dropout step inside the attention function (`attention_interface` → nn.functional.dropout,
  right after the softmax), so the edited weights are the ones that multiply the values and the ones returned;
* attention scores: the input of that softmax (scaled, after Gemma's soft-cap, plus transformers' mask),
  where the own engine's mask hides a key set to -inf afterwards: transformers adds a large negative number
  instead, so its value says nothing; an edited row or a uniform head changes what comes after the softmax,
  so its scores are the model's own, as the own engine returns them;
* head outputs: the input of the attention's output projection (o_proj; c_proj for GPT-2, dense for
  GPT-NeoX), split into heads; zero, mean and scale set it there;
* residual stream: the first decoder layer's input (after the embedding), then each decoder layer's output;
* attention and MLP branches (for patching): the attention module's first output and the MLP's output, or,
  in a block that normalises what its branches write (Gemma 2/3, OLMo 2), the output of that norm;
* logits: the model's own output (after Gemma 2's soft-cap).

What a run changes is worked out before the session, as plain tensors (`plan_run`), so that a session sent to
NDIF carries nothing but data: nnsight ships the body of a `with` block as its source text and its variables
pickled, and the server has torch and nnsight but not this project. What each change means is the own
engine's: uniform heads and edited rows are the rows `LayerPlan.apply_to_weights` makes (computed once on a
tensor of NaN: what comes back as a number is a replaced row); zero, mean and scale are one factor per head
and the heads that take their mean over the text's positions; a patch is a boolean mask per site choosing the
source run's values.

The model's shape (layers, heads, windows, the vocabulary) is read from config.json by the own engine's
importer (model/families), and the tokenizer is the own engine's reading of tokenizer.json, so both
backends encode, validate and decode alike. Supported: gpt2, gpt_neox, llama, qwen2, qwen3, smollm3, phi3,
olmo2, gemma2 and gemma3_text; any other model_type is refused by name, as is what nnsight cannot do here
(training, films, the rebuild of one cell: they run on the own engine's modules).

nnsight (and, through it, transformers) is imported only when this backend is chosen: importing this module
imports neither.

NDIF (`remote=True`): the key is read from the environment variable NDIF_KEY_ENV for each request and handed
to nnsight's request, never kept, logged or shown; NDIF_HOST_ENV may name another host. nnsight speaks to
NDIF over HTTP and one websocket (its RemoteBackend: GET /subscribe, POST /request with the key in the
`ndif-api-key` header, status updates, then the saved values as a compressed torch file), and that is what
tests/support/fake_ndif.py answers on 127.0.0.1, running the request with nnsight's own deserializer on a
local copy of the model. nnsight's status line is turned off: the command line prints its own output only.
"""

from __future__ import annotations

import importlib.util
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

from .attention import causal_mask
from .backend import BACKEND_TOOLS, ForwardRequest, ForwardResult, check_request, check_sweep, join_chunks, sweep_chunks
from .config import ModelConfig
from .families import family_of
from .families.common import read_config
from .hf_tokenizer import HFFileTokenizer
from .interventions import OUTPUT_MODES, WEIGHT_MODES, Intervention
from .json_bounds import short
from .sources import kind_of, local_path, shortened

NDIF_KEY_ENV = "NDIF_API_KEY"  # the NDIF key's environment variable (nnsight reads the same name)
NDIF_HOST_ENV = "NDIF_HOST"  # another NDIF host, e.g. a test server (nnsight reads the same name)
WEIGHTS = ("float32", "stored")
# The files a remote model's shape and tokenizer are read from (the weights stay on NDIF).
REMOTE_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json")


@dataclass(frozen=True)
class Reach:
    """Where a family's modules sit in its transformers model (dotted attribute paths)."""

    layers: str  # the decoder layers
    attn: str  # each layer's attention module
    out_proj: str  # the attention's output projection, whose input is the heads side by side
    mlp: str  # each layer's MLP
    attn_norm: str | None = None  # the norm of the attention branch's output, in a block that has one
    mlp_norm: str | None = None  # the norm of the MLP branch's output


_LLAMA = Reach("model.layers", "self_attn", "o_proj", "mlp")
_NORMED = Reach("model.layers", "self_attn", "o_proj", "mlp", "post_attention_layernorm", "post_feedforward_layernorm")
REACH = {"gpt2": Reach("transformer.h", "attn", "c_proj", "mlp"),
         "gpt_neox": Reach("gpt_neox.layers", "attention", "dense", "mlp"),
         "llama": _LLAMA, "qwen2": _LLAMA, "qwen3": _LLAMA, "smollm3": _LLAMA, "phi3": _LLAMA,
         "olmo2": _NORMED, "gemma2": _NORMED, "gemma3_text": _NORMED}
# Families the own engine opens whose attention nnsight does not reach the same way, and why.
NOT_REACHED = {
    "gpt_neo": "GPT-Neo computes its attention in its own method (_attn), not in the attention function the "
               "other families share",
    "gemma3": "this Gemma 3 folder holds the multimodal model, whose text layers sit under another path; use "
              "a folder of the text model alone (model_type gemma3_text)",
}
REFUSED_TOOLS = {
    "train": "training runs on the own engine's modules; the nnsight backend runs a model it does not own",
    "film": "a training film is recorded while the own engine trains",
    "inside": "the rebuild of one attention cell calls the own engine's layer modules",
}


def nnsight_available() -> bool:
    """Whether nnsight is installed (requirements-scale.txt), without importing it."""
    return importlib.util.find_spec("nnsight") is not None


class NnsightBackend:
    """The contract (model/backend.py) on a Hugging Face model run by nnsight (see the module docstring).

    source: a Hugging Face model folder, or with remote=True a Hub repo id (owner/name) that NDIF hosts, whose
    config.json and tokenizer.json are fetched (the weights stay there). device_map: passed to transformers
    ("auto": spread over the GPUs and the CPU; needs the accelerate package). weights: "float32" (the default,
    as the own engine) or "stored" (the folder's own dtype). Refusals are ValueErrors of one sentence."""

    name = "nnsight"

    def __init__(self, source: str | Path, device_map: str | dict | None = None, remote: bool = False,
                 weights: str = "float32"):
        if weights not in WEIGHTS:
            raise ValueError(f"weights must be one of {', '.join(WEIGHTS)}, got {short(weights)}")
        if remote and device_map is not None:
            raise ValueError("a remote model is placed by NDIF: --device-map is for a model run on this machine")
        if not nnsight_available():
            raise ValueError("the nnsight backend needs nnsight: pip install -r requirements-scale.txt")
        if remote:
            _ndif_key()  # refused now, before anything loads, when there is no key to send
        if device_map is not None and importlib.util.find_spec("accelerate") is None:
            raise ValueError("--device-map needs the accelerate package, which transformers uses to place the "
                             "layers: pip install -r requirements-scale.txt")
        self.source, self.remote, self.device_map = str(source), bool(remote), device_map
        folder = self._folder(self.source)
        hf = read_config(folder)
        model_type = hf.get("model_type")
        if model_type in NOT_REACHED:
            raise ValueError(f"the nnsight backend cannot reach this model's heads: {NOT_REACHED[model_type]}")
        family = family_of(hf)  # any model_type the own engine does not read is refused here, by name
        self.family = model_type
        self.reach = REACH[model_type]
        self.cfg = family.model_config(hf)
        self.tokenizer = HFFileTokenizer.from_folder(folder, family.adds_bos, hf, model_rows=self.cfg.vocab_size)
        if self.tokenizer.vocab_size > self.cfg.vocab_size:
            raise ValueError(f"tokenizer.json has {self.tokenizer.vocab_size:,} tokens but the model only "
                             f"{self.cfg.vocab_size:,} embedding rows; they do not belong together")
        if self.tokenizer.vocab_size < self.cfg.vocab_size:  # padded rows are never sampled (ModelConfig.vocab_used)
            self.cfg = self.cfg.replace(vocab_used=self.tokenizer.vocab_size)
        self.host = os.environ.get(NDIF_HOST_ENV) or None
        self.model = self._load(folder, weights)
        self.envoys = self._envoys()
        self.model_key = self._model_key() if self.remote else None

    def _model_key(self) -> str:
        """The name NDIF knows the model by: nnsight's key (its class, the repo id as the Hub spells it)."""
        try:
            return self.model.to_model_key()
        except Exception as exc:  # the Hub asked for the repo id's own spelling cannot be reached, or says no
            raise ValueError(f"cannot name {shortened(self.source)} for NDIF: the Hugging Face Hub did not answer "
                             f"({type(exc).__name__})") from None

    def _folder(self, source: str) -> Path:
        """The folder config.json and tokenizer.json are read from: the source itself, or for a remote repo id
        those files alone, fetched from the Hub into its cache."""
        path = local_path(source)
        kind = kind_of(path)
        if kind == "folder":
            return path
        if not self.remote:
            what = "does not exist" if kind is None else "is not a folder"
            raise ValueError(f"{shortened(source)} {what}; the nnsight backend opens a Hugging Face model folder")
        from huggingface_hub import snapshot_download

        try:
            return Path(snapshot_download(source, allow_patterns=list(REMOTE_FILES)))
        except Exception as exc:  # an unknown repo, a gated one without a Hub token, no network
            raise ValueError(f"cannot fetch {shortened(source)}'s config.json and tokenizer.json from the Hugging "
                             f"Face Hub ({type(exc).__name__})") from None

    def _load(self, folder: Path, weights: str):
        import nnsight

        self.nnsight = nnsight
        # eager attention: the probabilities exist as a tensor, and the dropout step after the softmax is there
        # to set edited rows on; use_safetensors: a folder's pickled weights (.bin) are never unpickled
        options = {"task": "text-generation", "attn_implementation": "eager"}
        if self.remote:  # a meta model here (no weights); NDIF runs its own copy
            # the tokenizer named outright: nnsight 0.8.1's meta build asks the pipeline class which preprocessors
            # it loads by flags transformers 5 no longer has, and would pass none
            return nnsight.TransformersModel(self.source, tokenizer=str(folder), **options)
        options.update(dispatch=True, use_safetensors=True, dtype=torch.float32 if weights == "float32" else "auto")
        if self.device_map is not None:
            options["device_map"] = self.device_map
        try:
            model = nnsight.TransformersModel(str(folder), **options)
        except (OSError, ValueError) as exc:
            raise ValueError(f"transformers cannot load {shortened(self.source)}: "
                             f"{' '.join(str(exc).split())[:200]}") from None
        model.requires_grad_(False)
        return model

    def _envoys(self) -> dict:
        """The envoys a session reads and sets, per layer, and the name of the attention function's call."""
        r = self.reach
        layers = _walk(self.model, r.layers)
        blocks = [layers[i] for i in range(self.cfg.n_layers)]
        attns = [getattr(b, r.attn) for b in blocks]
        names = [n for n in attns[0].source.names if n.startswith("attention_interface_")]
        if not names:
            raise ValueError(f"this transformers version's {self.family} attention has no attention function "
                             "for nnsight to reach")
        return {
            "blocks": blocks, "attns": attns, "outs": [getattr(a, r.out_proj) for a in attns],
            # (module, whether the branch is its first output): the attention module returns (output, weights)
            "attn_branch": [(getattr(b, r.attn_norm), False) if r.attn_norm else (a, True)
                            for b, a in zip(blocks, attns)],
            "mlp_branch": [getattr(b, r.mlp_norm or r.mlp) for b in blocks],
            "interface": names[-1],  # the call; an earlier name of the same stem is the assignment that picks it
        }

    # ------------------------------------------------------------------------------------------ the contract

    def where(self) -> str:
        size = f"{self.cfg.n_params():,} parameters"
        if self.remote:
            return f"NDIF ({self.host or 'its default host'}), {self.source}, {size}"
        devices = sorted({str(p.device) for p in self.model.parameters()})
        how = f" (device_map {self.device_map})" if self.device_map is not None else ""
        return f"nnsight in this process on {', '.join(devices)}{how}, {size}"

    def refusal(self, tool: str) -> str | None:
        if tool not in BACKEND_TOOLS:
            raise ValueError(f"tool must be one of {', '.join(BACKEND_TOOLS)}, got {short(tool)}")
        return f"The nnsight backend does not offer this: {REFUSED_TOOLS[tool]}."

    def forward(self, request: ForwardRequest) -> ForwardResult:
        check_request(self.cfg, request)
        started = time.perf_counter()
        sites = request.patch.sites if request.patch is not None else ()
        T = len(request.ids)
        run = plan_run(self.cfg, T, request.intervention, request.scales, sites, request.heads_wanted(self.cfg),
                       request.head_outputs, request.residuals, request.logits, request.scores)
        source = request.patch.source_ids if request.patch is not None else None
        out = self._session(request.ids, source, [run])[0]
        hidden = {l: self._hidden(l, T) for l in out["scores"]}
        return ForwardResult(
            logits=out["logits"],
            attention={(l, h): out["attention"][l][i] for l, heads in run["attention"].items()
                       for i, h in enumerate(heads)},
            scores={(l, h): out["scores"][l][i].masked_fill(hidden[l], float("-inf"))
                    for l, heads in run["attention"].items() if l in out["scores"] for i, h in enumerate(heads)},
            head_outputs=tuple(out["heads"]) if request.head_outputs else None,
            residuals=tuple(out["resid"]) if request.residuals else None,
            seconds=time.perf_counter() - started)

    def _hidden(self, layer: int, T: int) -> torch.Tensor:
        """(T, T) True where the own engine's mask hides key k from query q in `layer` (its window included)."""
        if self.cfg.mask != "causal":
            return torch.zeros(T, T, dtype=torch.bool)
        return causal_mask(T, T, window=self.cfg.window(layer))

    def patch_steps(self, ids, source_ids, sites, batch_tokens: int | None = None) -> Iterator[torch.Tensor]:
        ids, source_ids, sites, per_chunk = check_sweep(self.cfg, ids, source_ids, sites, batch_tokens)
        return self._sweep(ids, source_ids, sites, per_chunk)

    def _sweep(self, ids, source_ids, sites, per_chunk: int) -> Iterator[torch.Tensor]:
        """One session per chunk of a checked sweep (its sites may come from several layers): a run per site."""
        for start, stop in sweep_chunks(sites, per_chunk, one_layer=False):
            runs = [plan_run(self.cfg, len(ids), None, (), (s,), (), False, False, "last") for s in sites[start:stop]]
            yield torch.stack([o["logits"][-1] for o in self._session(ids, source_ids, runs)])

    def patch_cells(self, ids, source_ids, sites) -> torch.Tensor:
        return join_chunks(self.patch_steps(ids, source_ids, sites), self.cfg.vocab_size)

    def _session(self, ids: tuple[int, ...], source_ids: tuple[int, ...] | None, runs: list[dict]) -> list[dict]:
        """Run the session (`run_session`) here or on NDIF; every tensor back on the CPU."""
        backend = self._remote_backend() if self.remote else None
        try:
            outs = run_session(self.model, self.nnsight, self.envoys, self.cfg, ids, source_ids, runs,
                               records_needed(runs), backend)
        except Exception as exc:
            if type(exc).__name__ == "RemoteError":  # NDIF's answer, in one sentence
                raise ValueError(f"NDIF refused or failed the request: {' '.join(str(exc).split())[:300]}") from None
            raise
        return [_to_cpu(o) for o in outs]

    def _remote_backend(self):
        """nnsight's request to NDIF, with the key read from the environment for this request alone."""
        from nnsight.intervention.backends.remote import RemoteBackend

        backend = RemoteBackend(self.model_key, host=self.host, api_key=_ndif_key())
        backend.display.enabled = False  # nnsight's status line would write into the command's own output
        return backend


def _ndif_key() -> str:
    """The NDIF API key from the environment (never kept, logged or shown), or a refusal naming the variable."""
    key = os.environ.get(NDIF_KEY_ENV, "").strip()
    if not key:
        raise ValueError(f"a remote model needs an NDIF API key in the environment variable {NDIF_KEY_ENV} "
                         "(an NDIF account gives one)")
    return key


def _walk(root, dotted: str):
    for part in dotted.split("."):
        root = getattr(root, part)
    return root


def _to_cpu(value):
    """Every tensor of a session's result on the CPU, 16-bit numbers as float32 (as the own engine reads them)."""
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu()
        return t.float() if t.dtype in (torch.bfloat16, torch.float16) else t
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    return value


def open_nnsight(source: str | Path, device_map: str | None = None, remote: bool = False,
                 weights: str = "float32") -> NnsightBackend:
    """The backend for the command line's --backend nnsight (ValueError: one sentence saying why not)."""
    return NnsightBackend(source, device_map=device_map, remote=remote, weights=weights)


# ------------------------------------------------------------------------------ the session


def plan_run(cfg: ModelConfig, T: int, intervention: Intervention | None, scales, sites,
             heads: tuple[tuple[int, int], ...], head_outputs: bool, residuals: bool, logits: str,
             scores: bool = False) -> dict:
    """One run over a text of T tokens: its changes per layer and what it reads (see the module docstring).

    rows {layer: (replace (1, H, T, T) bool, new rows (1, H, T, T))}; keep {layer: (H,) factor}; mean {layer:
    (H,) bool}; swap {(kind, layer): mask}, mask (1, T, H, 1) for a head, (1, T, 1) otherwise; attention
    {layer: [heads]}; heads, resid: whether to return the head outputs and residual streams; scores: whether to
    return the attention heads' pre-softmax scores as well; logits "all"/"last"."""
    H = cfg.n_heads
    run = {"rows": {}, "keep": {}, "mean": {}, "swap": {}, "attention": {}, "heads": head_outputs,
           "resid": residuals, "logits": logits, "scores": scores}
    plans = intervention.layer_plans(cfg, T) if intervention is not None and not intervention.is_empty else []
    for layer, plan in enumerate(plans):
        if plan is None:
            continue
        if plan.edits or (plan.mode in WEIGHT_MODES and plan.ablate):
            allowed = (~causal_mask(T, T, window=cfg.window(layer)) if cfg.mask == "causal"
                       else torch.ones(T, T, dtype=torch.bool))
            rows = plan.apply_to_weights(torch.full((1, H, T, T), float("nan")), allowed)
            replace = ~torch.isnan(rows)
            run["rows"][layer] = (replace, torch.nan_to_num(rows, nan=0.0))
        if plan.mode in OUTPUT_MODES and plan.ablate:
            keep, mean = _factors(run, layer, H)
            keep[list(plan.ablate)] = 0.0
            if plan.mode == "mean":
                mean[list(plan.ablate)] = True
    for s in scales:
        keep, _ = _factors(run, s.layer, H)
        keep[s.head] = float(s.factor)
    for s in sites:
        key = (s.kind, s.layer)
        shape = (1, T, H, 1) if s.kind == "head" else (1, T, 1)
        mask = run["swap"].setdefault(key, torch.zeros(shape, dtype=torch.bool))
        where = slice(None) if s.positions is None else list(s.positions)
        if s.kind == "head":
            mask[0, where, s.head] = True
        else:
            mask[0, where] = True
    for layer, head in heads:
        run["attention"].setdefault(layer, []).append(head)
    return run


def _factors(run: dict, layer: int, H: int) -> tuple[torch.Tensor, torch.Tensor]:
    if layer not in run["keep"]:
        run["keep"][layer] = torch.ones(H, dtype=torch.float64)
        run["mean"][layer] = torch.zeros(H, dtype=torch.bool)
    return run["keep"][layer], run["mean"][layer]


def records_needed(runs: list[dict]) -> set[tuple[str, int]]:
    """The (kind, layer) activations of the source run that some run's patch reads."""
    return {key for run in runs for key in run["swap"]}


def run_session(model, nnsight, envoys: dict, cfg: ModelConfig, ids, source_ids, runs: list[dict],
                record: set, backend=None) -> list[dict]:
    """One nnsight session: a trace over `source_ids` keeping the activations `record` names (when a run
    patches), then one trace over `ids` per run. Returns per run {"logits", "attention" and "scores" (the
    softmax's input, the mask's large negative number in it): {layer: (h, T, T)}, "heads": [(H, T, hs)],
    "resid": [(T, C)]}. backend: nnsight's remote backend, or None to run here.

    Everything the body reads is a local variable of plain data (tensors, lists, dicts) or an envoy, and it
    calls nothing of this project: that is what lets nnsight send it to NDIF as it is. nnsight sends the body
    as `ast.unparse` writes it, which keeps only the first statement's line: so that each inner `with` keeps
    its line too (nnsight finds a trace's block by its line), the body has no blank line, no line holding a
    comment alone and no statement over several lines."""
    L, H, hs = cfg.n_layers, cfg.n_heads, cfg.head_dim
    blocks, attns, outs = envoys["blocks"], envoys["attns"], envoys["outs"]
    attn_branch, mlp_branch, interface = envoys["attn_branch"], envoys["mlp_branch"], envoys["interface"]
    x, src = torch.tensor([list(ids)]), None if source_ids is None or not record else torch.tensor([list(source_ids)])
    with torch.no_grad(), model.session(**({} if backend is None else {"backend": backend})):
        def swapped(mask, mine, theirs):  # first: unparse puts a blank line before a def anywhere else
            return torch.where(mask.to(mine.device), theirs.to(mine.device, mine.dtype), mine)
        kept, results = {}, []  # kept: the source run's activations, by (kind, layer)
        if src is not None:
            with model.trace(src):
                for layer in range(L):
                    if layer == 0 and ("resid", 0) in record:
                        kept["resid", 0] = blocks[0].input.detach().clone()
                    if ("head", layer) in record:
                        kept["head", layer] = outs[layer].input.detach().clone()
                    if ("attn", layer) in record:
                        module, first = attn_branch[layer]
                        kept["attn", layer] = (module.output[0] if first else module.output).detach().clone()
                    if ("mlp", layer) in record:
                        kept["mlp", layer] = mlp_branch[layer].output.detach().clone()
                    if ("resid", layer + 1) in record:
                        kept["resid", layer + 1] = blocks[layer].output.detach().clone()
        for run in runs:
            swap = run["swap"]
            with model.trace(x):
                out = {"attention": {}, "scores": {}, "heads": [], "resid": []}
                for layer in range(L):
                    if layer == 0 and (run["resid"] or ("resid", 0) in swap):
                        r = blocks[0].input
                        if ("resid", 0) in swap:
                            r = swapped(swap["resid", 0], r, kept["resid", 0])
                            blocks[0].input = r
                        if run["resid"]:
                            out["resid"].append(r[0].detach().clone())
                    if run["scores"] and layer in run["attention"]:  # the softmax's input: scores plus the mask
                        scores = getattr(getattr(attns[layer].source, interface).source, "nn_functional_softmax_0")
                        out["scores"][layer] = scores.input[0, run["attention"][layer]].detach().clone()
                    if layer in run["rows"]:  # the weights after the softmax (and its dropout), before V
                        step = getattr(getattr(attns[layer].source, interface).source, "nn_functional_dropout_0")
                        w = step.output
                        replace, new = run["rows"][layer]
                        step.output = torch.where(replace.to(w.device), new.to(w.device, w.dtype), w)
                    if layer in run["keep"] or ("head", layer) in swap or run["heads"]:
                        z = outs[layer].input  # (1, T, H * hs): the heads side by side
                        zh = z.reshape(z.shape[0], z.shape[1], H, hs)
                        if layer in run["keep"]:
                            keep = run["keep"][layer].to(z.device, z.dtype).view(1, 1, H, 1)
                            mean = run["mean"][layer].to(z.device).view(1, 1, H, 1)
                            zh = torch.where(mean, zh.mean(dim=1, keepdim=True), zh * keep)
                        if ("head", layer) in swap:
                            zh = swapped(swap["head", layer], zh, kept["head", layer].reshape(zh.shape))
                        if layer in run["keep"] or ("head", layer) in swap:
                            outs[layer].input = zh.reshape(z.shape)
                        if run["heads"]:
                            out["heads"].append(zh[0].transpose(0, 1).detach().clone())  # (H, T, hs)
                    module, first = attn_branch[layer]
                    if layer in run["attention"] or (first and ("attn", layer) in swap):
                        o = attns[layer].output
                        if layer in run["attention"]:
                            out["attention"][layer] = o[1][0, run["attention"][layer]].detach().clone()
                        if first and ("attn", layer) in swap:
                            attns[layer].output = (swapped(swap["attn", layer], o[0], kept["attn", layer]), *o[1:])
                    if not first and ("attn", layer) in swap:
                        module.output = swapped(swap["attn", layer], module.output, kept["attn", layer])
                    if ("mlp", layer) in swap:
                        m = mlp_branch[layer].output
                        mlp_branch[layer].output = swapped(swap["mlp", layer], m, kept["mlp", layer])
                    if run["resid"] or ("resid", layer + 1) in swap:
                        r = blocks[layer].output
                        if ("resid", layer + 1) in swap:
                            r = swapped(swap["resid", layer + 1], r, kept["resid", layer + 1])
                            blocks[layer].output = r
                        if run["resid"]:
                            out["resid"].append(r[0].detach().clone())
                out["logits"] = model.output.logits[0, (0 if run["logits"] == "all" else -1):].detach().clone()
                results.append(out)
        results = nnsight.save(results)
    return results
