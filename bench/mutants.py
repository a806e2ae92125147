"""Planted bugs the tests must catch: a mutation check the project runs itself (issue 37).

    python -m bench.mutants              # every mutant; prints a table, writes bench/mutants.json
    python -m bench.mutants --only top_p_boundary,rate_burst_cap
    python -m bench.mutants --list       # the mutants and the tests named to catch each

Each mutant is one small change to the app's code (an exact snippet of one file and what replaces it)
and the test files that must fail because of it: the files tests/README.md names for that behaviour.
The runner copies the working tree (`git ls-files`: tracked files and new ones git does not ignore)
once into a folder beside the checkout (../.mutants-XXXX/repo), with ../shared linked beside the copy
as it is beside the checkout (tests read ../shared/data), and checks every snippet in the copy first:
a snippet that no longer occurs in its file, or occurs more than once, stops the run before anything
is tested (a refactor that moved the code makes the list fail loudly, never pass quietly). Then:

1. sanity: the unmutated copy passes every named test file, with the options its mutants use (else
   the tests, not the mutants, are the news: reported, and no mutant runs; `--skip-sanity` leaves
   it out when re-running a few mutants after a full run passed it);
2. for each mutant: apply the change, run `python -m pytest -n 0 -x -q -p no:cacheprovider FILES`
   in the copy (`-m "not slow"` unless the mutant needs the slow tests that catch it, `-k` where one
   group of a long file is the one that catches it), put the file back and record the result:
   "caught" (a test failed), "caught (error)" (only errors: a fixture the mutant broke, which the
   sanity run passed unmutated), "caught (timeout)" (the tests hung past TIMEOUT_S), "SURVIVED"
   (every test passed) or "error" (pytest stopped before testing: exit 2 to 5). The last two count
   as not caught: a mutant must be caught by tests that ran.

Bytecode is never written in the copy (PYTHONDONTWRITEBYTECODE), so a restored file is never shadowed
by the mutant's cached compile. Not part of the pytest suite: it runs the suite's files ~50 times.
Exit status: 0 when every mutant was caught, 1 when one was not, 2 when the list or the sanity check
is broken. A full run writes bench/mutants.json; `--only` runs write nothing unless `--json PATH` is
given. The copy is deleted at the end (`--keep` keeps it).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "mutants.json"
TIMEOUT_S = 1200  # one mutant's tests; a mutant that makes them hang this long is counted caught (timeout)


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str  # relative to the repository root
    old: str  # occurs exactly once in `file`
    new: str
    tests: tuple[str, ...]  # test files (relative to the root) that must fail
    why: str  # the bug, in words
    slow: bool = False  # run the named files' slow tests too (their catching tests start a server)
    k: str | None = None  # a pytest -k expression: the group of a long file that catches it
    extra: tuple[str, ...] = field(default=())  # further pytest arguments


E, L, V, U = "tests/engine/", "tests/lab/", "tests/viz/", "tests/api/"

MUTANTS: tuple[Mutant, ...] = (
    # ----------------------------------------------------------------- the engine: attention and positions
    Mutant("causal_mask", "model/attention.py", "    return k > q  # (Tq, Tk)", "    return k > q + 1  # (Tq, Tk)",
           (E + "test_model.py",), "each query also sees the next token"),
    Mutant("kv_cache_offset", "model/attention.py", "    offset = t_key - t_query",
           "    offset = 0", (E + "test_model.py",), "new queries after cached keys aligned to the top-left corner"),
    Mutant("cache_positions", "model/transformer.py", "        start = cache.length if cache is not None else 0",
           "        start = 0", (E + "test_model.py",), "positions restart at 0 after the cache"),
    Mutant("rotary_direction", "model/attention.py",
           "torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)",
           "torch.stack((x1 * cos + x2 * sin, -x1 * sin + x2 * cos), dim=-1)",
           (E + "test_model.py", E + "test_families_llama.py"), "RoPE rotates the other way"),
    Mutant("softmax_scale", "model/attention.py", "self.score_scale = 1.0 / math.sqrt(cfg.query_scale_dim or self.head_dim)",
           "self.score_scale = 1.0 / (cfg.query_scale_dim or self.head_dim)", (E + "test_model.py",), "scores divided by d, not sqrt(d)"),
    Mutant("sinusoidal_table", "model/transformer.py", "    table[:, 0::2] = torch.sin(angle)",
           "    table[:, 0::2] = torch.cos(angle)", (E + "test_model.py",), "even dimensions get cos, not sin"),
    # ----------------------------------------------------------------- the engine: sampling and decoding
    Mutant("temperature", "model/generate.py", "(logits.double() - logits.max()) / s.temperature, dim=-1)",
           "(logits.double() - logits.max()), dim=-1)", (E + "test_generate.py",), "temperature ignored"),
    Mutant("top_k", "model/generate.py", "probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))",
           "probs = torch.where(probs > kth, probs, torch.zeros_like(probs))", (E + "test_generate.py",),
           "top-k drops its k-th token"),
    Mutant("top_p_boundary", "model/generate.py", "keep_sorted = before < s.top_p * sorted_p.sum()",
           "keep_sorted = before <= s.top_p * sorted_p.sum()", (E + "test_sampling_bounds.py",),
           "top-p keeps one token too many when the mass reaches p exactly"),
    Mutant("forced_token_top_k_top_p", "model/generate.py", "and adjusted[force] > 0):",
           "and (adjusted[force] > 0 or (s.temperature > 0 and probs[force] > 0))):",
           (E + "test_sampling_bounds.py", L + "test_sessionfile_sampling.py"),
           "a replay's forced token is checked against the softmax, not top-k/top-p"),
    Mutant("padding_rows", "model/generate.py", '    out[..., vocab_used:] = float("-inf")',
           '    out[..., vocab_used + 1:] = float("-inf")', (E + "test_families_gpt2.py",),
           "the first padded row of the vocabulary can be sampled", k="padded"),
    Mutant("window_slide", "model/generate.py", "cropped = len(self.ids) - self.start > self.block_size",
           "cropped = len(self.ids) - self.start > self.block_size + 1", (E + "test_generate.py",),
           "the window does not slide when the context is full"),
    Mutant("undo_sampler_state", "model/generate.py", "        self.generator.set_state(self._rng_history.pop())",
           "        self._rng_history.pop()", (E + "test_undo_rewinds.py",), "Undo does not rewind the sampler"),
    # ----------------------------------------------------------------- the engine: head scores and tools
    Mutant("role_threshold_boundary", "model/heads.py", "if np.isnan(value) or value < thr:",
           "if np.isnan(value) or value <= thr:", (E + "test_head_role_bounds.py",),
           "a score exactly at its threshold plays no role (strongest_role)"),
    Mutant("role_heads_boundary", "model/heads.py", "np.nan_to_num(s, nan=-1.0) >= thr",
           "np.nan_to_num(s, nan=-1.0) > thr",
           (E + "test_head_role_bounds.py",), "a score exactly at its threshold plays no role (role_heads)"),
    Mutant("induction_targets", "model/heads.py", "            seen[toks[i - 2]] = i - 2",
           "            seen[toks[i - 1]] = i - 1", (E + "test_heads.py",), "an earlier copy at i−1 counts"),
    Mutant("entropy_bits", "model/heads.py", "np.log2(rows, out=logs, where=rows > 0)",
           "np.log(rows, out=logs, where=rows > 0)", (E + "test_heads.py",), "entropy in nats, not bits"),
    Mutant("ablation_zero_vs_mean", "model/interventions.py",
           "return torch.where(mask, torch.zeros((), dtype=out.dtype, device=out.device), out)",
           "return torch.where(mask, out.mean(dim=-2, keepdim=True), out)", (E + "test_interventions.py",),
           "zero ablation takes the mean"),
    Mutant("attention_edit", "model/interventions.py", "                new[h, row, key] = 1.0",
           "                new[h, row, 0] = 1.0", (E + "test_interventions.py",),
           "an edited row puts its weight on the first token, not the chosen key"),
    Mutant("uniform_ablation", "model/interventions.py",
           "uniform = allowed.to(weights.dtype) / allowed.sum(-1, keepdim=True).to(weights.dtype)",
           "uniform = allowed.to(weights.dtype) / t_key", (E + "test_interventions.py",),
           "uniform attention spread over masked keys too"),
    Mutant("logit_lens_final_norm", "model/transformer.py", "torch.stack([model.read_out(r) for r in residuals])",
           "torch.stack([model.head(r) for r in residuals])", (E + "test_interventions.py",),
           "the logit lens skips the final norm"),
    Mutant("lens_rows_final_norm", "model/transformer.py", "(model.head.weight @ model.norm_f(rows).T).T",
           "(model.head.weight @ rows.T).T", (E + "test_last_logits.py", L + "test_lens_cache.py"),
           "the lab's lens rows skip the final norm"),
    Mutant("patch_substitution", "model/patching.py", "return torch.where(self.mask, self.source.to(x.dtype), x)",
           "return torch.where(self.mask, x, self.source.to(x.dtype))", (E + "test_patching.py",),
           "a patch replaces every activation but the chosen one"),
    Mutant("patching_direction", "lab/patching.py", '(setup.ids_b, setup.ids_a) if direction == "denoising"',
           '(setup.ids_b, setup.ids_a) if direction == "noising"', (L + "test_patching_lab.py",),
           "denoising runs A with B's activations (noising's run)"),
    # ----------------------------------------------------------------- checkpoints, tokenizers, training, film
    Mutant("checkpoint_shape_check", "model/checkpoint.py", "        if info.get(\"shape\") != list(shape):",
           "        if len(info.get(\"shape\") or ()) != len(shape):", (E + "test_checkpoint.py",),
           "a tensor of the right size but the wrong shape is loaded"),
    Mutant("tokenizer_round_trip", "model/tokenizers.py", '        return "".join(self._raw(ids))',
           '        return "".join(self._raw(ids)).strip()', (E + "test_tokenizers.py",),
           "decoding drops the text's outer spaces"),
    Mutant("lr_warmup", "model/train.py", "            return self.lr * (step + 1) / self.warmup",
           "            return self.lr * step / self.warmup", (E + "test_train.py",),
           "the first step of warm-up runs at learning rate 0", k="lr or schedule or warm"),
    Mutant("lr_cosine", "model/train.py", "math.cos(math.pi * progress)) * (self.lr - low)",
           "math.cos(math.pi * progress / 2)) * (self.lr - low)", (E + "test_train.py",),
           "the cosine decay ends half way, far above min_lr", k="lr or schedule or warm"),
    Mutant("film_frame_step", "model/film.py", "        steps[k] = max(steps[k], steps[k - 1] + 1)",
           "        steps[k] = max(steps[k], steps[k - 1])", (E + "test_film.py",),
           "frames that rounding made equal stay equal", k="frame_steps"),
    # ----------------------------------------------------------------- the lab: replays
    Mutant("replay_seed", "lab/sessionfile.py", '        sampling = _sampling(action.get("sampling"), seed)',
           '        sampling = _sampling(action.get("sampling"), 0)', (L + "test_sessionfile.py",),
           "a session file's text is replayed with seed 0, not its own"),
    Mutant("replay_model_work", "lab/server/rates.py",
           "        cost += math.ceil(model.params * model.tokens(actions) / TOKEN_WORK)", "        pass",
           (L + "test_replay_cost.py",), "a replay costs its Steps only, whatever the model"),
    # ----------------------------------------------------------------- the server's limits
    Mutant("rate_burst_cap", "lab/server/rates.py",
           "tokens = min(float(rate.burst), tokens + max(0.0, now - at) * rate.per_s)",
           "tokens = tokens + max(0.0, now - at) * rate.per_s", (L + "test_rate_burst.py",),
           "an idle address saves up its refill: a day's quiet, then 1,440 calls at once"),
    Mutant("rate_wait_told", "lab/server/rates.py", "refused = (cost - tokens) / rate.per_s",
           "refused = (cost - tokens) / rate.per_s / 2", (L + "test_budget.py",),
           "a refusal names half the wait it needs"),
    Mutant("rate_forgets_newest", "lab/server/rates.py", "                self._buckets.popitem(last=False)",
           "                self._buckets.popitem(last=True)", (L + "test_lru_order.py",),
           "a full limiter forgets the client calling now: every new address unlimited"),
    Mutant("client_ipv6_64", "lab/server/rates.py", "return str(ipaddress.IPv6Network((ip, 64), strict=False))",
           "return str(ipaddress.IPv6Network((ip, 128), strict=False))", (L + "test_budget.py",),
           "each IPv6 address of one /64 is a client of its own"),
    Mutant("forwarded_for_rightmost", "lab/server/rates.py", "            return _key(public[-1])",
           "            return _key(public[0])", (L + "test_budget.py",),
           "behind a proxy the forgeable leftmost address is trusted"),
    Mutant("session_eviction_lru", "lab/server/sessionstore.py",
           "                    to_close.append(self._sessions.pop(min(idle)[1]))\n                session = ",
           "                    to_close.append(self._sessions.pop(max(idle)[1]))\n                session = ",
           (L + "test_lru_order.py",), "a full store closes the most recently used idle session"),
    Mutant("client_share_eviction_lru", "lab/server/sessionstore.py",
           "                        to_close.append(self._sessions.pop(min(idle)[1]))\n                while",
           "                        to_close.append(self._sessions.pop(max(idle)[1]))\n                while",
           (L + "test_lru_order.py",), "past its share an address loses its most recently used idle session"),
    Mutant("session_eviction_busy", "lab/server/sessionstore.py",
           "idle = [(s.touched, h) for h, s in self._sessions.items() if is_idle(s, now, self.idle_s)]",
           "idle = [(s.touched, h) for h, s in self._sessions.items()]", (L + "test_budget.py",),
           "a full store closes a session in use"),
    Mutant("client_session_share", "lab/server/sessionstore.py", "if len(own) >= self.client_sessions:",
           "if len(own) > self.client_sessions:", (L + "test_shares.py",), "one address holds one session too many"),
    Mutant("memory_client_share", "lab/server/budget.py", "h in ours) - before + nbytes - self.client_limit_bytes",
           "h in ours) - before + nbytes - 2 * self.client_limit_bytes", (L + "test_shares.py",),
           "one address may hold twice its share of memory"),
    Mutant("memory_lru_order", "lab/server/budget.py",
           "is_idle(o, now, self.idle_s)), key=lambda x: x[:2])\n        if sum(h.nbytes",
           "is_idle(o, now, self.idle_s)), key=lambda x: x[:2], reverse=True)\n        if sum(h.nbytes",
           (L + "test_budget.py",), "the memory budget empties the most recently used idle session first"),
    Mutant("idle_ignores_busy", "lab/server/budget.py", "    return not owner.busy and now - owner.touched >= idle_s",
           "    return now - owner.touched >= idle_s", (L + "test_budget.py",),
           "a session acting now counts as idle"),
    Mutant("disk_session_bound", "lab/server/budget.py", "            if nbytes > self.session_limit_bytes:",
           "            if nbytes > 2 * self.session_limit_bytes:", (L + "test_budget.py",),
           "one file may be twice a session's share of disk"),
    Mutant("queue_share", "ui/door.py", "        if mine >= self.places:", "        if mine > self.places:",
           (U + "test_shares_queue.py",), "an address holds one queue place more than its share", slow=True),
    # ----------------------------------------------------------------- the figures
    Mutant("viz_masked_cells", "viz/panels.py", "        masked = masked | mask",
           "        masked = masked & mask", (V + "test_viz_readable.py",),
           "the causal mask's cells drawn as weight 0 instead of hatched (only non-finite ones count as masked)"),
    Mutant("viz_score_scale", "viz/attention_colour.py", "        lo, hi, scale = -bound, bound, DIVERGING",
           "        lo, hi, scale = 0.0, bound, DIVERGING", (V + "test_viz.py", V + "test_viz_readable.py"),
           "scores' colour axis no longer symmetric around 0"),
    Mutant("viz_row_colour", "viz/attention_colour.py", "        return np.clip(vals / peak, 0.0, 1.0)",
           "        return np.clip(vals, 0.0, 1.0)", (V + "test_viz.py", V + "test_viz_readable.py"),
           "the row colour mode does not divide by the row's largest weight"),
    Mutant("viz_rope_similarity", "viz/positional.py",
           "feats = np.concatenate([np.cos(table), np.sin(table)], axis=1) if kind == \"rope\" else table",
           "feats = table", (V + "test_viz.py",), "RoPE's position similarity compares raw angles"),
)


def _check(mutants, tree: Path) -> list[str]:
    """What is wrong with the list: a name used twice, a snippet missing from its file or repeated."""
    problems, names = [], set()
    for m in mutants:
        if m.name in names:
            problems.append(f"{m.name}: the name is used twice")
        names.add(m.name)
        path = tree / m.file
        n = path.read_text(encoding="utf-8").count(m.old) if path.exists() else -1
        if n != 1:
            problems.append(f"{m.name}: {m.file} " + ("does not exist" if n < 0 else
                            "no longer holds its snippet" if n == 0 else f"holds its snippet {n} times"))
        problems += [f"{m.name}: no test file {t}" for t in m.tests if not (tree / t).exists()]
    return problems


def _copy_tree(dest: Path) -> Path:
    """The working tree's files (tracked, and new ones git does not ignore) under dest/repo; ../shared linked."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            check=True, capture_output=True).stdout.decode().split("\0")
    repo = dest / "repo"
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file():  # a tracked file deleted in the working tree is left out
            (repo / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, repo / rel)
    shared = ROOT.parent / "shared"
    if shared.exists():
        (dest / "shared").symlink_to(shared, target_is_directory=True)
    return repo


