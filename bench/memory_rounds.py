"""Does memory come back after sessions end? Rounds of sessions through the app's own handlers.

Each round creates N sessions that train a tiny model, step the default model 5 times and generate,
then ends them (the app's cleanup) and collects garbage; RSS is printed after a one-session warm-up
and after every round. A leak shows as growth from round to round; one-time costs (imports, kernel
set-up, the heap's high-water mark) show once, in the warm-up.

    python bench/memory_rounds.py [--rounds 4] [--sessions 20]
"""

from __future__ import annotations

import argparse
import gc

from common import emit


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return float("nan")


def one_round(app, n: int) -> None:
    from model.session import Workspace

    sessions = []
    for i in range(n):
        ws = Workspace()
        list(app.train_model(ws, "sort", "", None, "char", 1, 2, 32, 64, "learned", "pre", "gelu", 0.0, 20, 3e-3, i))
        for _ in range(5):
            app.step(ws, app.DEFAULT_MODEL, "anna found the key . she", 0.8, 0, 1.0, i, 0, "all", "weights")
        list(app.generate(ws, app.DEFAULT_MODEL, "tom found the map .", 0.8, 0, 1.0, i, 5, 0, "all", "weights"))
        sessions.append(ws)
    for ws in sessions:
        app.cleanup_session(ws)
    del sessions
    gc.collect()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--sessions", type=int, default=20)
    args = p.parse_args()
    import app

    app.BUILTIN.get(app.DEFAULT_MODEL)
    start = rss_mb()
    one_round(app, 1)
    warm = rss_mb()
    after = []
    for _ in range(args.rounds):
        one_round(app, args.sessions)
        after.append(round(rss_mb(), 1))
    emit("memory_rounds", sessions_per_round=args.sessions, start_mb=round(start, 1), after_warmup_mb=round(warm, 1),
         after_each_round_mb=after, growth_after_warmup_mb=round(max(after) - warm, 1))


if __name__ == "__main__":
    main()
