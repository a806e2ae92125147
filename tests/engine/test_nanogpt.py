"""nanoGPT checkpoints: exact against transformers' GPT2LMHeadModel, and every hostile file refused.

A nanoGPT ckpt.pt is built here the way nanoGPT's train.py writes one: the weights of a random
GPT2LMHeadModel (exact GELU, as nanoGPT's nn.GELU) under nanoGPT's names and nn.Linear layout,
model_args, an Adam-like optimizer state, iter_num, best_val_loss and the run's config, saved with
torch.save; meta.pkl as nanoGPT's prepare.py writes it. Opening one starts a child process.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

from model.generate import Decoder, Sampling, generate
from model.nanogpt import UNK_LOGIT, char_vocabulary, check_model_args, load_nanogpt, read_meta
from model.safe_unpickle import MAX_TORCH_FILE_BYTES, load_plain_pickle, load_torch_weights
from tests.support.nanogpt_runs import CHARS, _System, nanogpt_dict, reference, save_run

PROMPTS = ["the cat sat", "to be, or not", "a"]


@pytest.mark.parametrize("bias,prefix", [(True, ""), (False, "_orig_mod.")])
def test_char_run_matches_gpt2_reference(tmp_path, bias, prefix):
    ref = reference(len(CHARS), bias)
    run = load_nanogpt(save_run(tmp_path, ref, bias, prefix))
    model, tok = run.model, run.tokenizer
    assert run.meta["dataset"] == "shakespeare_char" and run.meta["iter_num"] == 250
    stoi = {ch: i for i, ch in enumerate(CHARS)}
    for prompt in PROMPTS:
        theirs = [stoi[c] for c in prompt]
        ours = tok.encode(prompt)
        assert ours == [i + 1 for i in theirs]  # CharTokenizer keeps id 0 for <unk>
        assert tok.decode(ours) == prompt
        with torch.no_grad():
            want = ref(torch.tensor([theirs]), output_attentions=True)
            got = model(torch.tensor([ours]), return_attention=True)
        assert torch.allclose(got.logits[..., 1:], want.logits, atol=1e-5, rtol=0)
        assert torch.all(got.logits[..., 0] == UNK_LOGIT)
        assert torch.softmax(got.logits[0, -1], -1)[0] == 0  # <unk> is never drawn
        probs = torch.softmax(want.logits[0, -1], -1)
        assert probs.max() > 4 / len(CHARS)  # far from uniform: the comparison has something to compare
        assert len(got.attentions) == len(want.attentions) == 2
        for a, b in zip(got.attentions, want.attentions):
            assert torch.allclose(a, b, atol=1e-6, rtol=0)
        # greedy continuation, through the app's one generation loop (cached), equals the reference's argmax
        decoder = Decoder(model, ours, Sampling(temperature=0.0), capture_attention=True)
        steps = list(generate(decoder, 8))
        ids = list(theirs)
        for step in steps:
            with torch.no_grad():
                logits = ref(torch.tensor([ids])).logits[0, -1]
            nxt = int(logits.argmax())
            assert step.token_id == nxt + 1
            # the cached step sums in another order than the full forward: a few float32 ulps apart
            assert abs(float(step.probs[step.token_id]) - float(torch.softmax(logits, -1)[nxt])) < 5e-6
            ids.append(nxt)


def test_gpt2_token_run_with_padded_vocabulary(tmp_path, monkeypatch):
    """A run on GPT-2's tokens (no meta.pkl): nanoGPT pads the vocabulary to 50304 rows. The
    tokenizer.json comes from --tokenizer (here a byte-level BPE of 300 tokens trained on the spot);
    rows past the tokenizer are computed exactly and never sampled."""
    import huggingface_hub.constants

    from tests.support.families import hf_tokenizer, write_tokenizer

    ref = reference(50304, block=64)
    path = save_run(tmp_path / "run", ref, chars=None)
    write_tokenizer(tmp_path / "tok", 300)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(ValueError, match="give its tokenizer.json with --tokenizer"):
        load_nanogpt(path)  # not in the (empty) local cache, and nothing is downloaded
    run = load_nanogpt(path, tokenizer=tmp_path / "tok" / "tokenizer.json")
    theirs_tok = hf_tokenizer(tmp_path / "tok")
    for prompt in ("Once upon a time", " the fox met a bear"):
        ids = run.tokenizer.encode(prompt)
        assert ids == theirs_tok(prompt)["input_ids"]
        with torch.no_grad():
            want = ref(torch.tensor([ids]), output_attentions=True)
            got = run.model(torch.tensor([ids]), return_attention=True)
        assert torch.allclose(got.logits, want.logits, atol=1e-5, rtol=0)
        for a, b in zip(got.attentions, want.attentions):
            assert torch.allclose(a, b, atol=1e-6, rtol=0)
        steps = list(generate(Decoder(run.model, ids, Sampling(temperature=0.0)), 5))
        context = list(ids)
        for step in steps:
            with torch.no_grad():
                logits = ref(torch.tensor([context])).logits[0, -1]
            assert step.token_id == int(logits[:300].argmax())  # padded rows are never drawn
            assert step.probs[300:].sum() == 0
            context.append(step.token_id)


def test_compiled_plain_and_legacy_files_give_the_same_model(tmp_path):
    ref = reference(len(CHARS))
    a = load_nanogpt(save_run(tmp_path / "plain", ref)).model
    b = load_nanogpt(save_run(tmp_path / "compiled", ref, prefix="_orig_mod.")).model
    legacy = save_run(tmp_path / "legacy", ref)  # torch.save's older, non-zip format (read without mmap)
    torch.save(torch.load(legacy, weights_only=True), legacy, _use_new_zipfile_serialization=False)
    c = load_nanogpt(legacy).model
    for (ka, va), (kb, vb), (kc, vc) in zip(a.state_dict().items(), b.state_dict().items(), c.state_dict().items()):
        assert ka == kb == kc and torch.equal(va, vb) and torch.equal(va, vc)


def test_meta_pickle_read_as_plain_values(tmp_path):
    path = tmp_path / "meta.pkl"
    path.write_bytes(pickle.dumps({"vocab_size": 3, "itos": {0: "a", 1: "\n", 2: "b"},
                                   "stoi": {"a": 0, "\n": 1, "b": 2}}))
    tok = read_meta(path)
    assert tok.vocab == ["<unk>", "a", "\n", "b"]
    assert tok.encode("ba\n") == [3, 1, 2]


class _Touch:
    """A pickle payload that would create `path` when unpickled (by calling open)."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_meta_pickle_that_imports_anything_is_refused(tmp_path):
    marker = tmp_path / "created"
    from collections import OrderedDict

    hostile = [
        pickle.dumps({"vocab_size": 1, "itos": {0: _Touch(marker)}}),
        pickle.dumps(_System(marker)),
        pickle.dumps(OrderedDict(vocab_size=1)),  # even a harmless class is a class
        pickle.dumps({"vocab_size": 1, "itos": {0: frozenset("a")}}),  # a vocabulary needs no sets
        pickle.dumps({"vocab_size": 1, "itos": {0: "a"}}, protocol=0).replace(b"(dp0", b"cos\nsystem\n(dp0"),
    ]
    for data in hostile:
        with pytest.raises(ValueError, match="not loaded|not a valid pickle") as info:
            load_plain_pickle(data, "meta.pkl")
        assert "\n" not in str(info.value) and "Traceback" not in str(info.value)
    assert not marker.exists()
    for data in (b"", b"\x80\x04\x95", pickle.dumps({"a": 1})[:-3], b"not a pickle at all"):
        with pytest.raises(ValueError, match="not a valid pickle"):
            load_plain_pickle(data, "meta.pkl")
    with pytest.raises(ValueError, match="at most"):
        load_plain_pickle(b"\x80\x04" + b"N" * (5 * 1024 * 1024), "meta.pkl")


