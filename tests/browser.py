"""A real headless Chromium for tests: open a page as a person would, read its text, screenshot it.

Debian's ``chromium`` runs with ``--headless`` and a private profile in a temp folder; the
test talks to it over the Chrome DevTools Protocol (a websocket, through aiohttp, which
Ray already needs). A cookie can be set before the page loads: that is how the Ray
dashboard's token login keeps a browser signed in (cookie ``ray-authentication-token``).
The browser is stopped by its own handle; its profile folder is removed.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from tests.services import require, stop_process


class Chromium:
    def __init__(self, width: int = 1280, height: int = 800) -> None:
        binary = require("chromium")
        self.profile = tempfile.mkdtemp(prefix="pgchrome-", dir="/tmp")
        self.width, self.height = width, height
        self.proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-dev-shm-usage",
             "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0", f"--user-data-dir={self.profile}",
             f"--window-size={width},{height}", "--hide-scrollbars", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.port = self._debugging_port()
        self._ids = itertools.count(1)

    def _debugging_port(self, timeout: float = 30) -> int:
        marker = Path(self.profile) / "DevToolsActivePort"  # Chromium writes its chosen port here
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                break
            if marker.is_file() and marker.read_text().strip():
                return int(marker.read_text().split()[0])
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("chromium did not start its DevTools endpoint")

    def _page_socket(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/list", timeout=10) as resp:
            pages = [t for t in json.load(resp) if t["type"] == "page"]
        return pages[0]["webSocketDebuggerUrl"]

    def capture(
        self,
        url: str,
        expect: list[str],
        png: Path | None = None,
        cookies: list[dict] | None = None,
        timeout: float = 60,
        settle_s: float = 3.0,
        type_into: dict[str, str] | None = None,
    ) -> str:
        """Open ``url`` (after setting ``cookies``), type into the page's text fields (``type_into``:
        ``{field label: text}``, keystrokes as a person's, once the field is there), wait until the
        page's visible text holds every string in ``expect``, then ``settle_s`` more (charts draw
        after their data arrives), save a PNG of the viewport to ``png``; return the page's text."""
        return asyncio.run(self._capture(url, expect, png, cookies or [], timeout, settle_s, type_into or {}))

    async def _capture(self, url, expect, png, cookies, timeout, settle_s, type_into) -> str:
        import aiohttp

        async with aiohttp.ClientSession() as http, http.ws_connect(self._page_socket(), max_msg_size=0) as ws:

            async def call(method: str, **params):
                ident = next(self._ids)
                await ws.send_json({"id": ident, "method": method, "params": params})
                async for msg in ws:
                    data = json.loads(msg.data)
                    if data.get("id") == ident:
                        if "error" in data:
                            raise RuntimeError(f"{method}: {data['error']}")
                        return data.get("result", {})
                raise RuntimeError("the browser closed the connection")

            await call("Network.enable")
            for cookie in cookies:
                await call("Network.setCookie", **cookie)
            await call("Emulation.setDeviceMetricsOverride", width=self.width, height=self.height,
                       deviceScaleFactor=1, mobile=False)  # fmt: skip
            await call("Page.enable")
            # A fresh load each time: navigating to the same page with a new #route would keep
            # a single-page app's state (an open login dialog) from the last capture.
            await call("Page.navigate", url="about:blank")
            await call("Page.navigate", url=url)
            deadline, text = time.time() + timeout, ""
            for label, typed in type_into.items():
                # The input of the field whose <label> reads ``label`` (Material UI's text fields).
                focus = (
                    "(() => { const l = [...document.querySelectorAll('label')]"
                    f".find(l => l.textContent.trim() === {json.dumps(label)});"
                    " const i = l && l.parentElement.querySelector('input');"
                    " if (!i) return false; i.focus(); return document.activeElement === i; })()"
                )
                while not (await call("Runtime.evaluate", expression=focus, returnByValue=True))["result"]["value"]:
                    if time.time() > deadline:
                        raise AssertionError(f"{url}: no text field labelled {label!r}")
                    await asyncio.sleep(0.5)
                await call("Input.insertText", text=typed)
            while time.time() < deadline:
                result = await call("Runtime.evaluate", expression="document.body ? document.body.innerText : ''",
                                    returnByValue=True)  # fmt: skip
                text = result.get("result", {}).get("value", "") or ""
                if all(s in text for s in expect):
                    break
                await asyncio.sleep(0.5)
            else:
                raise AssertionError(f"{url}: page never showed {expect}; it shows:\n{text[:2000]}")
            await asyncio.sleep(settle_s)
            if png is not None:
                shot = await call("Page.captureScreenshot", format="png")
                Path(png).write_bytes(base64.b64decode(shot["data"]))
            return text

    def stop(self) -> None:
        stop_process(self.proc)
        shutil.rmtree(self.profile, ignore_errors=True)
