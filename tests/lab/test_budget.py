"""lab/server/rates.py, lab/server/sessionstore.py and lab/server/budget.py: one visitor cannot take what
everyone shares.

Fast and without a server: a fake clock, fake sessions that implement the `Tenant` protocol, and
a temporary folder in place of lab.server.files.RUNS. What is checked: a person's pace passes and a
burst is told to slow down (and may go on after the time it was told); the limiter's memory is
bounded; the model and disk budgets take from the least recently used idle sessions first, never
from a busy, recently active or asking one, refuse when nothing can go, and hold their bound
under any sequence of operations; and 500 throw-away sessions leave an active person's session,
text and models as they were.
"""

from __future__ import annotations

import gc
import os
import re
import threading
import time
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from lab import limits
from lab.checks import UserError
from lab.server import files, rates
from lab.server.budget import DiskBudget, ModelBudget, Tenant, model_bytes
from lab.server.rates import RateLimiter, client_key
from lab.server.sessionstore import SessionKey, SessionStore
from lab.session import Session
from tests.support.budget_fakes import Clock, Fake

MB = 2**20


def add_model(budget: ModelBudget, s: Fake, name: str, nbytes: int) -> None:
    """What Session does before it keeps a new own model: hold the new total, then keep it."""
    budget.hold(s, sum(s.models.values()) + nbytes)
    s.models[name] = nbytes
    s.act()


def test_fake_sessions_implement_the_protocol():
    assert isinstance(Fake(Clock()), Tenant)


# ---------------------------------------------------------------------------- rates

RATES = {a: rates.Rate(*r) for a, r in limits.RATE_LIMITS.items()}
# a quick person: a page reload every 5 s, Generate every 3 s, a training every 3 min (one takes up
# to TRAIN_MAX_SECONDS), an upload a minute
# (a session file opened a minute, a file made every 3 s, a Step replayed every second, a patching sweep
# every 8 s: each is a heatmap to read)
PERSON_EVERY_S = {"session": 5.0, "generate": 3.0, "train": 180.0, "upload": 60.0, "import": 60.0, "export": 3.0,
                  "replay": 1.0, "patch": 8.0}


def test_every_action_has_a_rate_and_a_person_pace():
    assert set(limits.RATE_LIMITS) == set(PERSON_EVERY_S) | {"upload_bytes"}  # bytes: the test below


def test_uploaded_bytes_allow_a_person_s_uploads_and_stop_a_flood():
    """Bytes sent to gradio's upload route: five of the largest files at once, then a person's pace
    (a 1 MB model or session file every 40 s, for hours); past the share, a sentence in MB."""
    clock = Clock()
    rl = RateLimiter(clock=clock)
    mb, largest = 2**20, limits.UPLOAD_MAX_MB * 2**20
    for _ in range(5):
        rl.check("1.2.3.4", "upload_bytes", largest)
    with pytest.raises(UserError, match=r"^Slow down: too many megabytes were uploaded from your address"):
        rl.check("1.2.3.4", "upload_bytes", mb)
    rl.check("5.6.7.8", "upload_bytes", largest)  # another address is not affected
    clock.advance(RATES["upload_bytes"].window_s)
    for _ in range(300):
        rl.check("1.2.3.4", "upload_bytes", mb)
        clock.advance(40)
    share = RATES["upload_bytes"].burst // mb
    with pytest.raises(UserError, match=fr"^This would take {share + 1} MB of uploads; one address may take at most "
                                        fr"{share} at once"):
        rl.check("9.9.9.9", "upload_bytes", RATES["upload_bytes"].burst + 1)


@pytest.mark.parametrize("action", sorted(PERSON_EVERY_S))
def test_a_person_s_pace_is_never_refused(action):
    clock = Clock()
    rl = RateLimiter(clock=clock)
    for _ in range(RATES[action].burst):  # first a burst (a classroom opening the page at once)…
        rl.check("1.2.3.4", action)
    clock.advance(RATES[action].window_s)
    for _ in range(200):  # …then a quick person's pace for a long time
        rl.check("1.2.3.4", action)
        clock.advance(PERSON_EVERY_S[action])


