"""Per-address shares (lab/server/rates.py, lab/server/sessionstore.py, lab/server/budget.py): one address at the
allowed rates cannot take what others need.

Fast and without a server, on a fake clock with fake sessions (tests/lab/test_budget.py's `Clock` and
`Fake`). Each test lets an abusive client take all it can at the rates it is allowed, keeping every
one of its sessions active, and then checks that a victim from another address is admitted: never
refused for capacity the abuser took. What is asserted is admissions, which the test controls.
"""

from __future__ import annotations

import pytest

from lab.checks import UserError
from lab.limits import CLIENT_SESSIONS, MAX_SESSIONS, RATE_LIMITS
from lab.server import files
from lab.server.budget import DiskBudget, ModelBudget
from lab.server.rates import RateLimiter
from lab.server.sessionstore import SessionStore
from tests.support.budget_fakes import Clock, Fake

ABUSER, VICTIM = "203.0.113.66", "198.51.100.7"
U = 1024


def store_of(clock, **kw):
    return SessionStore(lambda: Fake(clock, "fresh"), limiter=RateLimiter(clock=clock), clock=clock, **kw)


def test_one_address_holds_at_most_its_share_of_the_session_store_and_newcomers_still_get_in():
    """The flood of the report: new sessions at the allowed rate for ten minutes, all kept active
    (~2.5 cheap calls a second); with the real store and the real share."""
    assert CLIENT_SESSIONS * 4 <= MAX_SESSIONS  # one address leaves most of the store to the others
    clock = Clock()
    store = store_of(clock)
    per_s = RATE_LIMITS["session"][1] / RATE_LIMITS["session"][2]
    held, refused = [], []
    for i in range(int(600 * per_s)):
        try:
            held.append(store.resolve(f"flood-{i}", ABUSER, Fake(clock)))
        except UserError as exc:
            refused.append(str(exc))
        for s in held:  # every session of the abuser acted just now: none is idle
            s.act()
        clock.advance(1 / per_s)
    assert len(held) == CLIENT_SESSIONS
    assert refused and all(m.startswith("Your address already has") for m in refused), refused[:1]
    for i in range(MAX_SESSIONS - CLIENT_SESSIONS):  # everyone else still fits, each from its own address
        v = store.resolve(f"victim-{i}", f"10.{i // 250}.{i % 250}.1", Fake(clock, "victim"))
        assert v.client == f"10.{i // 250}.{i % 250}.1"
        clock.advance(1)
        for s in held:
            s.act()
    assert len(store) == MAX_SESSIONS and not any(s.closed for s in held)


def test_past_its_share_an_address_recycles_its_own_idle_sessions_never_another_s():
    clock = Clock()
    store = store_of(clock, max_sessions=10, client_sessions=3, idle_s=60)
    victim = store.resolve("v", VICTIM, Fake(clock, "victim"))
    mine = [store.resolve(f"a{i}", ABUSER, Fake(clock)) for i in range(3)]
    with pytest.raises(UserError, match="one address may hold 3"):
        store.resolve("a3", ABUSER, Fake(clock))
    clock.advance(61)
    victim.act()
    mine[1].act()
    store.resolve("a3", ABUSER, Fake(clock))  # its least recently used idle session makes room
    assert mine[0].closed and not mine[1].closed and not victim.closed
    assert sum(s.client == ABUSER for s in store._sessions.values()) == 3


def test_memory_one_address_gets_its_share_and_the_victim_the_rest():
    clock = Clock()
    budget = ModelBudget(100 * U, client_limit_bytes=25 * U, clock=clock)
    taken, refused = [], 0
    for i in range(40):  # 40 sessions of the abuser, each asking for 5 U and staying active
        s = Fake(clock, f"a{i}")
        s.client = ABUSER
        try:
            budget.hold(s, 5 * U)
            taken.append(s)
        except UserError as exc:
            assert "from your address" in str(exc)
            refused += 1
        clock.advance(1)
        for t in taken:
            t.act()
    assert len(taken) == 5 and refused == 35 and budget.total == 25 * U
    victims = [Fake(clock, f"v{i}") for i in range(15)]  # (the budget holds sessions weakly)
    for i, v in enumerate(victims):  # the rest of the server's memory goes to the others
        v.client = f"10.0.0.{i}"
        budget.hold(v, 5 * U)
    assert budget.total == 100 * U and not any(t.dropped for t in taken)


def test_memory_an_address_past_its_share_frees_its_own_idle_sessions_first():
    clock = Clock()
    budget = ModelBudget(100 * U, client_limit_bytes=10 * U, idle_s=60, clock=clock)
    victim = Fake(clock, "victim")
    victim.client = VICTIM
    budget.hold(victim, 5 * U)
    old, new = Fake(clock, "old"), Fake(clock, "new")
    old.client = new.client = ABUSER
    budget.hold(old, 10 * U)
    clock.advance(61)  # old and the victim are idle now
    budget.hold(new, 10 * U)
    assert old.dropped == 1 and victim.dropped == 0 and budget.held(victim) == 5 * U


