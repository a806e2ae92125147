"""Quality measures for the task corpora, used by tests and recorded next to shipped checkpoints."""

from __future__ import annotations

import torch

from .generate import Decoder, Sampling, generate
from .tokenizers import Tokenizer
from .transformer import DecoderLM


def greedy_ids(model: DecoderLM, prompts: list[list[int]], n_new: int) -> list[list[int]]:
    """The `n_new` greedily generated token ids after each prompt.

    Through the one generation loop (`model.generate.generate`, temperature 0, no attention
    kept), so what is measured here is what the app and the CLI generate. No end token stops
    it: the caller asks for exactly the tokens it scores.
    """
    greedy = Sampling(temperature=0.0)
    out = []
    for prompt in prompts:
        decoder = Decoder(model, list(prompt), greedy, capture_attention=False)
        out.append([s.token_id for s in generate(decoder, n_new, attention="none")])
    return out


def task_accuracy(model: DecoderLM, tokenizer: Tokenizer, examples: list[str], sep: str) -> dict[str, float]:
    """For 'prompt<sep>answer' examples of one length: how well greedy decoding answers.

    `exact` is the share of exactly right answers and `token` the share of right answer
    tokens; both measure the answer only, never the end token. When the tokenizer has
    `<EOS>` (the sort and copy tasks end every example with it), one token more is generated:
    `end` is the share of examples where that token is `<EOS>` (the model stops right after
    its answer) and `exact_end` the share both exactly right and ended there.
    """
    prompts = [tokenizer.encode(e[: e.index(sep) + 1]) for e in examples]
    answers = [tokenizer.encode(e[e.index(sep) + 1 :]) for e in examples]
    n = len(answers[0])
    if any(len(a) != n for a in answers) or any(len(p) != len(prompts[0]) for p in prompts):
        raise ValueError("task_accuracy needs examples of one prompt length and one answer length")
    eos = tokenizer.eos_id
    got = greedy_ids(model, prompts, n + (eos is not None))
    right = [g[:n] == a for g, a in zip(got, answers)]
    out: dict[str, float] = {
        "exact": sum(right) / len(examples),
        "token": sum(x == y for g, a in zip(got, answers) for x, y in zip(g, a)) / (n * len(examples)),
        "n": len(examples),
    }
    if eos is not None:
        ended = [g[n] == eos for g in got]
        out["end"] = sum(ended) / len(examples)
        out["exact_end"] = sum(r and e for r, e in zip(right, ended)) / len(examples)
    return out


def held_out_examples(corpus, n: int = 200) -> list[str]:
    """The first n held-out examples of a task corpus as text ('prompt<sep>answer').

    Each is its input row plus its last target; a final `<EOS>` (which sort and copy
    examples end with) is left out, so the text is the task's own string.
    """
    tok = corpus.tokenizer
    eos = tok.eos_id
    out = []
    for x, y in zip(corpus.val.x[:n], corpus.val.y[:n]):
        ids = x.tolist() + [int(y[-1])]
        if eos is not None and ids[-1] == eos:
            ids.pop()
        out.append(tok.decode(ids))
    return out


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
