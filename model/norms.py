"""The normalisations the blocks, the final read-out and the q/k step use: LayerNorm or RMSNorm.

RMSNorm (Zhang & Sennrich 2019) is LayerNorm without the mean or the bias: x / sqrt(mean(x²) + eps),
times a learned weight. Gemma stores that weight minus one and multiplies by (1 + w); the engine keeps
the stored numbers and says so with `offset` (ModelConfig.norm_offset), so a reader of the weights sees
the file's own values.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .config import ModelConfig


class RMSNorm(nn.Module):
    """x / sqrt(mean(x²) + eps) * (offset + weight), over the last dimension; with weight=False
    x / sqrt(mean(x²) + eps) alone (nanochat's parameter-free norm: the model has no weight to hold, so
    none is asked of its files, and none is multiplied in)."""

    def __init__(self, width: int, eps: float, offset: float = 0.0, weight: bool = True):
        super().__init__()
        self.eps, self.offset = eps, offset
        self.weight = nn.Parameter(torch.ones(width)) if weight else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype in (torch.bfloat16, torch.float16):  # 16-bit weights: normalised in float32, as transformers
            return self._from_float32(x)
        variance = x.pow(2).mean(-1, keepdim=True)  # (.., 1): one number per position
        normed = x * torch.rsqrt(variance + self.eps)
        if self.weight is None:
            return normed
        scale = self.weight + self.offset if self.offset else self.weight
        return scale * normed

    def _from_float32(self, x: torch.Tensor) -> torch.Tensor:
        """A 16-bit x: the norm in float32, rounded back; Llama's kind multiplies its weight after the
        rounding, Gemma's (1 + w) before it (each as its transformers class does)."""
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.weight is None:
            return h.to(x.dtype)
        if self.offset:
            return (h * (self.weight.float() + self.offset)).to(x.dtype)
        return self.weight * h.to(x.dtype)


def make_norm(cfg: ModelConfig, width: int | None = None) -> nn.Module:
    """The configured normalisation over `width` features (d_model unless given)."""
    width = cfg.d_model if width is None else width
    if cfg.norm_kind == "rmsnorm":
        return RMSNorm(width, cfg.norm_eps, cfg.norm_offset, cfg.norm_weight)
    return nn.LayerNorm(width, eps=cfg.norm_eps, bias=cfg.part_bias("norm"))
