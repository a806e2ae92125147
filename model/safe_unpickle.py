"""Reading pickles that someone else wrote: nanoGPT's meta.pkl and ckpt.pt.

A pickle is a small program: unpickling it may import any class and call any function, so a
file a person was sent can run code the moment it is opened. Two readers, two defences:

* `load_plain_pickle(data)` reads a pickle that may hold only dicts, lists, tuples, strings,
  numbers, booleans and None (nanoGPT's meta.pkl: {'vocab_size', 'itos', 'stoi'}).
  Every opcode is checked before anything is loaded (pickletools reads without running), and
  the unpickler that then loads it refuses every class and function by name as well.
* `load_torch_weights(path, out_dir)` reads a `torch.save` file (nanoGPT's ckpt.pt, which also
  holds the optimizer state; with layout="state_dict", a file whose top level is itself the weights,
  as nanochat's model_<step>.pt) with `torch.load(weights_only=True)`, and only in a throw-away
  child process under a memory cap (RLIMIT_AS), a CPU-time cap and a wall-clock limit. The child
  writes the model's tensors as a safetensors file and the small plain values as JSON; the
  parent never unpickles anything and reads back only those two safe formats.

The child is this module run as `python -m model.safe_unpickle SRC OUT_DIR MEMORY_BYTES CPU_S [LAYOUT]`;
it prints one JSON line: {"ok": true} or {"error": "<one sentence>"}.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import pickletools
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from .zipcheck import check_torch_zip

# A character vocabulary of thousands of entries is tens of KB. The bound also bounds memory: the
# costliest object per opcode byte is an empty dict (2 bytes of pickle, 64 of Python), so at most ~32 MB.
MAX_PLAIN_PICKLE_BYTES = 1024 * 1024
# torch.save files are read only up to this size (a GPT-2 medium run with its Adam state is ~4.3 GB)
MAX_TORCH_FILE_BYTES = 8 * 1024**3
WORKER_TIMEOUT_S = 900.0
TOO_LARGE = "a number far too large"  # what plain.json holds in place of a whole number past 2**62
# The child may grow its address space by this much beyond what it holds after importing torch:
# the file mapped once, the model tensors copied once and written once, plus a margin.
WORKER_MARGIN_BYTES = 512 * 1024**2
LAYOUTS = ("nanogpt", "state_dict")  # a dict with the weights under 'model', or the weights themselves

# Opcodes that only build plain containers and scalars. Everything else (GLOBAL, STACK_GLOBAL,
# REDUCE, BUILD, INST, OBJ, NEWOBJ, EXT*, PERSID, buffers) imports, calls or reaches outside; sets
# and bytes are left out too, as a vocabulary needs neither.
_PLAIN_OPCODES = frozenset("""
    PROTO FRAME STOP MARK POP POP_MARK DUP NONE NEWTRUE NEWFALSE
    INT BININT BININT1 BININT2 LONG LONG1 LONG4 FLOAT BINFLOAT
    STRING BINSTRING SHORT_BINSTRING UNICODE BINUNICODE SHORT_BINUNICODE BINUNICODE8
    EMPTY_LIST APPEND APPENDS LIST EMPTY_TUPLE TUPLE TUPLE1 TUPLE2 TUPLE3
    EMPTY_DICT DICT SETITEM SETITEMS
    GET BINGET LONG_BINGET PUT BINPUT LONG_BINPUT MEMOIZE
""".split())


class _NoClasses(pickle.Unpickler):
    """An unpickler that refuses every global: no class, no function, nothing importable."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"{module}.{name}")


