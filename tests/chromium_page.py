"""Headless Chromium for the tests that load teller's HTML pages: one run per page with a fresh
profile and the network cut off, the console errors it logged, and the dumped DOM as elements.

Needs Debian's chromium (`apt-get update && apt-get install -y chromium`); callers skip without it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--host-resolver-rules=MAP * ~NOTFOUND",  # no name resolves: nothing can be fetched
    "--enable-logging=stderr",
    "--v=0",
    "--window-size=1280,2400",
]
CONSOLE_ERROR = re.compile(r"ERROR:CONSOLE|Uncaught|:CONSOLE\(\d+\)\].*error", re.IGNORECASE)
CHROMIUM_TIMEOUT_S = 90


def chromium(page: Path, tmp_path: Path, *action: str) -> tuple[str, str]:
    """Run headless Chromium once on a file:// page with a fresh profile: (stdout, stderr)."""
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"
    done = subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *action, page.resolve().as_uri()],
        capture_output=True,
        text=True,
        timeout=CHROMIUM_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, done.stderr


def console_errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if CONSOLE_ERROR.search(line)]


class Dom(HTMLParser):
    """Elements of the dumped DOM as (tag, attributes, text inside up to the next tag)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str], str]] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, {k: v or "" for k, v in attrs}, ""))

    def handle_data(self, data):
        if self.elements:
            tag, attrs, text = self.elements[-1]
            self.elements[-1] = (tag, attrs, text + data)

    def find(self, tag: str | None = None, id: str | None = None, cls: str | None = None):
        return [
            e
            for e in self.elements
            if (tag is None or e[0] == tag)
            and (id is None or e[1].get("id") == id)
            and (cls is None or cls in e[1].get("class", "").split())
        ]