@pytest.mark.parametrize("action", sorted(PERSON_EVERY_S))
def test_a_burst_is_told_to_slow_down_and_recovers_after_the_time_it_was_told(action):
    clock = Clock()
    rl = RateLimiter(clock=clock)
    rate = RATES[action]
    for _ in range(rate.burst):
        rl.check("1.2.3.4", action)
    with pytest.raises(UserError, match=r"^Slow down: .* Try again in (\d+) (second|seconds|minutes)\.$") as e:
        rl.check("1.2.3.4", action)
    n, unit = re.search(r"Try again in (\d+) (\w+)", str(e.value)).groups()
    wait = int(n) * (60 if unit == "minutes" else 1)
    assert wait >= rate.window_s / rate.count - 1e-9
    for _ in range(50):  # hammering while refused does not push the time back
        with pytest.raises(UserError, match="Slow down"):
            rl.check("1.2.3.4", action)
    rl.check("5.6.7.8", action)  # other clients are not affected…
    rl.check("1.2.3.4", next(a for a in RATES if a != action))  # …nor the same client's other actions
    clock.advance(wait)
    rl.check("1.2.3.4", action)
    clock.advance(rate.window_s)  # after a quiet window the burst is back
    for _ in range(min(rate.burst, rate.count)):
        rl.check("1.2.3.4", action)


def test_the_fuzz_burst_of_320_sessions_in_3_5_seconds_gets_the_burst_only():
    clock = Clock()
    rl = RateLimiter(clock=clock)
    ok = 0
    for _ in range(320):
        try:
            rl.check("9.9.9.9", "session")
            ok += 1
        except UserError:
            pass
        clock.advance(3.5 / 320)
    rate = RATES["session"]
    assert ok <= rate.burst + 3.5 * rate.per_s + 1


def test_the_limiter_forgets_the_least_recently_used_clients_only():
    clock = Clock()
    rl = RateLimiter({"x": (1, 1, 60.0)}, max_keys=100, clock=clock)
    rl.check("hot", "x")
    for i in range(1000):
        rl.check(f"10.0.{i // 256}.{i % 256}", "x")
        if i % 50 == 0:
            with pytest.raises(UserError):  # the client that keeps coming is still remembered
                rl.check("hot", "x")
        assert len(rl) <= 100
    assert len(rl) == 100


def test_no_client_no_limit_and_an_unknown_action_is_a_programming_error():
    rl = RateLimiter({"x": (1, 1, 60.0)}, clock=Clock())
    for _ in range(10):
        rl.check(None, "x")
    with pytest.raises(KeyError):
        rl.check("1.2.3.4", "nonsense")


def test_the_limiter_is_thread_safe():
    rl = RateLimiter({"x": (50, 1, 3600.0)}, clock=Clock())  # a frozen clock: exactly 50 tokens
    ok, lock = [], threading.Lock()

    def worker():
        for _ in range(100):
            try:
                rl.check("1.2.3.4", "x")
                with lock:
                    ok.append(1)
            except UserError:
                pass

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ok) == 50