def load_plain_pickle(data: bytes, what: str = "the file") -> Any:
    """Unpickle `data` that may hold only plain values; anything else is a ValueError sentence."""
    if len(data) > MAX_PLAIN_PICKLE_BYTES:
        raise ValueError(f"{what} is {len(data):,} bytes; at most {MAX_PLAIN_PICKLE_BYTES:,} are read")
    refused = None
    try:
        for count, (op, arg, _) in enumerate(pickletools.genops(data)):
            if op.name in ("PUT", "BINPUT", "LONG_BINPUT") and not (isinstance(arg, int) and 0 <= arg <= count):
                # a pickler numbers its memo 0, 1, 2, ... as it goes; a far index would make the unpickler
                # allocate a memo that large (LONG_BINPUT 2**31: gigabytes) before anything is read
                refused = f"{what} stores a value under memo index {arg} (out of order), so it was not loaded"
                break
            if op.name not in _PLAIN_OPCODES:
                named = f" {arg}" if op.name in ("GLOBAL", "INST") and arg else ""
                refused = (f"{what} holds more than plain dicts, strings and numbers (pickle opcode "
                           f"{op.name}{named}, which imports, calls or builds other objects), so it was not loaded")
                break
    except Exception:  # genops raises several types on malformed input
        raise ValueError(f"{what} is not a valid pickle (truncated or another format)") from None
    if refused:
        raise ValueError(refused)
    try:
        return _NoClasses(io.BytesIO(data)).load()
    except pickle.UnpicklingError as exc:
        raise ValueError(f"{what} asks to import {exc}; it was not loaded") from None
    except Exception:  # e.g. an unhashable dict key, a stack underflow
        raise ValueError(f"{what} is not a valid pickle (truncated or another format)") from None


# ------------------------------------------------------------------------- torch.save files