@pytest.mark.parametrize("meta,needle", [
    ([1, 2], "needs 'vocab_size' and 'itos'"),
    ({"vocab_size": 2, "itos": {0: "a"}}, "every id from 0 to 1"),
    ({"vocab_size": 2, "itos": {0: "a", 1: "bc"}}, "id 1 is not a single character"),
    ({"vocab_size": 2, "itos": {0: "a", 1: "a"}}, "duplicate"),
    ({"vocab_size": 2, "itos": {0: "a", 1: "b"}, "stoi": {"a": 1, "b": 0}}, "does not invert"),
    ({"vocab_size": True, "itos": {}}, "vocab_size must be"),
])
def test_meta_with_a_wrong_structure_is_one_sentence(meta, needle):
    with pytest.raises(ValueError, match=needle):
        char_vocabulary(meta)


def test_malicious_checkpoint_runs_nothing(tmp_path):
    marker = tmp_path / "created"
    torch.save({"model": _System(marker), "model_args": {}}, tmp_path / "zip.pt")
    (tmp_path / "legacy.pt").write_bytes(pickle.dumps({"model": _Touch(marker)}, protocol=2))
    for name, what in (("zip.pt", "posix.system"), ("legacy.pt", "open")):
        with pytest.raises(ValueError, match=r"refused and nothing in it was run") as info:
            load_nanogpt(tmp_path / name, meta=None)
        assert what in str(info.value)
    assert not marker.exists()


