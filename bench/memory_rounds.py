"""Does memory come back after sessions end? Rounds of sessions through the app's own handlers.

Each round creates N sessions that train a tiny model, step the default model 5 times and generate,
then closes them (`Session.close`, what the app does when a tab's state goes) and collects garbage;
resident memory (tests.support.server.rss_mb of this process) is reported after a one-session warm-up
and after every round. A leak shows as growth from round to round; one-time costs (imports, kernel
set-up, the heap's high-water mark) show once, in the warm-up.

    python -m bench.memory_rounds [--rounds 4] [--sessions 20]
"""

from __future__ import annotations

import gc

from bench.common import default_entry, emit, parser
from tests.support.server import rss_mb


def one_round(app, n: int) -> None:
    from lab.catalogue.models import DEFAULT_MODEL
    from lab.session import Session

    sessions = []
    for i in range(n):
        session = Session()
        list(app.train_model(session, "sort", "", None, "char", 1, 2, 32, 64, "learned", "pre", "gelu", 0.0, 20, 3e-3,
                             i))
        for _ in range(5):
            app.step(session, DEFAULT_MODEL, "anna found the key . she", 0.8, 0, 1.0, i, 0, "all", "weights")
        list(app.generate(session, DEFAULT_MODEL, "tom found the map .", 0.8, 0, 1.0, i, 5, 0, "all", "weights"))
        sessions.append(session)
    for session in sessions:
        session.close()
    del sessions
    gc.collect()


def main() -> None:
    p = parser("memory_rounds", __doc__)
    p.add_argument("--rounds", type=int, default=4, help="rounds after the warm-up")
    p.add_argument("--sessions", type=int, default=20, help="sessions per round")
    args = p.parse_args()
    import app

    default_entry()  # load the shared model first: its memory is not a session's
    start = rss_mb()
    one_round(app, 1)
    warm = rss_mb()
    after = []
    for _ in range(args.rounds):
        one_round(app, args.sessions)
        after.append(rss_mb())
    emit("memory_rounds", rounds=args.rounds, sessions_per_round=args.sessions, start_mb=start, after_warmup_mb=warm,
         after_each_round_mb=after, growth_after_warmup_mb=round(max(after) - warm, 1))


if __name__ == "__main__":
    main()
