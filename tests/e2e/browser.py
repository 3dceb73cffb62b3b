"""Headless Debian Chromium driven over the DevTools protocol (CDP), just enough for one UI check.

Airflow 3's trigger form is a dialog opened by a button on the DAG page, so a
plain ``--dump-dom`` cannot reach it: the test loads the page, clicks the
button and reads the dialog's text. CDP needs nothing but Chromium and a
websocket client (``websockets``, which Airflow's api-server already depends on).
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from orchestrator.app.demo.localdb import free_port
from tests.e2e.stack import wait_for

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "chromium", "chromium-browser")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
    "--window-size=1400,1000",
)


def find_chromium() -> str | None:
    for candidate in CHROMIUM_CANDIDATES:
        found = shutil.which(candidate)
        if found:
            return found
    return None


class Page:
    """One browser tab: navigate, evaluate JavaScript, take screenshots."""

    def __init__(self, socket: Any) -> None:
        self.socket = socket
        self.next_id = 0

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        self.socket.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:  # skip events until our answer arrives
            message = json.loads(self.socket.recv(timeout=60))
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"CDP {method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result.get("result", {}).get("value")

    def goto(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def click(self, selector: str) -> None:
        """A real mouse click on the first element matching the CSS ``selector``."""
        self.click_element(f"document.querySelector({json.dumps(selector)})", selector)

    def click_element(self, element: str, what: str) -> None:
        """A real mouse click (press and release) at the middle of the element ``element``
        evaluates to.

        Real input events rather than ``element.click()``: menus such as the
        trigger form's multi-select open on ``mousedown``, which a scripted click never sends.
        """
        box = self.evaluate(
            f"(() => {{ const e = {element}; if (!e) return null;"
            " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
            " return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        if box is None:
            raise LookupError(f"no element for {what}")
        x, y = box
        for event in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=event, x=x, y=y, button="left", clickCount=1)

    def type_into(self, selector: str, text: str) -> None:
        """Focus the element matching ``selector`` and type ``text`` as keyboard input would."""
        if not self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " if (!e) return false; e.focus(); return true; })()"
        ):
            raise LookupError(f"no element matches {selector!r}")
        self.call("Input.insertText", text=text)

    def press(self, key: str, code: str, key_code: int) -> None:
        """One key stroke (down and up) to the focused element, e.g.
        ``press("Enter", "Enter", 13)``."""
        for event in ("keyDown", "keyUp"):
            self.call(
                "Input.dispatchKeyEvent",
                type=event,
                key=key,
                code=code,
                windowsVirtualKeyCode=key_code,
            )

    def screenshot(self, path: Path) -> None:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))


@contextmanager
def chromium_page(binary: str, timeout: float = 60) -> Iterator[Page]:
    """A headless Chromium with one tab, killed on exit."""
    from websockets.sync.client import connect

    port = free_port()
    profile = tempfile.mkdtemp(prefix="tidemark-chromium-")
    process = subprocess.Popen(
        [
            binary,
            *FLAGS,
            f"--user-data-dir={profile}",
            f"--remote-debugging-port={port}",
            "--remote-allow-origins=*",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:

        def page_socket() -> str | None:
            if process.poll() is not None:
                raise RuntimeError(f"chromium exited with {process.returncode}")
            targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=5).json()
            pages = [t for t in targets if t.get("type") == "page"]
            return str(pages[0]["webSocketDebuggerUrl"]) if pages else None

        url = wait_for("chromium's DevTools endpoint", page_socket, timeout=timeout, interval=0.5)
        with connect(url, max_size=None, open_timeout=timeout) as socket:
            page = Page(socket)
            page.call("Page.enable")
            page.call("Runtime.enable")
            yield page
    finally:
        process.kill()
        process.wait(10)
        shutil.rmtree(profile, ignore_errors=True)


def wait_for_js(page: Page, what: str, expression: str, timeout: float = 90) -> Any:
    """Evaluate ``expression`` until it is truthy; returns its value."""

    def probe() -> Any:
        value = page.evaluate(expression)
        return value or None

    return wait_for(what, probe, timeout=timeout, interval=0.5)
