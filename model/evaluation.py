"""Quality measures for the task corpora, used by tests and recorded next to shipped checkpoints."""

from __future__ import annotations

import torch

from .tokenizers import Tokenizer
from .transformer import DecoderLM


@torch.inference_mode()
def greedy_complete(model: DecoderLM, tokenizer: Tokenizer, prompts: list[str], n_new: int) -> list[str]:
    """Greedy continuation of equal-length prompts, decoded, in one batch."""
    ids = torch.tensor([tokenizer.encode(p) for p in prompts])
    for _ in range(n_new):
        logits = model(ids[:, -model.cfg.block_size :]).logits[:, -1]
        ids = torch.cat((ids, logits.argmax(-1, keepdim=True)), dim=1)
    return [tokenizer.decode(row[-n_new:].tolist()) for row in ids]


def task_accuracy(model: DecoderLM, tokenizer: Tokenizer, examples: list[str], sep: str) -> dict[str, float]:
    """For 'prompt<sep>answer' examples: share of exactly right answers and of right answer tokens."""
    prompts = [e[: e.index(sep) + 1] for e in examples]
    answers = [e[e.index(sep) + 1 :] for e in examples]
    got = greedy_complete(model, tokenizer, prompts, len(answers[0]))
    exact = sum(g == a for g, a in zip(got, answers)) / len(examples)
    tokens = sum(x == y for g, a in zip(got, answers) for x, y in zip(g, a)) / sum(len(a) for a in answers)
    return {"exact": exact, "token": tokens, "n": len(examples)}


def held_out_examples(corpus, n: int = 200) -> list[str]:
    """The first n held-out examples of a task corpus, as text (input row plus its last target)."""
    tok = corpus.tokenizer
    return [tok.decode(x.tolist()) + tok.decode([int(y[-1])]) for x, y in zip(corpus.val.x[:n], corpus.val.y[:n])]


@torch.inference_mode()
def stream_loss(model: DecoderLM, split, block_size: int | None = None, batch_size: int = 64) -> float:
    """Mean next-token cross-entropy over a whole token stream, every target counted once.

    The stream is cut into back-to-back windows of `block_size` tokens (default: the model's
    context); each window predicts its next `block_size` tokens, so position t of a window sees
    t earlier tokens, the same spread of context lengths as random training windows. Unlike
    a loss over a few random batches, the result is exact and does not depend on a seed.
    """
    ids = split.x
    if ids.dim() != 1:
        raise ValueError("stream_loss needs a 1-D token stream")
    t = min(block_size or model.cfg.block_size, model.cfg.block_size)
    n = (len(ids) - 1) // t
    if n < 1:
        raise ValueError("the stream is shorter than one window")
    x = ids[: n * t].view(n, t)
    y = ids[1 : n * t + 1].view(n, t)
    was_training = model.training
    model.eval()
    device = model.tok_emb.weight.device
    total = 0.0
    for i in range(0, n, batch_size):
        logits = model(x[i : i + batch_size].to(device)).logits.float()
        total += torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.size(-1)), y[i : i + batch_size].reshape(-1).to(device), reduction="sum"
        ).item()
    model.train(was_training)
    return total / (n * t)
