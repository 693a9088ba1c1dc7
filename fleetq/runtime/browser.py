"""A headless Chromium for reading what the Temporal Web UI really renders.

The job's details are Markdown the UI's server renders into iframes styled by a page we
do not control, so only a browser shows whether a table is legible (tests/webui).
``chromium --screenshot`` never returns on the UI's long polls, so the browser is driven
over its DevTools protocol (``--remote-debugging-port=0``, the port read from
``DevToolsActivePort``; one aiohttp websocket per page; ``Page.navigate``,
``Runtime.evaluate``). Chromium is Debian's ``chromium``: :func:`build` (``fleetq webui
build``) installs it with ``apt-get`` when missing and root; ``FLEETQ_CHROMIUM`` names
another binary.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp

#: Debian's package (bookworm's security updates carry 156.x)
CHROMIUM_PACKAGE = "chromium"
CHROMIUM_ENV = "FLEETQ_CHROMIUM"
#: what to run when it is missing (tests fail with this line, they do not skip)
BUILD_HINT = "fleetq webui build (as root: apt-get install -y chromium)"

Progress = Callable[[str], None]


class BrowserError(RuntimeError):
    """No browser, or it did not answer; the message is one line for the user."""


def chromium_path() -> Path | None:
    """The Chromium binary: ``$FLEETQ_CHROMIUM``, else ``chromium`` (Debian) or
    ``chromium-browser`` on PATH; None when there is none."""
    env = os.environ.get(CHROMIUM_ENV)
    if env:
        return Path(env) if os.access(env, os.X_OK) else None
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return Path(found)
    return None


def chromium_version(binary: Path) -> str:
    """``Chromium 156.0.8078.114 ...`` as the binary prints it."""
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True,
                         timeout=60, check=False)
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) \
        else "unknown version"


def _apt(argv: list[str], log: Path) -> None:
    with open(log, "ab") as fh:
        fh.write(("$ " + " ".join(argv) + "\n").encode())
        fh.flush()
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        proc = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, env=env,
                              check=False)
    if proc.returncode != 0:
        tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-2:])
        raise BrowserError(f"{' '.join(argv[:2])} failed: {tail} (log: {log})")


def build(progress: Progress | None = None, log: Path | None = None) -> Path:
    """The Chromium binary, installed from Debian's packages first when missing (as
    root; ``apt-get update`` once if the package lists do not have it). Idempotent."""
    say = progress or (lambda _msg: None)
    found = chromium_path()
    if found is not None:
        return found
    if os.environ.get(CHROMIUM_ENV):
        raise BrowserError(f"{CHROMIUM_ENV}={os.environ[CHROMIUM_ENV]} is not an executable")
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        raise BrowserError(f"no Chromium installed: install Debian's {CHROMIUM_PACKAGE} "
                           f"package (as root: apt-get install -y {CHROMIUM_PACKAGE})")
    log = log or Path(tempfile.gettempdir()) / "fleetq-chromium-install.log"
    say(f"no Chromium installed: apt-get install {CHROMIUM_PACKAGE} (log: {log})")
    install = [apt, "install", "-y", "--no-install-recommends", CHROMIUM_PACKAGE]
    try:
        _apt(install, log)
    except BrowserError:
        _apt([apt, "update"], log)
        _apt(install, log)
    found = chromium_path()
    if found is None:
        raise BrowserError(f"apt-get installed {CHROMIUM_PACKAGE} but no chromium is on "
                           f"PATH (log: {log})")
    return found


class Page:
    """One browser tab over its DevTools websocket: ``navigate``, ``evaluate``,
    ``wait_for`` (a JavaScript condition, polled)."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._ids = itertools.count(1)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one DevTools command and return its result (events are skipped)."""
        call_id = next(self._ids)
        await self._ws.send_json({"id": call_id, "method": method, "params": params})
        while True:
            msg = await self._ws.receive()
            if msg.type != aiohttp.WSMsgType.TEXT:
                raise BrowserError(f"Chromium closed the DevTools connection ({msg.type.name})")
            data = msg.json()
            if data.get("id") == call_id:
                if "error" in data:
                    raise BrowserError(f"{method}: {data['error'].get('message')}")
                result: dict[str, Any] = data.get("result") or {}
                return result

    async def navigate(self, url: str) -> None:
        await self.call("Page.navigate", url=url)

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-able values)."""
        out = await self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                              awaitPromise=True)
        if "exceptionDetails" in out:
            detail = out["exceptionDetails"]
            text = (detail.get("exception") or {}).get("description") or detail.get("text")
            raise BrowserError(f"JavaScript error: {text}")
        return (out.get("result") or {}).get("value")

    async def wait_for(self, expression: str, timeout: float, what: str) -> Any:
        """Poll ``expression`` until it is truthy; returns its value. BrowserError naming
        ``what`` and the last value after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        value: Any = None
        while time.monotonic() < deadline:
            value = await self.evaluate(expression)
            if value:
                return value
            await asyncio.sleep(0.25)
        raise BrowserError(f"timed out after {timeout:.0f}s waiting for {what} (last: {value!r})")