def test_meta_is_refused_before_the_checkpoint_is_opened(tmp_path):
    marker = tmp_path / "created"
    path = save_run(tmp_path, reference(len(CHARS)))
    (tmp_path / "meta.pkl").write_bytes(pickle.dumps(_System(marker)))
    with pytest.raises(ValueError, match="meta.pkl holds more than plain dicts, strings and numbers "
                                         r"\(pickle opcode STACK_GLOBAL"):
        load_nanogpt(path)
    assert not marker.exists()


def test_truncated_and_huge_files(tmp_path):
    path = save_run(tmp_path, reference(len(CHARS)))
    data = path.read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])  # no zip directory left: refused before the child
    with pytest.raises(ValueError, match="cut.pt is a zip archive whose directory cannot be read"):
        load_nanogpt(tmp_path / "cut.pt", meta=tmp_path / "meta.pkl")
    (tmp_path / "junk.pt").write_bytes(b"neither a zip nor a pickle " * 100)  # not a zip: the child's answer
    with pytest.raises(ValueError, match="junk.pt: not a PyTorch checkpoint that can be read"):
        load_nanogpt(tmp_path / "junk.pt", meta=tmp_path / "meta.pkl")
    huge = tmp_path / "huge.pt"
    with huge.open("wb") as f:
        f.truncate(MAX_TORCH_FILE_BYTES + 1)  # sparse: the size is checked before a byte is read
    with pytest.raises(ValueError, match="huge.pt is 8,589,934,593 bytes; the limit is 8,589,934,592"):
        load_nanogpt(huge, meta=tmp_path / "meta.pkl")


def test_memory_cap_stops_the_reader(tmp_path):
    """The child's address space may grow by 3 × the file + a margin: with no margin left the
    same file is refused with a sentence instead of being read."""
    path = save_run(tmp_path, reference(len(CHARS)))
    size = path.stat().st_size
    with pytest.raises(ValueError, match="needed more memory than the reader's cap"):
        load_torch_weights(path, tmp_path, margin_bytes=-3 * size)
    assert not (tmp_path / "tensors.safetensors").exists()


def test_wrong_shapes_missing_tensors_and_nan(tmp_path):
    ref = reference(len(CHARS))
    sd = nanogpt_dict(ref)
    cases = {
        "shape": ({**sd, "transformer.h.1.mlp.c_fc.weight": torch.zeros(64, 8)},
                  r"tensor transformer.h.1.mlp.c_fc.weight has shape \[64, 8\], but model_args say \[64, 16\]"),
        "missing": ({k: v for k, v in sd.items() if k != "transformer.ln_f.weight"},
                    r"missing \['transformer.ln_f.weight'\]"),
        "nan": ({**sd, "transformer.wpe.weight": torch.full((32, 16), float("nan"))},
                "transformer.wpe.weight contains NaN"),
    }
    for name, (state, needle) in cases.items():
        path = save_run(tmp_path / name, ref, model=state)
        with pytest.raises(ValueError, match=needle):
            load_nanogpt(path)
    path = save_run(tmp_path / "vocab", ref, chars=CHARS[:-1])
    with pytest.raises(ValueError, match="meta.pkl has 34 characters but the model has 35 vocabulary rows"):
        load_nanogpt(path)
    path = save_run(tmp_path / "nometa", ref, chars=None)
    with pytest.raises(ValueError, match="vocabulary of 35 tokens, not GPT-2's: give its meta.pkl with --meta"):
        load_nanogpt(path)


@pytest.mark.parametrize("args,needle", [
    (None, "no 'model_args'"),
    ({"n_layer": 2, "n_head": 4, "n_embd": 16, "block_size": 32}, r"model_args\['vocab_size'\]"),
    ({"n_layer": 2, "n_head": 3, "n_embd": 16, "block_size": 32, "vocab_size": 5}, "not divisible"),
    ({"n_layer": 2, "n_head": 4, "n_embd": 16, "block_size": 32, "vocab_size": 5, "bias": "yes"}, "true or false"),
])
def test_model_args_checked(args, needle):
    with pytest.raises(ValueError, match=needle):
        check_model_args(args)


def test_a_plain_pickle_with_a_far_memo_index_is_refused_before_it_is_read():
    """LONG_BINPUT 2**31 - 1 would make the unpickler allocate a memo of billions of entries; a pickler
    numbers its memo in order, so an index past the opcodes read so far is refused by the scan."""
    far = b"\x80\x02}r\xff\xff\xff\x7f."  # PROTO 2, EMPTY_DICT, LONG_BINPUT 2147483647, STOP
    with pytest.raises(ValueError, match="memo index 2147483647"):
        load_plain_pickle(far, "meta.pkl")
    assert load_plain_pickle(pickle.dumps({"vocab": ["a", "b"] * 40, "n": 2}, protocol=2)) == \
        {"vocab": ["a", "b"] * 40, "n": 2}
