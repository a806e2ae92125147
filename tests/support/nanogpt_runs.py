"""nanoGPT runs written the way nanoGPT writes them (ckpt.pt, meta.pkl), from a GPT-2 reference."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel


CHARS = list("\n !',.:;?abcdefghijklmnopqrstuvwxyz")

CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def reference(vocab: int, bias: bool = True, seed: int = 0, block: int = 32) -> GPT2LMHeadModel:
    """A random GPT-2 with nanoGPT's choices (exact GELU, LayerNorm eps 1e-5, tied head), weights
    large enough that the next-token distribution is far from uniform; without bias, biases are 0."""
    torch.manual_seed(seed)
    cfg = GPT2Config(n_layer=2, n_head=4, n_embd=16, n_positions=block, vocab_size=vocab, activation_function="gelu",
                     layer_norm_epsilon=1e-5, attn_implementation="eager", bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.copy_(0.3 * torch.randn_like(p) if bias else torch.zeros_like(p))
            elif ".ln_" in name:
                p.copy_(1 + 0.3 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.5)
    return model


def nanogpt_dict(ref: GPT2LMHeadModel, bias: bool = True, prefix: str = "") -> dict:
    """The reference's weights as nanoGPT's state dict: same names, nn.Linear's (out, in) layout,
    lm_head the same tensor as wte, no biases when bias=False, the causal-mask buffers of a run
    without flash attention."""
    sd = {}
    for name, t in ref.state_dict().items():
        if name == "lm_head.weight" or (name.endswith(".bias") and not bias):
            continue
        sd[prefix + name] = (t.t() if name.endswith(CONV1D) else t).contiguous().clone()
    sd[prefix + "lm_head.weight"] = sd[prefix + "transformer.wte.weight"]
    block = ref.config.n_positions
    for i in range(ref.config.n_layer):
        sd[f"{prefix}transformer.h.{i}.attn.bias"] = torch.tril(torch.ones(block, block)).view(1, 1, block, block)
    return sd


def save_run(folder: Path, ref: GPT2LMHeadModel, bias: bool = True, prefix: str = "", chars=CHARS,
             **changes) -> Path:
    """ckpt.pt (and meta.pkl when `chars`) as nanoGPT writes them; `changes` replace entries."""
    folder.mkdir(parents=True, exist_ok=True)
    c = ref.config
    sd = nanogpt_dict(ref, bias, prefix)
    args = dict(n_layer=c.n_layer, n_head=c.n_head, n_embd=c.n_embd, block_size=c.n_positions, bias=bias,
                vocab_size=c.vocab_size, dropout=0.0)
    params = [t for k, t in sd.items() if not k.endswith("attn.bias")]
    optimizer = {"state": {i: {"step": torch.tensor(5.0), "exp_avg": torch.randn_like(t), "exp_avg_sq": t.abs()}
                           for i, t in enumerate(params)},
                 "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.99), "params": list(range(len(params)))}]}
    ckpt = {"model": sd, "optimizer": optimizer, "model_args": args, "iter_num": 250,
            "best_val_loss": torch.tensor(1.4697), "config": {"dataset": "shakespeare_char", "batch_size": 64}}
    ckpt.update(changes)
    torch.save(ckpt, folder / "ckpt.pt")
    if chars is not None:
        meta = {"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": {ch: i for i, ch in enumerate(chars)}}
        (folder / "meta.pkl").write_bytes(pickle.dumps(meta))
    return folder / "ckpt.pt"


class _System:
    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def save_decoder_run(folder: Path, entry) -> Path:
    """A built-in character model of nanoGPT's own architecture (the Shakespeare one: learned positions,
    pre-norm, exact GELU, no biases, tied head) written as nanoGPT writes a shakespeare_char run: ckpt.pt
    with its weights under nanoGPT's names (the tokenizer's <unk> row left out: nanoGPT has none) and
    meta.pkl with its characters. The attention of the run, opened, is the built-in's."""
    cfg, sd = entry.model.cfg, entry.model.state_dict()
    assert (cfg.pos_encoding, cfg.norm, cfg.activation, cfg.bias, cfg.tie_weights) == ("learned", "pre", "gelu",
                                                                                        False, True)
    names = {"tok_emb.weight": "transformer.wte.weight", "pos_emb.weight": "transformer.wpe.weight",
             "norm_f.weight": "transformer.ln_f.weight"}
    parts = {"norm1": "ln_1", "attn.qkv": "attn.c_attn", "attn.proj": "attn.c_proj", "norm2": "ln_2",
             "ffn.up": "mlp.c_fc", "ffn.down": "mlp.c_proj"}
    out = {}
    for name, t in sd.items():
        if name in names:
            out[names[name]] = t[1:] if name == "tok_emb.weight" else t
        elif name.startswith("blocks."):
            _, i, rest = name.split(".", 2)
            part, kind = rest.rsplit(".", 1)
            out[f"transformer.h.{i}.{parts[part]}.{kind}"] = t
    out = {k: v.detach().clone().contiguous() for k, v in out.items()}
    out["lm_head.weight"] = out["transformer.wte.weight"]
    chars = [{"␣": " ", "⏎": "\n"}.get(p, p) for p in entry.pieces[1:]]
    folder.mkdir(parents=True, exist_ok=True)
    args = dict(n_layer=cfg.n_layers, n_head=cfg.n_heads, n_embd=cfg.d_model, block_size=cfg.block_size, bias=False,
                vocab_size=len(chars), dropout=0.0)
    torch.save({"model": out, "model_args": args, "iter_num": 5000, "best_val_loss": torch.tensor(1.47),
                "config": {"dataset": "shakespeare_char"}}, folder / "ckpt.pt")
    meta = {"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": {ch: i for i, ch in enumerate(chars)}}
    (folder / "meta.pkl").write_bytes(pickle.dumps(meta))
    return folder / "ckpt.pt"