class Chromium:
    """A headless Chromium of our own (its own profile directory, removed on stop);
    ``async with Chromium() as browser: async with browser.page() as page: ...``."""

    def __init__(self, binary: Path | None = None) -> None:
        self.binary = binary or chromium_path()
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self._profile: Path | None = None
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Chromium:
        await self.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.stop()

    async def start(self, timeout: float = 60.0) -> None:
        if self.binary is None:
            raise BrowserError(f"no Chromium installed: run {BUILD_HINT}")
        self._profile = Path(tempfile.mkdtemp(prefix="fleetq-chromium-"))
        argv = [
            str(self.binary), "--headless=new", "--disable-gpu", "--no-first-run",
            "--no-default-browser-check", "--disable-extensions", "--mute-audio",
            "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
            f"--user-data-dir={self._profile}", "--window-size=1280,1000",
        ]
        if os.geteuid() == 0:
            argv.append("--no-sandbox")  # Chromium refuses to run its sandbox as root
        log = open(self._profile / "chromium.log", "wb")  # noqa: SIM115 - kept by Popen
        self.proc = subprocess.Popen([*argv, "about:blank"], stdout=log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        active = self._profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while not self.port:
            if self.proc.poll() is not None:
                raise BrowserError(f"Chromium exited with code {self.proc.returncode}: "
                                   f"{self._log_tail()}")
            if time.monotonic() > deadline:
                raise BrowserError(f"Chromium did not open its DevTools port within "
                                   f"{timeout:.0f}s: {self._log_tail()}")
            with contextlib.suppress(OSError, ValueError, IndexError):
                self.port = int(active.read_text().splitlines()[0])
            if not self.port:
                await asyncio.sleep(0.1)
        self._session = aiohttp.ClientSession()

    def _log_tail(self) -> str:
        if self._profile is None:
            return ""
        with contextlib.suppress(OSError):
            lines = (self._profile / "chromium.log").read_text(errors="replace").splitlines()
            return " | ".join(lines[-3:])
        return ""

    @contextlib.asynccontextmanager
    async def page(self) -> AsyncIterator[Page]:
        """A new tab, closed afterwards."""
        if self._session is None:
            raise BrowserError("Chromium is not started")
        base = f"http://127.0.0.1:{self.port}"
        async with self._session.put(f"{base}/json/new?about:blank") as resp:
            target = await resp.json()
        try:
            async with self._session.ws_connect(target["webSocketDebuggerUrl"],
                                                max_msg_size=0) as ws:
                yield Page(ws)
        finally:
            with contextlib.suppress(aiohttp.ClientError):
                async with self._session.get(f"{base}/json/close/{target['id']}"):
                    pass

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                await asyncio.to_thread(self.proc.wait, 10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                await asyncio.to_thread(self.proc.wait)
        self.proc = None
        if self._profile is not None:
            shutil.rmtree(self._profile, ignore_errors=True)
            self._profile = None


# ------------------------------------------------------------------ the Web UI, read

#: every Markdown frame of a workflow's "User Metadata" tab (summary, details, current
#: details, in page order): the heading above it, its text, and each table as rows of
#: cell texts plus, per row, the horizontal gap in CSS pixels between one cell's visible
#: text and the next one's
_READ_FRAMES = r"""(() => {
  const visible = (cell) => {
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    let first = null, last = null, end = 0, node;
    while ((node = walker.nextNode())) {
      const m = node.data.match(/\S(?=\s*$)/);
      const i = node.data.search(/\S/);
      if (i >= 0 && first === null) first = [node, i];
      if (m) { last = node; end = m.index + 1; }
    }
    if (first === null) return null;
    const r = cell.ownerDocument.createRange();
    r.setStart(first[0], first[1]); r.setEnd(last, end);
    const b = r.getBoundingClientRect();
    return [b.left, b.right];
  };
  const frames = [...document.querySelectorAll('iframe')]
    .filter((f) => (f.src || '').includes('/render?'));
  return frames.map((f) => {
    const doc = f.contentDocument;
    const main = doc && doc.querySelector('main');
    if (!main) return null;
    const tables = [...main.querySelectorAll('table')].map((t) => ({
      rows: [...t.rows].map((tr) => [...tr.cells].map((c) => c.innerText.trim())),
      gaps: [...t.rows].map((tr) => {
        const boxes = [...tr.cells].map(visible);
        const out = [];
        for (let i = 0; i + 1 < boxes.length; i++) {
          if (boxes[i] && boxes[i + 1]) out.push(Math.round(boxes[i + 1][0] - boxes[i][1]));
        }
        return out;
      }),
    }));
    let el = f, title = '';
    while (el && !title) {
      el = el.parentElement;
      const h = el && el.querySelector('h1, h2, h3, h4');
      if (h) title = h.innerText.trim();
    }
    return {title, text: main.innerText, html: main.innerHTML, tables};
  });
})()"""


async def user_metadata(page: Page, ui_url: str, workflow_id: str, *,
                        namespace: str = "default", timeout: float = 60.0,
                        ready: Callable[[list[dict[str, Any]]], bool] | None = None,
                        ) -> list[dict[str, Any]]:
    """What the Web UI shows in a workflow's "User Metadata" tab: one dict per Markdown
    frame (summary, details, current details), with ``title`` (its heading), ``text``,
    ``html`` and ``tables``
    (``rows`` of cell texts, ``gaps`` between cells in pixels). Loads the workflow's page,
    opens the tab, waits until every frame has rendered and ``ready(frames)`` holds
    (default: any frame)."""
    from urllib.parse import quote

    await page.navigate(f"{ui_url.rstrip('/')}/namespaces/{quote(namespace, safe='')}"
                        f"/workflows/{quote(workflow_id, safe='')}")
    # the page redirects to the latest run's timeline; the tab links to .../user-metadata
    href = await page.wait_for(
        "(() => { const a = document.querySelector('#user-metadata-tab');"
        " return a && a.getAttribute('href'); })()", timeout, "the User Metadata tab")
    await page.navigate(f"{ui_url.rstrip('/')}{href}")
    deadline = time.monotonic() + timeout
    frames: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        got = await page.evaluate(_READ_FRAMES) or []
        frames = [f for f in got if f]
        if frames and len(frames) == len(got) and (ready is None or ready(frames)):
            return frames
        await asyncio.sleep(0.25)
    raise BrowserError(f"timed out after {timeout:.0f}s waiting for the User Metadata of "
                       f"{workflow_id} (frames: {[f.get('text', '')[:60] for f in frames]})")