def _pytest_args(m: Mutant) -> list[str]:
    args = [sys.executable, "-m", "pytest", "-n", "0", "-x", "-q", "-p", "no:cacheprovider"]
    if not m.slow:
        args += ["-m", "not slow"]
    if m.k:
        args += ["-k", m.k]
    return [*args, *m.extra, *m.tests]


def _run(args: list[str], repo: Path) -> tuple[int, float, str]:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    start = time.monotonic()
    try:
        done = subprocess.run(args, cwd=repo, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
        rc, out = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out = -1, f"timed out after {TIMEOUT_S} s\n{exc.stdout or ''}"
    return rc, time.monotonic() - start, out


def _summary_line(out: str) -> str:
    """pytest's last line that counts tests ("1 failed, 3 passed in 2.1s"), or the output's last line."""
    lines = [s.strip("= ").strip() for s in out.strip().splitlines() if s.strip()]
    counted = [s for s in lines if any(w in s for w in (" passed", " failed", " error", "no tests ran"))]
    return (counted or lines or [""])[-1][:160]


def _sanity(mutants, repo: Path) -> list[str]:
    """Each distinct test command of `mutants`, unmutated: what fails (its summary), else nothing."""
    failures, seen = [], set()
    for m in mutants:
        args = _pytest_args(m)
        if tuple(args) in seen:
            continue
        seen.add(tuple(args))
        rc, secs, out = _run(args, repo)
        print(f"  sanity {' '.join(m.tests)}{' -k ' + m.k if m.k else ''}: rc {rc}, {secs:.0f} s", flush=True)
        if rc != 0:
            failures.append(f"{' '.join(shlex.quote(a) for a in args[1:])}: {_summary_line(out)}")
    return failures


def _verdict(rc: int, summary: str) -> str:
    """pytest's exit 1 with a failed test: caught; with errors only (a fixture the mutant broke; the sanity
    run passed them unmutated): caught (error); a hang: caught (timeout); all passed: SURVIVED."""
    if rc == 1:
        return "caught" if " failed" in summary else "caught (error)"
    return {0: "SURVIVED", -1: "caught (timeout)"}.get(rc, "error")


def run_mutant(m: Mutant, repo: Path) -> dict:
    path = repo / m.file
    original = path.read_text(encoding="utf-8")
    mutated = original.replace(m.old, m.new, 1)
    assert mutated != original, f"{m.name}: its snippet is not in {m.file}"  # _check ran on this copy
    path.write_text(mutated, encoding="utf-8")
    try:
        rc, secs, out = _run(_pytest_args(m), repo)
    finally:
        path.write_text(original, encoding="utf-8")
    summary = _summary_line(out)
    return {"name": m.name, "file": m.file, "tests": list(m.tests), "why": m.why, "result": _verdict(rc, summary),
            "rc": rc, "seconds": round(secs, 1), "pytest": summary}


def _table(rows: list[dict]) -> str:
    w = max(len(r["name"]) for r in rows)
    lines = [f"{'mutant':<{w}}  {'result':<16} {'s':>5}  tests / pytest"]
    for r in rows:
        lines.append(f"{r['name']:<{w}}  {r['result']:<16} {r['seconds']:>5.0f}  {', '.join(r['tests'])}: "
                     f"{r['pytest']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", default=[], help="mutant names (comma-separated; repeatable)")
    ap.add_argument("--list", action="store_true", help="list the mutants and the tests that must catch each")
    ap.add_argument("--json", type=Path, default=None, help=f"where to write the results (a full run: {RESULTS})")
    ap.add_argument("--keep", action="store_true", help="keep the copy of the tree (its path is printed)")
    ap.add_argument("--skip-sanity", action="store_true",
                    help="skip the unmutated run (when re-running a few mutants after a full run passed it)")
    args = ap.parse_args(argv)
    only = [n for part in args.only for n in part.split(",") if n]
    unknown = sorted(set(only) - {m.name for m in MUTANTS})
    if unknown:
        ap.error(f"no mutant named {', '.join(unknown)} (see --list)")
    chosen = [m for m in MUTANTS if not only or m.name in only]
    if args.list:
        for m in chosen:
            print(f"{m.name:<26} {m.file:<24} {', '.join(m.tests)}{' -k ' + repr(m.k) if m.k else ''}"
                  f"{' (slow tests too)' if m.slow else ''}\n{'':<26} {m.why}")
        return 0
    dest = Path(tempfile.mkdtemp(prefix=".mutants-", dir=ROOT.parent))
    try:
        return _run_all(chosen, dest, args, only)
    finally:
        if args.keep:
            print(f"kept the copy: {dest}")
        else:
            shutil.rmtree(dest, ignore_errors=True)


def _run_all(chosen: list[Mutant], dest: Path, args, only: list[str]) -> int:
    start = time.monotonic()
    repo = _copy_tree(dest)
    problems = _check(MUTANTS, repo)  # the copy's files: what the mutants will be applied to
    if problems:
        print("The mutant list no longer fits the code:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 2
    print(f"{len(chosen)} mutants; the tree copied to {repo}", flush=True)
    broken = [] if args.skip_sanity else _sanity(chosen, repo)
    if broken:
        print("The unmutated tree fails the named tests, so no mutant was run:\n  " + "\n  ".join(broken),
              file=sys.stderr)
        return 2
    rows = []
    for i, m in enumerate(chosen, 1):
        rows.append(run_mutant(m, repo))
        r = rows[-1]
        print(f"[{i}/{len(chosen)}] {m.name}: {r['result']} ({r['seconds']:.0f} s) {r['pytest']}", flush=True)
    caught = sum(r["result"].startswith("caught") for r in rows)
    print("\n" + _table(rows))
    print(f"\ncaught {caught} of {len(rows)}")
    out = args.json if args.json is not None else (None if only else RESULTS)
    if out is not None:
        one, five, _ = os.getloadavg()
        out.write_text(json.dumps({
            "command": "python -m bench.mutants" + "".join(f" --only {n}" for n in only), "caught": caught,
            "total": len(rows), "minutes": round((time.monotonic() - start) / 60, 1),
            "machine": {"load1": round(one, 2), "load5": round(five, 2), "cpus": os.cpu_count()},
            "mutants": [{**asdict(m), **r} for m, r in zip(chosen, rows)]}, indent=1, ensure_ascii=False) + "\n",
            encoding="utf-8")
    return 0 if caught == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
