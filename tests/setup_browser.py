"""Make sure Debian's Chromium is installed for the browser tests (never Playwright's download).

Run as `python tests/setup_browser.py`; it installs the `chromium` package with apt-get when
/usr/bin/chromium is missing, and exits non-zero with a clear message when it cannot.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


def main() -> int:
    if os.path.exists(CHROMIUM):
        return 0
    apt = shutil.which("apt-get")
    if apt is None:
        print(f"Browser tests need Chromium at {CHROMIUM}, and apt-get is not available to install it. "
              "Install Chromium and set CHROMIUM=/path/to/chromium.", file=sys.stderr)
        return 1
    prefix = [] if os.geteuid() == 0 else ["sudo", "-n"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "--no-install-recommends", "chromium"]):
        print("+", " ".join(prefix + cmd), flush=True)
        if subprocess.run(prefix + cmd, env=env, stdout=subprocess.DEVNULL).returncode != 0:
            print(f"Could not install Chromium with {' '.join(cmd)} (needs root and access to Debian's "
                  "package mirror). Browser tests cannot run without it.", file=sys.stderr)
            return 1
    if not os.path.exists(CHROMIUM):
        print(f"apt-get finished but {CHROMIUM} is still missing.", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