def test_the_server_s_limiter_runs_on_the_module_clock_a_test_can_drive(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(rates, "monotonic", clock)
    rate = rates.LIMITER.rates["generate"]
    me = "203.0.113.77"
    for _ in range(rate.burst):  # however long these calls take, the clock stands still
        rates.LIMITER.check(me, "generate")
    with pytest.raises(UserError, match="Slow down"):
        rates.LIMITER.check(me, "generate")
    clock.advance(rate.window_s / rate.count)  # exactly one token later
    rates.LIMITER.check(me, "generate")
    with pytest.raises(UserError, match="Slow down"):
        rates.LIMITER.check(me, "generate")


@pytest.mark.parametrize("host,xff,proxy,key", [
    ("1.2.3.4", None, False, "1.2.3.4"),
    ("1.2.3.4", "5.6.7.8", False, "1.2.3.4"),  # no proxy: a forged header changes nothing
    ("10.16.3.80", "5.6.7.8", True, "5.6.7.8"),  # Spaces: the proxy's address is not the client
    ("10.16.3.80", "6.6.6.6, 7.7.7.7, 5.6.7.8, 10.0.0.2", True, "5.6.7.8"),  # forged left entries ignored
    ("10.16.3.80", "192.168.1.20", True, "192.168.1.20"),  # a private network behind a local proxy
    ("10.16.3.80", "junk, ", True, "10.16.3.80"),
    ("10.16.3.80", None, True, "10.16.3.80"),
    ("2a00:1450:4001:81c::200e", None, False, "2a00:1450:4001:81c::/64"),  # one subscriber, one /64
    ("2a00:1450:4001:81c:1:2:3:4", None, False, "2a00:1450:4001:81c::/64"),
    ("::ffff:1.2.3.4", None, False, "1.2.3.4"),
    (None, None, False, "unknown"),
])
def test_client_key(host, xff, proxy, key):
    assert client_key(host, xff, behind_proxy=proxy) == key


# ------------------------------------------------------------------------- sessions


def make_store(clock, **kw):
    made = []

    def factory():
        s = Fake(clock, "fresh")
        made.append(s)
        return s

    kw.setdefault("limiter", RateLimiter(clock=clock))
    return SessionStore(factory, clock=clock, **kw), made


def test_a_kept_session_survives_gradio_dropping_its_state():
    clock = Clock()
    store, _ = make_store(clock)
    mine = Fake(clock, "mine")
    assert store.resolve("hash-a", "1.1.1.1", mine) is mine
    mine.models["own"] = 1
    # gradio evicted the tab's state and deep-copied a fresh Session for the same hash
    assert store.resolve("hash-a", "1.1.1.1", Fake(clock, "gradio's fresh copy")) is mine
    assert store.resolve(None, None, mine) is mine  # no request (a direct call): what was given


def test_new_sessions_are_rate_limited_per_client_and_kept_ones_still_answer():
    clock = Clock()
    store, _ = make_store(clock, client_sessions=10_000)  # the rate alone (tests/lab/test_shares.py: the share)
    mine = store.resolve("person", "1.1.1.1", Fake(clock))
    refused = 0
    for i in range(320):
        try:
            store.resolve(f"flood-{i}", "6.6.6.6", Fake(clock))
        except UserError as exc:
            assert str(exc).startswith("Slow down")
            refused += 1
        clock.advance(3.5 / 320)
    assert refused >= 320 - RATES["session"].burst - 4
    assert store.resolve("person", "1.1.1.1", Fake(clock)) is mine  # no token needed: not new
    assert len(store) <= RATES["session"].burst + 5


def test_a_full_store_closes_the_least_recently_used_idle_session_never_an_active_one():
    clock = Clock()
    store, _ = make_store(clock, max_sessions=3, idle_s=60, limiter=None)
    a = store.resolve("a", "x", Fake(clock, "a"))
    clock.advance(10)
    b = store.resolve("b", "x", Fake(clock, "b"))
    clock.advance(10)
    c = store.resolve("c", "x", Fake(clock, "c"))
    with pytest.raises(UserError, match="server is full"):  # all three acted within a minute
        store.resolve("d", "x", Fake(clock, "d"))
    clock.advance(100)
    a.is_busy = True  # a is the oldest but acting (training)
    b.act()  # b is the second oldest, but acted just now
    d = store.resolve("d", "x", Fake(clock, "d"))
    assert c.closed and not a.closed and not b.closed and not d.closed
    assert set(store._sessions) == {"a", "b", "d"}


def test_a_closed_session_is_replaced_and_expired_ones_are_closed():
    clock = Clock()
    store, made = make_store(clock, ttl_s=1800, limiter=None)
    a = store.resolve("a", "x", Fake(clock, "a"))
    a.close()  # gradio's time_to_live called Session.close
    fresh = store.resolve("a", "x", a)  # gr.State still hands the closed one
    assert fresh is made[-1] and not fresh.closed
    b = store.resolve("b", "x", Fake(clock, "b"))
    clock.advance(1801)
    fresh.act()
    store.resolve("c", "x", Fake(clock, "c"))
    assert b.closed and not fresh.closed and "b" not in store


def test_a_page_holds_only_the_key_of_its_session_and_closing_the_key_closes_the_session():
    store, made = make_store(Clock(), limiter=None)
    key = SessionKey(store)  # what gr.State holds: no session, only its key
    mine, key.session_hash = store.resolve("a", "x"), "a"  # the handler trades the key for a new session here
    assert mine is made[-1] and store.resolve("a", "x") is mine  # and for the same one on every later call
    key.close()  # gradio deleted the tab's state (it expired, or the tab closed)
    assert mine.closed and "a" not in store and store.resolve("a", "x") is made[-1] is not mine
    assert store.resolve(None, None) is made[-1] and len(store) == 1  # no hash: a new session, not kept


# --------------------------------------------------------------------------- models


def test_model_bytes_counts_parameters_and_buffers_and_tied_weights_once():
    from model.config import ModelConfig
    from model.transformer import DecoderLM

    m = torch.nn.Module()
    m.emb = torch.nn.Embedding(10, 4)
    m.head = torch.nn.Linear(4, 10, bias=False)
    m.head.weight = m.emb.weight
    m.register_buffer("table", torch.zeros(3, 4))
    assert model_bytes(m) == 10 * 4 * 4 + 3 * 4 * 4
    for pos in ("learned", "sinusoidal", "rope"):
        lm = DecoderLM(ModelConfig(vocab_size=50, block_size=16, n_layers=1, n_heads=2, d_model=16, d_ff=32,
                                   pos_encoding=pos))
        buffers = sum(b.numel() * b.element_size() for b in lm.buffers())
        assert model_bytes(lm) == lm.n_params() * 4 + buffers


def test_the_least_recently_used_idle_session_s_models_go_first():
    clock = Clock()
    b = ModelBudget(100, idle_s=60, clock=clock)
    old, older, new = Fake(clock, "old"), Fake(clock, "older"), Fake(clock, "new")
    add_model(b, older, "m", 40)
    clock.advance(10)
    add_model(b, old, "m", 40)
    clock.advance(100)
    add_model(b, new, "m", 30)  # needs 10: only the least recently used goes
    assert older.models == {} and older.text == "" and "removed to make room" in older.notices[0]
    assert old.models == {"m": 40} and b.total == 70 and b.held(older) == 0


def test_busy_recent_and_asking_sessions_keep_their_models():
    clock = Clock()
    b = ModelBudget(100, idle_s=60, clock=clock)
    training, recent, asking = Fake(clock, "training"), Fake(clock, "recent"), Fake(clock, "asking")
    add_model(b, training, "m", 30)
    add_model(b, asking, "m", 30)
    add_model(b, recent, "m", 30)
    clock.advance(100)
    training.is_busy = True
    recent.act()
    with pytest.raises(UserError, match="server is full"):
        add_model(b, asking, "m2", 30)  # asking is idle itself, but never loses anything to its own request
    assert all(s.models for s in (training, recent, asking)) and b.total == 90
    assert b.held(asking) == 30


def test_a_refusal_takes_nothing_from_anyone():
    clock = Clock()
    b = ModelBudget(100, idle_s=60, clock=clock)
    idle, recent = Fake(clock, "idle"), Fake(clock, "recent")
    add_model(b, idle, "m", 20)
    clock.advance(100)
    add_model(b, recent, "m", 70)
    newcomer = Fake(clock, "newcomer")
    with pytest.raises(UserError, match="server is full"):
        add_model(b, newcomer, "m", 40)  # needs 30, only 20 could go: nothing goes
    assert idle.models and b.total == 90
    add_model(b, newcomer, "m", 30)  # needs 20: the idle one's go
    assert not idle.models and b.total == 100


def test_a_session_that_becomes_busy_while_being_evicted_is_skipped():
    clock = Clock()
    b = ModelBudget(100, idle_s=60, clock=clock)
    x, y = Fake(clock, "x"), Fake(clock, "y")
    add_model(b, x, "m", 50)
    add_model(b, y, "m", 50)
    clock.advance(100)
    x.drop_own_models = lambda reason: False  # it took its turn just now
    z = Fake(clock, "z")
    add_model(b, z, "m", 50)
    assert x.models and not y.models and z.models and b.total == 100


def test_less_always_fits_closed_and_collected_sessions_count_for_nothing():
    clock = Clock()
    b = ModelBudget(100, idle_s=60, clock=clock)
    a, c = Fake(clock), Fake(clock)
    add_model(b, a, "m", 60)
    with pytest.raises(UserError, match="allows"):
        b.hold(c, 101)
    b.hold(a, 10)
    assert b.total == 10
    a.close()
    assert b.total == 0
    d = Fake(clock)
    add_model(b, d, "m", 70)
    del d
    gc.collect()
    assert b.total == 0
    b.hold(c, 100)
    b.release(c)
    assert b.total == 0


def test_the_model_budget_is_thread_safe():
    clock = Clock()
    b = ModelBudget(1000, idle_s=60, clock=clock)
    owners = [Fake(clock, str(i)) for i in range(8)]
    held = {}

    def worker(o, seed):
        for i in range(300):
            n = (seed * 7919 + i * 104729) % 400
            try:
                b.hold(o, n)
                held[o.name] = n
            except UserError:
                pass
            assert b.total <= 1000

    threads = [threading.Thread(target=worker, args=(o, i)) for i, o in enumerate(owners)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert b.total == sum(held.values()) <= 1000
    assert all(b.held(o) == held.get(o.name, 0) for o in owners)


class ModelBudgetMachine(RuleBasedStateMachine):
    """Any sequence of sessions adding, acting, going busy, closing and time passing."""

    LIMIT = 100

    @initialize()
    def setup(self):
        self.clock = Clock()
        self.budget = ModelBudget(self.LIMIT, idle_s=60, clock=self.clock)
        self.sessions: list[Fake] = []

    @rule()
    def new_session(self):
        self.sessions.append(Fake(self.clock, f"s{len(self.sessions)}"))

    @precondition(lambda self: self.sessions)
    @rule(i=st.integers(0, 50), nbytes=st.integers(1, 60))
    def add(self, i, nbytes):
        s = self.sessions[i % len(self.sessions)]
        if s.closed:
            return
        before = {id(o): (dict(o.models), o.dropped) for o in self.sessions}
        protected = {id(o) for o in self.sessions
                     if o is s or o.busy or self.clock() - o.touched < 60 or not o.models}
        s.act()
        try:
            self.budget.hold(s, sum(s.models.values()) + nbytes)
        except UserError:
            for o in self.sessions:  # a refusal takes nothing from anyone
                assert (dict(o.models), o.dropped) == before[id(o)]
            return
        s.models[f"m{len(s.models)}"] = nbytes
        for o in self.sessions:
            if id(o) in protected and o is not s:
                assert (dict(o.models), o.dropped) == before[id(o)], f"{o} lost its models"
        assert s.dropped == before[id(s)][1]

    @precondition(lambda self: self.sessions)
    @rule(i=st.integers(0, 50))
    def act(self, i):
        self.sessions[i % len(self.sessions)].act()

    @precondition(lambda self: self.sessions)
    @rule(i=st.integers(0, 50))
    def toggle_busy(self, i):
        s = self.sessions[i % len(self.sessions)]
        s.is_busy = not s.is_busy

    @precondition(lambda self: self.sessions)
    @rule(i=st.integers(0, 50))
    def close(self, i):
        s = self.sessions[i % len(self.sessions)]
        s.close()
        s.models.clear()

    @rule(dt=st.sampled_from([1, 30, 61, 300]))
    def wait(self, dt):
        self.clock.advance(dt)

    @invariant()
    def bounded_and_true(self):
        if not hasattr(self, "budget"):
            return
        assert self.budget.total <= self.LIMIT
        for o in self.sessions:
            if not o.closed:
                assert self.budget.held(o) == sum(o.models.values())


TestModelBudgetMachine = ModelBudgetMachine.TestCase
TestModelBudgetMachine.settings = settings(max_examples=200, stateful_step_count=50, deadline=None,
                                           suppress_health_check=[HealthCheck.too_slow])


# ----------------------------------------------------------------------------- disk


@pytest.fixture
def runs(tmp_path, monkeypatch):
    root = tmp_path / "runs"
    root.mkdir()
    monkeypatch.setattr(files, "RUNS", root)
    return root


def folder(root: Path, name: str, sizes: list[int], age_s: float = 0.0) -> Path:
    d = root / name
    d.mkdir()
    t = time.time() - age_s
    for i, n in enumerate(sizes):
        f = d / f"model{i}.safetensors"
        f.write_bytes(b"x" * n)
        os.utime(f, (t + i, t + i))
    os.utime(d, (t, t))
    return d


def test_disk_frees_gone_sessions_oldest_first_then_idle_ones_never_the_active_one(runs):
    clock = Clock()
    disk = DiskBudget(1000, 1000, idle_s=60, clock=clock)
    orphan_old = folder(runs, "orphan-old", [100], age_s=7200)
    orphan_new = folder(runs, "orphan-new", [100], age_s=60)
    idle_lru = Fake(clock, "idle-lru", folder(runs, "idle-lru", [200]))
    clock.advance(10)
    idle_mru = Fake(clock, "idle-mru", folder(runs, "idle-mru", [200]))
    busy = Fake(clock, "busy", folder(runs, "busy", [150]))
    me = Fake(clock, "me", folder(runs, "me", [200]))
    for s in (idle_lru, idle_mru, busy, me):
        with disk.room(s, 0):
            pass
    clock.advance(100)
    busy.is_busy = True
    assert disk.total == 950
    with disk.room(me, 100):  # needs 50: the oldest gone session's folder
        (me.run_dir / "new.safetensors").write_bytes(b"x" * 100)
    assert not orphan_old.exists() and orphan_new.exists() and disk.total == 950
    with disk.room(me, 250):  # needs 200: the other gone one, then the least recently used idle one
        (me.run_dir / "new2.safetensors").write_bytes(b"x" * 250)
    assert not orphan_new.exists() and idle_lru.run_dir is None and idle_mru.run_dir.exists()
    assert "deleted to make room" in idle_lru.notices[0]
    assert busy.run_dir.exists() and me.run_dir.exists() and disk.total <= 1000


def test_disk_refuses_and_deletes_nothing_when_only_active_sessions_hold_it(runs):
    clock = Clock()
    disk = DiskBudget(1000, 500, idle_s=60, clock=clock)
    others = [Fake(clock, f"o{i}", folder(runs, f"o{i}", [300])) for i in range(3)]
    orphan = folder(runs, "orphan", [50], age_s=9999)
    for s in others:
        with disk.room(s, 0):
            pass
    me = Fake(clock, "me")
    with pytest.raises(UserError, match="disk .* is full"):
        with disk.room(me, 200):
            pass
    assert orphan.exists() and all(s.run_dir.exists() for s in others)
    with pytest.raises(UserError, match="a session may keep"):
        with disk.room(me, 501):
            pass


def test_a_session_over_its_own_bound_loses_its_own_oldest_files(runs):
    clock = Clock()
    disk = DiskBudget(10_000, 500, idle_s=60, clock=clock)
    me = Fake(clock, "me", folder(runs, "me", [200, 200]))  # model0 older than model1
    with disk.room(me, 200):
        (me.run_dir / "model2.safetensors").write_bytes(b"x" * 200)
    assert sorted(p.name for p in me.run_dir.iterdir()) == ["model1.safetensors", "model2.safetensors"]


# ------------------------------------------------------------------------- scenario


@pytest.mark.parametrize("max_sessions", [100, 1000])  # the store makes room first / the budgets do
def test_500_throw_away_sessions_leave_an_active_session_as_it_was(runs, max_sessions):
    """One person uses the lab (a step every 20 s, two own models, a file to download) while 500
    throw-away sessions each upload a 19 MB model and save a 10 MB file once: from one address in
    5 s, then from 500 addresses over 500 s. The person's session, text, models and file stay.
    (Sizes are in units of U bytes, so the files stay small; the budgets are scaled the same.)"""
    U = 1024
    clock = Clock()
    limiter = RateLimiter(clock=clock)
    store, _ = make_store(clock, max_sessions=max_sessions, limiter=limiter)
    models = ModelBudget(400 * U, clock=clock)
    disk = DiskBudget(200 * U, 60 * U, clock=clock)

    def session(h, client):
        return store.resolve(h, client, Fake(clock, h))

    def save(s, nbytes):
        with disk.room(s, nbytes):
            s.run_dir = s.run_dir or files.new_session_dir()
            (s.run_dir / f"m{nbytes}.safetensors").write_bytes(b"x" * nbytes)

    person = session("person", "1.1.1.1")
    add_model(models, person, "trained", 5 * U)
    add_model(models, person, "uploaded", 19 * U)
    save(person, U)
    person.text = "anna found the key . she"
    snapshot = (dict(person.models), person.text, sorted(p.name for p in person.run_dir.iterdir()))
    refusals = {"Slow down": 0, "full": 0}
    made = []

    def throw_away(h, client):
        try:
            s = session(h, client)
            made.append(s)
            add_model(models, s, "uploaded", 19 * U)
            save(s, 10 * U)
        except UserError as exc:
            refusals["Slow down" if str(exc).startswith("Slow down") else "full"] += 1

    for i in range(500):  # one address, 5 s
        throw_away(f"burst-{i}", "6.6.6.6")
        clock.advance(0.01)
    assert refusals["Slow down"] >= 500 - RATES["session"].burst - 6
    for i in range(500):  # 500 addresses, one a second, while the person keeps working
        throw_away(f"spread-{i}", f"7.7.{i // 256}.{i % 256}")
        clock.advance(1)
        if i % 20 == 0:
            assert store.resolve("person", "1.1.1.1", Fake(clock)) is person
            person.act()
        assert models.total <= 400 * U and disk.total <= 200 * U
    # the newest were told the server is full, idle ones made room for later ones…
    assert refusals["full"] > 0
    if max_sessions == 100:
        assert sum(s.closed for s in made) > 50
    else:
        assert sum(s.dropped for s in made) > 10 and not any(s.closed for s in made)
    # …and the person lost nothing
    assert not person.closed and person.dropped == 0 and not person.notices
    assert (dict(person.models), person.text, sorted(p.name for p in person.run_dir.iterdir())) == snapshot
    assert len(store) <= max_sessions


# ------------------------------------------------------------------- the real Session

def test_the_real_session_implements_the_protocol():
    s = Session()
    assert isinstance(s, Tenant) and not s.busy and not s.closed
    with s.turn():
        assert s.busy
        assert s.drop_own_models("test") is False and s.drop_files("test") is False
    assert not s.busy and s.drop_own_models("test") is True
    assert s.model_names() == s.builtins.names
