"""Headless Chromium driven over the DevTools protocol on a pipe, with no extra package.

``chromium --remote-debugging-pipe`` reads protocol commands from its file descriptor 3 and
writes answers and events to 4, each a JSON text ended by a NUL byte (how Playwright and
Puppeteer talk to it). That is enough to open a page at a given viewport (a phone's
included), wait until it says it is ready, and evaluate JavaScript in it: read the numbers
it shows, measure its layout, collect what it wrote to the console.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from typing import Any

NAMES = ("chromium", "chromium-browser", "google-chrome")


def find_browser() -> str | None:
    return next((found for name in NAMES if (found := shutil.which(name))), None)


class ProtocolError(RuntimeError):
    """The browser answered a command with an error, or not in time."""


class Browser:
    """One headless Chromium; :meth:`page` opens a tab at a viewport."""

    def __init__(self, binary: str) -> None:
        self._profile = tempfile.TemporaryDirectory(prefix="parsearch-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def fds() -> None:  # in the child: the protocol's descriptors are 3 and 4
            high_r, high_w = os.dup(to_browser_r), os.dup(from_browser_w)
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)

        self.process = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--no-first-run", "--no-default-browser-check", "--remote-debugging-pipe",
             f"--user-data-dir={self._profile.name}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            preexec_fn=fds, close_fds=False,
        )  # fmt: skip
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout_s: float = 60.0) -> dict[str, Any]:  # fmt: skip
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout_s
        while True:
            answer = self._receive(deadline, method)
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise ProtocolError(f"{method}: {answer['error']}")
                return answer.get("result", {})
            self.events.append(answer)

    def _receive(self, deadline: float, waiting_for: str) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or self.process.poll() is not None:
                raise ProtocolError(f"no answer to {waiting_for} (browser {self.process.poll()})")
            ready, _, _ = select.select([self._from_browser], [], [], left)
            if ready:
                chunk = os.read(self._from_browser, 1 << 20)
                if not chunk:
                    raise ProtocolError(f"the browser closed the pipe during {waiting_for}")
                self._buffer += chunk
        text, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(text)

    @contextlib.contextmanager
    def page(self, url: str, width: int, height: int, *, mobile: bool = False,
             ready: str = "document.body.dataset.state === 'ready'",
             timeout_s: float = 60.0) -> Iterator[Page]:  # fmt: skip
        """A tab of ``width`` x ``height`` CSS pixels (``mobile``: a phone's viewport, which
        honours the page's ``<meta name=viewport>``) showing ``url`` once ``ready`` is true."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        page = Page(self, session)
        try:
            page.send("Runtime.enable")
            page.send("Emulation.setDeviceMetricsOverride",
                      {"width": width, "height": height, "deviceScaleFactor": 1,
                       "mobile": mobile})  # fmt: skip
            page.send("Page.navigate", {"url": url})
            page.wait_for(ready, timeout_s)
            yield page
        finally:
            with contextlib.suppress(ProtocolError):
                self.send("Target.closeTarget", {"targetId": target})

    def close(self) -> None:
        with contextlib.suppress(ProtocolError, OSError):
            self.send("Browser.close", timeout_s=5)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process.stderr.close()
        for fd in (self._to_browser, self._from_browser):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._profile.cleanup()


class Page:
    """A tab: evaluate JavaScript, read what its console got."""

    def __init__(self, browser: Browser, session: str) -> None:
        self.browser = browser
        self.session = session

    def send(self, method: str, params: dict | None = None) -> dict[str, Any]:
        return self.browser.send(method, params, self.session)

    def evaluate(self, expression: str) -> Any:
        """The value of ``expression`` (awaited when it is a promise), as JSON data."""
        found = self.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in found:
            raise ProtocolError(f"{expression[:80]}: {found['exceptionDetails']}")
        return found["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.evaluate(f"(() => {{ try {{ return !!({expression}); }} "
                                "catch (e) { return false; } })()"):  # fmt: skip
            if time.monotonic() > deadline:
                body = self.evaluate("document.body ? document.body.outerHTML.slice(0, 2000) : ''")
                raise ProtocolError(f"the page never got {expression!r}: {body}")
            time.sleep(0.1)

    def screenshot(self, path: str) -> None:
        """The whole page as a PNG (for a person looking into a failure)."""
        import base64

        height = self.evaluate("document.documentElement.scrollHeight")
        width = self.evaluate("document.documentElement.scrollWidth")
        shot = self.send("Page.captureScreenshot", {
            "format": "png", "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}})  # fmt: skip
        with open(path, "wb") as out:
            out.write(base64.b64decode(shot["data"]))

    def console(self) -> list[str]:
        """What the page wrote to its console, and its uncaught exceptions."""
        lines = []
        for event in self.browser.events:
            if event.get("sessionId") != self.session:
                continue
            if event.get("method") == "Runtime.consoleAPICalled":
                params = event["params"]
                args = " ".join(str(a.get("value", a.get("description"))) for a in params["args"])
                lines.append(f"{params['type']}: {args}")
            elif event.get("method") == "Runtime.exceptionThrown":
                lines.append(f"exception: {event['params']['exceptionDetails']}")
        return lines


@contextlib.contextmanager
def browser(binary: str) -> Iterator[Browser]:
    opened = Browser(binary)
    try:
        yield opened
    finally:
        opened.close()
