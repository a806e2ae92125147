"""Run one command line program many times in one child process: `python -m tests.support.cli_batch MODULE`
reads a JSON list of argument lists on stdin and prints, as JSON, one [exit status, stdout, stderr] for each.

Each run executes MODULE as `python -m MODULE ARGS…` would (runpy, as __main__), with its own stdout and
stderr captured; an exception that escapes it is written to its stderr as Python would print it (a
Traceback), with status 1, so a test that checks "one line, no Traceback" sees the same as from a process of
its own. What it saves is the interpreter and torch starting again for every line (a second or two each).
"""

from __future__ import annotations

import contextlib
import io
import json
import runpy
import sys
import traceback
import warnings


def run_one(module: str, args: list[str]) -> list:
    out, err = io.StringIO(), io.StringIO()
    status = 0
    saved = sys.argv
    sys.argv = [module, *args]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            except SystemExit as exc:
                code = exc.code
                status = code if isinstance(code, int) else (0 if code is None else 1)
                if code is not None and not isinstance(code, int):
                    print(code, file=sys.stderr)
            except BaseException:  # what an uncaught exception does to a real process
                traceback.print_exc()
                status = 1
    finally:
        sys.argv = saved
    return [status, out.getvalue(), err.getvalue()]


def main() -> None:
    module = sys.argv[1]
    # from the second run on, the module is already imported: runpy warns about that, a real process would not
    warnings.filterwarnings("ignore", message=".*found in sys.modules after import of package", category=RuntimeWarning)
    runs = json.load(sys.stdin)
    results = [run_one(module, args) for args in runs]
    sys.__stdout__.write(json.dumps(results))


if __name__ == "__main__":
    main()
