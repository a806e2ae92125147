"""A slow by-hand forward that applies head ablations and attention edits: the reference."""

import math

import torch


def by_hand(model, ids, ablate=(), mode="zero", edits=(), streams=None):
    """Slow reference forward: returns (logits, per-layer attention weights actually used).
    streams: a list that receives the residual stream after the embedding and after each block."""
    cfg = model.cfg
    B, T = ids.shape
    C, H, hd = cfg.d_model, cfg.n_heads, cfg.head_dim
    causal = cfg.mask == "causal"
    allowed = torch.tensor([[k <= i or not causal for k in range(T)] for i in range(T)])
    x = model.tok_emb.weight[ids]
    if cfg.pos_encoding == "learned":
        x = x + model.pos_emb.weight[:T]
    elif cfg.pos_encoding == "sinusoidal":
        x = x + model.pe_table[:T]

    def rotate(t):  # RoPE: rotate pairs (2i, 2i+1) of position p by p * base^(-2i/hd)
        out = t.clone()
        for p in range(T):
            for i in range(hd // 2):
                a = p * cfg.pe_base ** (-2 * i / hd)
                c, s = math.cos(a), math.sin(a)
                x1, x2 = t[:, p, 2 * i], t[:, p, 2 * i + 1]
                out[:, p, 2 * i], out[:, p, 2 * i + 1] = x1 * c - x2 * s, x1 * s + x2 * c
        return out

    all_weights = []
    found = [] if streams is None else streams
    found.append(x)

    def attention(layer, inp):
        att = model.blocks[layer].attn
        W, b = att.qkv.weight, att.qkv.bias
        qkv = inp @ W.T + (b if b is not None else 0.0)
        outs, layer_w = [], []
        for h in range(H):
            q = qkv[..., h * hd : (h + 1) * hd]
            k = qkv[..., C + h * hd : C + (h + 1) * hd]
            v = qkv[..., 2 * C + h * hd : 2 * C + (h + 1) * hd]
            if cfg.pos_encoding == "rope":
                q, k = rotate(q), rotate(k)
            s = (q @ k.transpose(1, 2)) / math.sqrt(hd)
            s = s.masked_fill(~allowed, float("-inf"))
            w = torch.softmax(s, dim=-1)
            if (layer, h) in ablate and mode == "uniform":
                w = (allowed.double() / allowed.sum(-1, keepdim=True)).expand(B, T, T)
            for e in edits:
                if (e.layer, e.head) == (layer, h):
                    w = w.clone()
                    if e.key is None:
                        w[:, e.query] = allowed[e.query].double() / allowed[e.query].sum()
                    else:
                        w[:, e.query] = 0.0
                        w[:, e.query, e.key] = 1.0
            o = w @ v  # (B, T, hd): this head's slice of the concatenated outputs
            if (layer, h) in ablate and mode == "zero":
                o = torch.zeros_like(o)
            if (layer, h) in ablate and mode == "mean":
                o = o.mean(dim=1, keepdim=True).expand(B, T, hd)
            outs.append(o)
            layer_w.append(w)
        all_weights.append(torch.stack(layer_w, dim=1))
        y = torch.cat(outs, dim=-1)
        if att.proj is not None:
            y = y @ att.proj.weight.T + (att.proj.bias if att.proj.bias is not None else 0.0)
        return y

    for layer, blk in enumerate(model.blocks):
        if cfg.norm == "post":
            x = blk.norm1(x + attention(layer, x))
            if blk.ffn is not None:
                x = blk.norm2(x + blk.ffn(x))
        else:
            x = x + attention(layer, blk.norm1(x))
            if blk.ffn is not None:
                x = x + blk.ffn(blk.norm2(x))
        found.append(x)
    return model.head(model.norm_f(x)), all_weights