def load_torch_weights(path: str | Path, out_dir: str | Path, max_bytes: int = MAX_TORCH_FILE_BYTES,
                       timeout_s: float = WORKER_TIMEOUT_S, margin_bytes: int = WORKER_MARGIN_BYTES,
                       layout: str = "nanogpt") -> None:
    """Read the torch.save file at `path` in a child process; it leaves in `out_dir`:

    * `tensors.safetensors`: the tensors of the checkpoint's 'model' entry (float32, contiguous;
      the `_orig_mod.` prefix of a torch.compile run removed; nanoGPT's causal-mask buffers
      `*.attn.bias` of 4 dimensions dropped);
    * `plain.json`: the entries 'model_args', 'config' and 'iter_num' (plain values only).

    layout "state_dict" (nanochat's model_<step>.pt): the file's top level must itself be a dict of
    names to floating-point tensors, every one of them kept (only the `_orig_mod.` prefix removed, as
    nanochat removes it); plain.json is then empty. Any other top level is refused.

    Everything else in the file (the optimizer state) is never copied. Any failure is a
    ValueError with one sentence.
    """
    path = Path(path)
    name = path.name
    try:
        size = path.stat().st_size
    except OSError:
        raise ValueError(f"cannot read {name}") from None
    if not path.is_file():
        raise ValueError(f"{name} is not a file")
    if size > max_bytes:
        raise ValueError(f"{name} is {size:,} bytes; the limit is {max_bytes:,}")
    check_torch_zip(path, name)  # no compressed entry, a directory that tells the truth (model/zipcheck.py)
    budget = 3 * size + margin_bytes
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    root = str(Path(__file__).resolve().parent.parent)  # so that the child imports this same package
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cpu_s = max(1, int(timeout_s))
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}")
    cmd = [sys.executable, "-m", "model.safe_unpickle", str(path.resolve()), str(Path(out_dir).resolve()),
           str(budget), str(cpu_s), layout]
    try:
        done = subprocess.run(cmd, capture_output=True, timeout=timeout_s, env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:  # run() has killed the child
        raise ValueError(f"reading {name} took longer than {timeout_s:g} s and was stopped") from None
    answer = _last_json_line(done.stdout)
    if done.returncode == 0 and answer.get("ok") is True:
        return
    if isinstance(answer.get("error"), str):
        raise ValueError(f"{name}: {answer['error']}")
    if done.returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        raise ValueError(f"reading {name} ran past its time or memory limit and was stopped")
    raise ValueError(f"{name} could not be read (the reader stopped with status {done.returncode})")


def _last_json_line(out: bytes) -> dict[str, Any]:
    for line in reversed(out.decode("utf-8", "replace").splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return {}


def _plain(value: Any, depth: int = 0) -> Any:
    """`value` if it is JSON-able plain data (nested at most a few levels), else None; a whole number
    past 2**62 is written as a phrase (json cannot write one of over 4,300 digits, and none is needed)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 62:
        return TOO_LARGE
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else None
    if depth < 4 and isinstance(value, (list, tuple)):
        return [_plain(v, depth + 1) for v in value[:1000]]
    if depth < 4 and isinstance(value, dict):
        return {k: _plain(v, depth + 1) for k, v in list(value.items())[:1000] if isinstance(k, str)}
    return None


# torch names what it refused as "... unsupported GLOBAL posix.system ..." or "Unsupported global: GLOBAL x.y"
_OUT_OF_MEMORY = "reading it needed more memory than the reader's cap allows, so it was stopped"
_UNSUPPORTED_GLOBAL = re.compile(r"unsupported (?:global:?\s*)?GLOBAL\s+([\w.]+)", re.IGNORECASE)


def _worker(src: str, out_dir: str, budget: int, cpu_s: int, layout: str = "nanogpt") -> dict[str, Any]:
    """The child's work: cap itself, load with weights_only, keep the model's tensors."""
    import resource

    import torch
    from safetensors.torch import save_file

    # The cap is set after torch is imported, on top of what the interpreter already holds.
    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (vm + budget, vm + budget))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 5))
    resource.setrlimit(resource.RLIMIT_FSIZE, (budget, budget))
    torch.set_num_threads(1)
    try:
        try:
            ckpt = torch.load(src, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:
            if "_use_new_zipfile_serialization" not in str(exc):
                raise
            ckpt = torch.load(src, map_location="cpu", weights_only=True)  # the legacy (non-zip) format
    except pickle.UnpicklingError as exc:
        found = _UNSUPPORTED_GLOBAL.search(str(exc))
        if not found:  # bytes that are no pickle torch reads (junk, truncated, opcodes no weights file has)
            return {"error": "not a PyTorch checkpoint that can be read (truncated, or another format); nothing "
                             "in it was run"}
        return {"error": f"its pickle asks for something a weights file never needs ({found.group(1)}); "
                         f"it was refused and nothing in it was run"}
    except Exception as exc:
        if isinstance(exc, MemoryError) or "allocate memory" in str(exc):  # torch's allocator says it so
            return {"error": _OUT_OF_MEMORY}
        return {"error": "not a PyTorch checkpoint that can be read (truncated, or another format)"}
    if layout == "state_dict":  # the top level is the weights themselves (nanochat's model_<step>.pt)
        if not isinstance(ckpt, dict) or not all(isinstance(v, torch.Tensor) for v in ckpt.values()):
            return {"error": "not a nanochat model file: its top level is not a dict of named tensors"}
        weights = ckpt
    elif not isinstance(ckpt, dict) or not isinstance(ckpt.get("model"), dict):
        return {"error": "not a nanoGPT checkpoint: it has no 'model' entry with the weights"}
    else:
        weights = ckpt["model"]
    tensors, seen = {}, set()
    for key, value in weights.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            return {"error": "its 'model' entry holds something other than named tensors"}
        key = key.removeprefix("_orig_mod.")  # a torch.compile run saves its weights under this prefix
        if layout == "nanogpt" and key.endswith(".attn.bias") and value.dim() == 4:
            continue  # nanoGPT's causal-mask buffer (without flash attention), not a weight
        if not value.is_floating_point():
            return {"error": f"tensor {key} is not floating point"}
        value = value.detach().to(torch.float32).contiguous()
        if value.numel() and value.data_ptr() in seen:
            value = value.clone()  # nanoGPT ties lm_head to wte; a safetensors file wants each tensor once
        seen.add(value.data_ptr())
        tensors[key] = value
    plain = {k: _plain(ckpt.get(k)) for k in ("model_args", "config", "iter_num")} if layout == "nanogpt" else {}
    save_file(tensors, str(Path(out_dir) / "tensors.safetensors"))
    Path(out_dir, "plain.json").write_text(json.dumps(plain))
    return {"ok": True}


def _worker_main(argv: list[str]) -> int:
    src, out_dir, budget, cpu_s = argv[0], argv[1], int(argv[2]), int(argv[3])
    layout = argv[4] if len(argv) > 4 and argv[4] in LAYOUTS else "nanogpt"
    try:
        answer = _worker(src, out_dir, budget, cpu_s, layout)
    except MemoryError:
        answer = {"error": _OUT_OF_MEMORY}
    except Exception:
        answer = {"error": "it could not be read as a PyTorch checkpoint"}
    print(json.dumps(answer), flush=True)
    return 0 if answer.get("ok") else 1


if __name__ == "__main__":
    sys.exit(_worker_main(sys.argv[1:]))
