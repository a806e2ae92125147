"""A training step with a hand-written backward pass over flat weight buffers.

On a 2-vCPU machine a small model's training step is bounded less by its matrix products than by
the number of operations it dispatches: autograd records ~1,500 aten calls per step of the
benchmark model (views, casts, per-parameter gradient clipping and optimizer bookkeeping), each
costing microseconds. `ManualStep` computes the same loss and gradients with about a fifth of
them:

* the backward pass is written out by hand (matrix products, `native_layer_norm_backward`,
  `gelu_backward`, `_softmax_backward_data`), each weight gradient written straight into one flat
  gradient buffer;
* all weights live in one flat fp32 master buffer that the model's own parameters become views of
  (decayed matrices first, then undecayed vectors: AdamW's two groups are two slices of it), and,
  with bf16, one bfloat16 copy the step computes with (mixed precision with master weights: the
  update is made in fp32, the products run on the CPU's bf16 units, refreshing the copy is one
  `copy_`);
* gradient clipping is one norm over the flat gradient and AdamW one fused kernel per group.

Attention is written as `baddbmm` with an additive causal mask, softmax and `bmm` (the score
scale rides on `baddbmm`'s alpha, forward and backward): the math kernel of
`scaled_dot_product_attention` upcasts bf16 and checks for fully masked rows on every call.

It covers the models the benchmark and the Train tab use (pre-norm or no norm, learned / sinusoidal
/ no positions, GELU or ReLU, causal mask, no dropout, biases and weight tying either way);
`unsupported()` says why any other model is left to autograd. In float64 the loss and every
gradient equal autograd's on the same weights (tests/engine/test_fastpath.py), so the hand-written
backward is the model's own.

A named exception to "attention in one place" (issue 38): everywhere else attention is written out
once, in model/attention.py, but this step is a separate algorithm on purpose. Its backward needs the
forward's intermediates in its own layout ((B*H, T, hd) for `bmm`, the weights kept for the softmax
backward) and its mask as an additive bias, so it cannot call `attend`. It stays correct by refusing:
`unsupported()` lists every ModelConfig field, the values it handles and those it handles at their
default only, so any option it does not write out (rotary, parallel residual, local windows, grouped
K/V, RMSNorm, unscaled scores, per-part biases, and whatever the config gains later) sends the model
to autograd, which runs the engine's own forward.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F

from .config import ModelConfig
from .transformer import DecoderLM


# Every ModelConfig field, by what the hand-written step does with it. A field in neither list is held to its
# default (read from ModelConfig itself), so an option added to the config later, left at its default, changes
# nothing here, and set otherwise is refused by name until this file writes it out.
ANY_VALUE = (  # sizes, and parts that are present or absent as the weights say (a bias, the output projection)
    "vocab_size", "block_size", "n_layers", "n_heads", "d_model", "d_ff", "bias", "head_bias", "tie_weights",
    "attn_out_proj", "pe_base", "init", "vocab_used")
ONLY = {  # field: (the values it handles, in words), in the order the refusals are checked
    "norm": (("pre", "none"), "pre-norm and no norm"),
    "pos_encoding": (("learned", "sinusoidal", "none"), "learned, sinusoidal and none"),
    "activation": (("gelu", "relu"), "gelu and relu"),
    "mask": (("causal",), "the causal mask"),
    "dropout": ((0.0,), "no dropout"),
}
WORDS = {"rope": "rotary positions"}  # a refused value said in words; any other is said as name=value


def unsupported(model: DecoderLM) -> str | None:
    """Why `ManualStep` cannot train this model (None when it can): the first config field whose value it
    does not write out (see ANY_VALUE and ONLY; every other field must keep its default)."""
    cfg = model.cfg
    # the fields with a short list of handled values first, so the refusal names the likely cause
    for name, (handled, words) in ONLY.items():
        value = getattr(cfg, name)
        if value not in handled:
            return f"{WORDS.get(value, f'{name}={value!r}')} (it handles {words})"
    for field in dataclasses.fields(ModelConfig):
        if field.name in ANY_VALUE or field.name in ONLY:
            continue
        value = getattr(cfg, field.name)
        if value != field.default:  # the options of imported families (model/families), among others
            return f"{field.name}={value!r} (it handles the default, {field.default!r})"
    if not hasattr(torch, "_fused_adamw_"):  # a private op: FlatAdamW cannot run without it
        return "this torch build, which has no fused AdamW kernel"
    return None


class FlatAdamW:
    """AdamW over slices of a flat weight buffer, each with its gradient slice and weight decay.

    It calls the fused kernel that `torch.optim.AdamW(fused=True)` runs (`torch._fused_adamw_`) with the same
    arguments, so the update is the same bit for bit (tests/engine/test_fastpath.py), minus torch.optim's per-step
    bookkeeping and, above all, minus the import of torch's compiler stack that the first use of any
    torch.optim optimizer triggers (`torch._dynamo`: about a second on a 2-vCPU box, paid by every run and by the
    app's first training). `param_groups` holds one dict per slice whose "lr" the caller sets before each step, as
    with torch.optim.
    """

    def __init__(self, slices: list[tuple[torch.Tensor, torch.Tensor, float]], lr: float,
                 betas: tuple[float, float], eps: float = 1e-8) -> None:
        self._tensors = [(w, g) for w, g, _ in slices]  # the decay lives in param_groups only
        self._betas, self._eps = betas, eps
        self.param_groups = [{"lr": lr, "weight_decay": decay} for _, _, decay in slices]
        # as torch.optim initialises a fused AdamW: a float32 step count and zeroed moments per parameter
        self._state = [(torch.zeros((), dtype=torch.float32, device=w.device), torch.zeros_like(w), torch.zeros_like(w))
                       for w, _, _ in slices]

    def step(self) -> None:
        beta1, beta2 = self._betas
        for (w, g), (count, exp_avg, exp_avg_sq), group in zip(self._tensors, self._state, self.param_groups):
            count.add_(1)  # the kernel reads the step count for its bias correction, so it is counted first
            torch._fused_adamw_([w], [g], [exp_avg], [exp_avg_sq], [], [count], lr=group["lr"], beta1=beta1,
                                beta2=beta2, weight_decay=group["weight_decay"], eps=self._eps, amsgrad=False,
                                maximize=False, grad_scale=None, found_inf=None)


class ManualStep:
    """Forward, hand-written backward, gradient clipping and AdamW for one model, on flat buffers.

    After construction the model's parameters are views of the fp32 master buffer (the model keeps
    working as before: evaluation, checkpoints and films read the same weights) until `release()`;
    `optimizer` is the AdamW over its two slices, whose param_groups' "lr" the caller sets each step
    as usual.
    """

    def __init__(self, model: DecoderLM, lr: float, weight_decay: float, betas: tuple[float, float],
                 bf16: bool = False) -> None:
        why = unsupported(model)
        if why is not None:
            raise ValueError(f"the hand-written training step does not handle {why}")
        self.model = model
        self.cfg = model.cfg
        # the dtype the products run in; the master weights keep the model's own (fp32, or fp64 in the tests)
        self.dtype = torch.bfloat16 if bf16 else model.tok_emb.weight.dtype
        device = model.tok_emb.weight.device
        # decayed matrices first, then undecayed vectors (AdamW's two groups), each a slice of the same buffers
        named = sorted(model.named_parameters(), key=lambda item: item[1].dim() < 2)  # tied weights appear once
        n_decay = sum(p.numel() for _, p in named if p.dim() >= 2)
        n = sum(p.numel() for _, p in named)
        master = torch.empty(n, dtype=model.tok_emb.weight.dtype, device=device)
        # without bf16 there is no low-precision copy: the step computes with the master weights themselves
        self._low = None if self.dtype == master.dtype else torch.empty(n, dtype=self.dtype, device=device)
        self._grad = torch.zeros(n, dtype=self.dtype, device=device)  # the backward writes here
        # AdamW updates fp32 masters from an fp32 gradient, so a bf16 gradient is widened into this first
        self._grad32 = None if self.dtype == master.dtype else torch.empty(n, dtype=master.dtype, device=device)
        self.compute: dict[str, torch.Tensor] = {}  # parameter name -> the weight the step computes with
        self.grad: dict[str, torch.Tensor] = {}  # parameter name -> its slice of the gradient buffer
        offset = 0
        for name, p in named:
            k = p.numel()
            master[offset:offset + k].copy_(p.detach().reshape(-1))
            p.data = master[offset:offset + k].view_as(p)  # the module's parameter is now a view
            self.compute[name] = p.data if self._low is None else self._low[offset:offset + k].view_as(p)
            self.grad[name] = self._grad[offset:offset + k].view_as(p)
            offset += k
        if self._low is not None:  # the bf16 copy starts equal to the masters (rounded)
            self._low.copy_(master)
        self._master = master
        optimizer_grad = self._grad if self._grad32 is None else self._grad32
        # AdamW's two groups: decayed matrices, then undecayed vectors, each a slice of the master buffer
        self.optimizer = FlatAdamW([(master[lo:hi], optimizer_grad[lo:hi], decay)
                                    # an empty group (a model without vectors, say) gets no slice at all
                                    for lo, hi, decay in ((0, n_decay, weight_decay), (n_decay, n, 0.0)) if hi > lo],
                                   lr=lr, betas=betas)
        T = self.cfg.block_size
        # the causal mask as an additive (T, T) term, 0 on and below the diagonal and -inf above, which baddbmm
        # adds to the scores; made once for block_size, each batch uses its top-left (T, T) corner
        self._mask = torch.full((T, T), float("-inf"), device=device).triu(1).to(self.dtype)
        self._pe = model.pe_table.to(self.dtype) if self.cfg.pos_encoding == "sinusoidal" else None
        # each LayerNorm's epsilon, read off the module since the flat step calls the norm kernel directly
        self._eps = {name: m.eps for name, m in model.named_modules() if isinstance(m, torch.nn.LayerNorm)}
        self._head = "tok_emb.weight" if self.cfg.tie_weights else "head.weight"  # the output matrix (V, C)

    # ------------------------------------------------------------------ the step
    def step(self, x: torch.Tensor, y: torch.Tensor, grad_clip: float | None) -> torch.Tensor:
        """One training step on batch (x, y); returns the batch's loss (a 0-d fp32 tensor)."""
        loss = self.forward_backward(x, y)
        grad = self._grad if self._grad32 is None else self._grad32.copy_(self._grad)  # fp32 for fp32 masters
        if grad_clip:
            # as torch.nn.utils.clip_grad_norm_, except that a coefficient of 1 skips the multiplication (on the
            # CPU reading the norm costs nothing; the model trains the same). The norm is one dot product: on the
            # CPU four times faster than vector_norm over 0.8 M weights, and closer to the float64 norm.
            coef = grad_clip / (math.sqrt(float(torch.dot(grad, grad))) + 1e-6)
            if coef < 1.0:
                grad.mul_(coef)
        self.optimizer.step()
        if self._low is not None:  # the next step's products must see the updated weights, rounded to bf16
            self._low.copy_(self._master)
        return loss

    def release(self) -> None:
        """Give every parameter of the model its own storage again (the flat buffers are left behind)."""
        # a clone copies each view out, so the model no longer keeps the whole flat buffer alive
        for p in self.model.parameters():
            p.data = p.data.clone()

    @torch.no_grad()
    def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The mean cross-entropy of (x, y) (targets -100 ignored), its gradients left in self.grad."""
        cfg, W, G = self.cfg, self.compute, self.grad
        B, T = x.shape
        C, H = cfg.d_model, cfg.n_heads
        hd = C // H  # head_dim
        N = B * T  # the step works on (N, C) matrices: every token of every sequence is one row
        scale = 1.0 / math.sqrt(hd)
        mask = self._mask[:T, :T]
        norm = cfg.norm == "pre"  # else norm="none": the norms are the identity and keep no statistics

        def linear(inp, name):  # (N, in) -> (N, out); a layer built without bias has no ".bias" entry
            out = inp @ W[name + ".weight"].t()
            return out.add_(W[name + ".bias"]) if name + ".bias" in W else out

        def residual(h, inp, name):  # h + linear(inp): the addition rides on the matrix product
            out = torch.addmm(h, inp, W[name + ".weight"].t())
            return out.add_(W[name + ".bias"]) if name + ".bias" in W else out

        def layer_norm(inp, name):
            """(output, mean, 1/std): the two statistics are what the backward kernel needs again."""
            if not norm:
                return inp, None, None
            return torch.native_layer_norm(inp, (C,), W[name + ".weight"], W.get(name + ".bias"), self._eps[name])

        # ---------------------------------------------------------------- forward
        h = W["tok_emb.weight"][x.reshape(-1)]  # (N, C): the residual stream, one row per token
        # positions are added per sequence, (B, T, C) + (T, C); "none" adds nothing
        if cfg.pos_encoding == "learned":
            h = (h.view(B, T, C) + W["pos_emb.weight"][:T]).view(N, C)
        elif cfg.pos_encoding == "sinusoidal":
            h = (h.view(B, T, C) + self._pe[:T]).view(N, C)
        saved = []  # per block, the forward's intermediates the backward reads
        for i, block in enumerate(self.model.blocks):
            p = f"blocks.{i}."
            a1, m1, r1 = layer_norm(h, p + "norm1")
            # one copy puts q, k and v head-major: (3, B*H, T, hd)
            q, k, v = linear(a1, p + "attn.qkv").view(B, T, 3, H, hd).permute(2, 0, 3, 1, 4).reshape(3, B * H, T, hd)
            w = torch.softmax(torch.baddbmm(mask, q, k.transpose(1, 2), alpha=scale), dim=-1)  # (BH, T, T)
            # (BH, T, hd) -> (B, T, H, hd) -> (N, C): the heads side by side again, as the projection expects
            o = torch.bmm(w, v).view(B, H, T, hd).transpose(1, 2).reshape(N, C)
            # attn_out_proj=False: the heads' outputs are added to the residual as they are
            h_in, h = h, residual(h, o, p + "attn.proj") if block.attn.proj is not None else h + o
            s = dict(h_in=h_in, a1=a1, m1=m1, r1=r1, q=q, k=k, v=v, w=w, o=o, h_mid=h)
            if block.ffn is not None:  # d_ff=0 builds blocks without an MLP
                a2, m2, r2 = layer_norm(h, p + "norm2")
                u = linear(a2, p + "ffn.up")  # (N, d_ff); kept, since the GELU backward reads its input
                g = F.gelu(u) if cfg.activation == "gelu" else torch.relu(u)
                h = residual(h, g, p + "ffn.down")
                s.update(a2=a2, m2=m2, r2=r2, u=u, g=g)
            saved.append(s)
        af, mf, rf = layer_norm(h, "norm_f") if norm else (h, None, None)
        logits = af @ W[self._head].t()  # (N, V)
        if "head.bias" in W:
            logits = logits.add_(W["head.bias"])
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # the loss in fp32 at least
        logp = torch.log_softmax(logits, dim=-1)
        target = y.reshape(-1)
        loss = F.nll_loss(logp, target, ignore_index=-100)

        # ---------------------------------------------------------------- backward
        # d(mean CE)/d logits = (softmax - onehot) / count on the counted rows, 0 on ignored ones (-100: the
        # prompts of the task corpora)
        valid = target != -100
        dlogits = logp.exp_()  # softmax, in place: logp is not needed again
        # -1 at each row's target; an ignored row's -100 is clamped to 0 only to stay in range, and the row is
        # zeroed by the next line anyway
        dlogits.scatter_add_(1, target.clamp(min=0).unsqueeze(1), dlogits.new_full((N, 1), -1.0))
        dlogits.mul_((valid.to(dlogits.dtype) / valid.sum().clamp(min=1)).unsqueeze(1))
        dlogits = dlogits.to(self.dtype)

        # tied: the head's gradient is the embedding's first part (its rows' lookups are added at the end)
        torch.mm(dlogits.t(), af, out=G[self._head])
        if "head.bias" in G:
            torch.sum(dlogits, 0, out=G["head.bias"])
        dh = dlogits @ W[self._head]  # (N, C): the gradient of the residual stream, carried down the blocks
        if norm:
            dh = self._norm_backward(dh, h, mf, rf, "norm_f")

        for i in reversed(range(len(saved))):
            s, p, block = saved[i], f"blocks.{i}.", self.model.blocks[i]
            # the residual's gradient flows straight through each addition, so each branch's gradient is
            # added to dh in place, after the branch has read it
            if block.ffn is not None:
                self._weight_grads(dh, s["g"], p + "ffn.down")
                dg = dh @ W[p + "ffn.down.weight"]
                # the GELU backward needs the exact form the forward used (F.gelu's default, the erf one);
                # ReLU's gradient passes where its output is positive
                du = (torch.ops.aten.gelu_backward(dg, s["u"]) if cfg.activation == "gelu"
                      else torch.ops.aten.threshold_backward(dg, s["g"], 0))
                self._weight_grads(du, s["a2"], p + "ffn.up")
                da2 = du @ W[p + "ffn.up.weight"]
                dh.add_(self._norm_backward(da2, s["h_mid"], s["m2"], s["r2"], p + "norm2") if norm else da2)
            # attention: dh is the gradient of the residual after it, which is also att's gradient
            if block.attn.proj is not None:
                self._weight_grads(dh, s["o"], p + "attn.proj")
                do = dh @ W[p + "attn.proj.weight"]
            else:
                do = dh
            do = do.view(B, T, H, hd).transpose(1, 2).reshape(B * H, T, hd)  # (N, C) -> (BH, T, hd), as o was
            # dQ, dK, dV written into one (3, BH, T, hd) buffer, laid back as (N, 3C) for the fused qkv weight
            dqkv = torch.empty(3, B * H, T, hd, dtype=self.dtype, device=x.device)
            torch.bmm(s["w"].transpose(1, 2), do, out=dqkv[2])  # dV = Wᵀ dO
            # dW = dO Vᵀ, times the score scale: the softmax backward is linear in dW, so dS comes out scaled
            # and dQ = dS K, dK = dSᵀ Q need no scaling of their own
            dw = torch.baddbmm(torch.empty_like(s["w"]), do, s["v"].transpose(1, 2), beta=0, alpha=scale)
            ds = torch._softmax_backward_data(dw, s["w"], -1, s["w"].dtype)
            torch.bmm(ds, s["k"], out=dqkv[0])
            torch.bmm(ds.transpose(1, 2), s["q"], out=dqkv[1])
            dqkv = dqkv.view(3, B, H, T, hd).permute(1, 3, 0, 2, 4).reshape(N, 3 * C)
            self._weight_grads(dqkv, s["a1"], p + "attn.qkv")
            da1 = dqkv @ W[p + "attn.qkv.weight"]
            dh.add_(self._norm_backward(da1, s["h_in"], s["m1"], s["r1"], p + "norm1") if norm else da1)

        # sinusoidal and "none" positions have no weights, so only learned ones get a gradient
        if cfg.pos_encoding == "learned":
            torch.sum(dh.view(B, T, C), 0, out=G["pos_emb.weight"][:T])  # a position's rows summed over the batch
            if T < cfg.block_size:  # positions this batch never reached: a zero gradient, not last step's
                G["pos_emb.weight"][T:].zero_()
        emb = G["tok_emb.weight"]
        # tied, the buffer already holds the head's gradient and the lookups add to it; untied, it starts at 0
        if not cfg.tie_weights:
            emb.zero_()
        emb.index_add_(0, x.reshape(-1), dh)  # a token id seen several times collects every occurrence's row
        return loss.detach()

    # ------------------------------------------------------------------ helpers
    def _weight_grads(self, dout: torch.Tensor, inp: torch.Tensor, name: str) -> None:
        """dW = doutᵀ inp and db = sum(dout) of linear `name`, written into the gradient buffer."""
        torch.mm(dout.t(), inp, out=self.grad[name + ".weight"])  # (out, N) @ (N, in): summed over tokens
        if name + ".bias" in self.grad:
            torch.sum(dout, 0, out=self.grad[name + ".bias"])

    def _norm_backward(self, dout, inp, mean, rstd, name) -> torch.Tensor:
        """The LayerNorm's input gradient (returned); its weight and bias gradients go into the buffer."""
        W, G = self.compute, self.grad
        has_bias = name + ".bias" in W
        dx, dw, db = torch.ops.aten.native_layer_norm_backward(
            dout, inp, (self.cfg.d_model,), mean, rstd, W[name + ".weight"], W.get(name + ".bias"),
            (True, True, has_bias))
        G[name + ".weight"].copy_(dw)
        if has_bias:
            G[name + ".bias"].copy_(db)
        return dx