@pytest.fixture
def runs(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "RUNS", tmp_path / "runs")
    return tmp_path / "runs"


def save(disk, s, nbytes, name):
    with disk.room(s, nbytes):
        s.run_dir = s.run_dir or files.new_session_dir()
        (s.run_dir / name).write_bytes(b"x" * nbytes)


def test_disk_one_address_gets_its_share_and_the_victim_still_saves(runs):
    clock = Clock()
    disk = DiskBudget(100 * U, 20 * U, client_limit_bytes=30 * U, clock=clock)
    abusers = []
    for i in range(10):
        s = Fake(clock, f"a{i}")
        s.client = ABUSER
        abusers.append(s)
    saved = refused = 0
    for k in range(40):  # round after round of exports from every session, all active
        for s in abusers:
            try:
                save(disk, s, 4 * U, f"export-{k}.html")
                saved += 1
            except UserError as exc:
                assert "from your address" in str(exc)
                refused += 1
            s.act()
        clock.advance(1)
    assert disk.total <= 30 * U and refused > 0
    victims = [Fake(clock, f"v{i}") for i in range(7)]
    for i, v in enumerate(victims):  # 70 U left: seven victims save 10 U each
        v.client = f"10.0.1.{i}"
        save(disk, v, 10 * U, "page.html")
    assert disk.total <= 100 * U and not any(s.dropped for s in abusers)


def test_a_session_file_s_replay_counts_for_the_importing_address(tmp_path, monkeypatch):
    """The scratch session a file replays on holds the file's text beside the importer's own until the
    file has replayed: both count for the importer's address, so an address at its share cannot
    grow past it by opening files (the victim, with room, opens the same file)."""
    from lab import sessionfile
    from lab.server import budget
    from lab.session import Session, View
    from model.generate import Sampling

    grammar, prompt = "grammar (built-in)", "anna found the key . she gave it to tom because he"
    made = Session()
    for _ in range(3):
        made.step(grammar, prompt, Sampling(seed=1))
    path = tmp_path / "s.json"
    path.write_bytes(sessionfile.export_session(made, grammar, prompt, Sampling(seed=1), View(0, "all", "weights")))
    need = budget.MODEL_BUDGET.held(made)  # what its replay holds at most (the text, and room for a Step)
    importer = Session()
    importer.client = "203.0.113.99"
    importer.step(grammar, prompt, Sampling(seed=2))
    own = budget.MODEL_BUDGET.held(importer)
    assert 0 < own
    # the address's share holds its own text and the file's text, but not both at once
    monkeypatch.setattr(budget.MODEL_BUDGET, "client_limit_bytes", own + need - 1)
    before = importer.tokens()
    with pytest.raises(UserError, match="from your address would hold"):
        sessionfile.open_session(importer, str(path))
    assert importer.tokens() == before and budget.MODEL_BUDGET.held(importer) == own  # nothing changed
    victim = Session()
    victim.client = "198.51.100.99"
    sessionfile.open_session(victim, str(path))  # another address, with room for it, opens the same file
    assert victim.tokens() == made.tokens()


class WarmText:
    """A session as the store of warm texts sees it (lab.server.warm.WarmTenant): its text's heavy bytes, its
    address."""

    def __init__(self, client: str, nbytes: int):
        self.client, self.closed, self.nbytes, self.cooled = client, False, nbytes, 0
        self.text = self

    def heavy_nbytes(self) -> int:
        return self.nbytes

    def cool_text(self) -> bool:
        self.nbytes, self.cooled = 0, self.cooled + 1
        return True


def test_warm_texts_one_address_s_many_texts_cool_its_own_never_the_victim_s():
    """The victim's text is the least recently used of all, yet while the abuser holds more than its share
    of the bound, the abuser's own texts cool (its least recently used first): the victim's next Step needs
    no forward pass over its whole window."""
    from lab.server.warm import WarmTexts

    store = WarmTexts(limit_bytes=100 * U, cool_from_bytes=1, client_limit_bytes=30 * U)
    victim = WarmText(VICTIM, 20 * U)
    store.used(victim)
    abuser = []
    for i in range(40):  # texts of 10 U, one after another, each the newest when it acts
        abuser.append(WarmText(ABUSER, 10 * U))
        store.used(abuser[-1])
    assert victim.cooled == 0 and store.held(victim) == 20 * U
    assert store.total <= 100 * U and sum(t.nbytes for t in abuser) <= 80 * U
    assert all(t.cooled for t in abuser[:-8])  # its least recently used went first
    other = WarmText("198.51.100.8", 20 * U)  # within its share, another visitor's text still fits beside
    store.used(other)
    assert victim.cooled == 0 and other.cooled == 0 and store.total <= 100 * U
