"""The report in a real browser: headless Chromium loads RUN_DIR/report/index.html with no console error
and displays every image.

Chromium is driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`: NUL-terminated JSON on
file descriptors 3 and 4), which needs no websocket client and no open port. Where Debian's `chromium` is
not installed the tests say so and are skipped (`.ci/run` installs it before `make test`).
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from observability_synthetic import write_synthetic_run

from rollart.observability import build_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)"),
]
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--remote-debugging-pipe"]
IMAGES_JS = """JSON.stringify(Array.from(document.images).map(i => ({
    alt: i.alt, complete: i.complete, natural: i.naturalWidth, shown: i.getBoundingClientRect().width})))"""


class Chromium:
    """A headless Chromium and one page, spoken to over the DevTools pipe. Every wait is bounded."""

    def __init__(self, profile: Path, timeout_s: float = 60.0) -> None:
        self.timeout_s = timeout_s
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()

        def child_fds() -> None:  # the protocol wants the pipe on fds 3 (commands in) and 4 (replies out)
            r = fcntl.fcntl(to_chrome_r, fcntl.F_DUPFD, 10)
            w = fcntl.fcntl(from_chrome_w, fcntl.F_DUPFD, 10)
            os.dup2(r, 3)
            os.dup2(w, 4)

        self._stderr = (profile / "stderr.log").open("wb")
        self.proc = subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=self._stderr, stderr=self._stderr,
            close_fds=False, preexec_fn=child_fds,
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_chrome], [], [], left)[0]:
                raise TimeoutError(f"chromium sent nothing for {self.timeout_s} s (see {self._stderr.name})")
            chunk = os.read(self._from_chrome, 1 << 20)
            if not chunk:
                raise RuntimeError(f"chromium closed the DevTools pipe (see {self._stderr.name})")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method: str, params: dict[str, Any] | None = None, session: bool = False) -> dict[str, Any]:
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = self.session
        os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout_s
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout_s
        for ev in self.events:
            if ev.get("method") == method:
                return ev
        while True:
            ev = self._read_message(deadline)
            self.events.append(ev)
            if ev.get("method") == method:
                return ev

    def open(self, url: str) -> None:
        for domain in ("Runtime", "Log", "Page"):
            self.call(f"{domain}.enable", session=True)
        self.call("Page.navigate", {"url": url}, session=True)
        self.wait_event("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=True)
        return result["result"]["value"]

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and browser log errors (failed loads, CSP violations)."""
        out = []
        for ev in self.events:
            p = ev.get("params", {})
            if ev.get("method") == "Runtime.exceptionThrown":
                out.append(f"exception: {p['exceptionDetails'].get('text')}")
            elif ev.get("method") == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append(f"console.{p['type']}: {[a.get('value') for a in p.get('args', [])]}")
            elif ev.get("method") == "Log.entryAdded" and p["entry"].get("level") == "error":
                out.append(f"log: {p['entry'].get('text')}")
        return out

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=15)
        os.close(self._to_chrome)
        os.close(self._from_chrome)
        self._stderr.close()


@pytest.fixture
def browser(tmp_path):
    profile = tmp_path / "profile"
    profile.mkdir()
    b = Chromium(profile)
    yield b
    b.close()


def test_report_loads_without_errors_and_shows_every_image(tmp_path, browser):
    run = write_synthetic_run(tmp_path / "run", steps=4)
    report = build_report(run.root)
    browser.open(report.as_uri())
    images = json.loads(browser.evaluate(IMAGES_JS))
    assert browser.errors() == []
    assert [img["alt"] for img in images] == [  # every chart the report draws, in page order
        "validation score per domain", "training reward per domain", "success rate per domain",
        "step-time breakdown", "utilisation per pool", "staleness histogram", "train-inference mismatch KL",
        "importance-weight quantiles", "fraction of tokens truncated or masked", "reset p99 per domain",
        "trajectory Gantt chart", "worker Gantt chart"]
    for img in images:
        assert img["complete"] and img["natural"] > 0 and img["shown"] > 0, img


def test_the_check_catches_a_broken_page(tmp_path, browser):
    """The harness itself can fail: a page with a console error and an undecodable image is caught."""
    page = tmp_path / "broken.html"
    page.write_text('<!DOCTYPE html><html><body><img alt="bad" src="data:image/png;base64,AAAA">'
                    '<script>console.error("boom")</script></body></html>')
    browser.open(page.as_uri())
    images = json.loads(browser.evaluate(IMAGES_JS))
    assert any("boom" in e for e in browser.errors())
    assert images[0]["natural"] == 0
