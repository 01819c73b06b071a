"""Open a page in headless Chromium and report what a person would see go wrong: images that did not load
and console errors / uncaught exceptions. Talks the DevTools protocol over a websocket (aiohttp)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "chrome")


def find_chromium() -> str | None:
    env = os.environ.get("CHROMIUM")
    if env:
        return env
    return next((p for p in map(shutil.which, CANDIDATES) if p), None)


IMAGES_JS = (
    "JSON.stringify(Array.from(document.images).map(i => "
    "({alt: i.alt, complete: i.complete, w: i.naturalWidth, h: i.naturalHeight, shown: i.width})))"
)
# what a reader sees laid out: each element with an id, its tag, rendered size and text
IDS_JS = (
    "JSON.stringify(Array.from(document.querySelectorAll('[id]')).map(e => "
    "({id: e.id, tag: e.tagName.toLowerCase(), w: e.getBoundingClientRect().width, "
    "h: e.getBoundingClientRect().height, text: e.innerText.slice(0, 2000)})))"
)


async def _inspect(ws_url: str, url: str, timeout: float, screenshot: Path | None = None) -> dict:
    import aiohttp

    errors: list[str] = []
    async with aiohttp.ClientSession() as session, session.ws_connect(ws_url, max_msg_size=0) as ws:
        ids = iter(range(1, 10_000))
        pending: dict[int, asyncio.Future] = {}
        loaded = asyncio.Event()

        async def reader():
            async for msg in ws:
                data = json.loads(msg.data)
                if "id" in data and data["id"] in pending:
                    pending.pop(data["id"]).set_result(data)
                method = data.get("method", "")
                params = data.get("params", {})
                if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                    errors.append(
                        "console: "
                        + " ".join(str(a.get("value", a.get("description"))) for a in params["args"])
                    )
                elif method == "Runtime.exceptionThrown":
                    errors.append("exception: " + params["exceptionDetails"].get("text", ""))
                elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                    errors.append("log: " + params["entry"].get("text", ""))
                elif method == "Page.loadEventFired":
                    loaded.set()

        async def call(method: str, **params):
            i = next(ids)
            fut = asyncio.get_running_loop().create_future()
            pending[i] = fut
            await ws.send_str(json.dumps({"id": i, "method": method, "params": params}))
            return await asyncio.wait_for(fut, timeout)

        task = asyncio.create_task(reader())
        try:
            for domain in ("Page", "Runtime", "Log"):
                await call(f"{domain}.enable")
            await call("Page.navigate", url=url)
            await asyncio.wait_for(loaded.wait(), timeout)
            await asyncio.sleep(0.3)  # late console messages
            res = await call("Runtime.evaluate", expression=IMAGES_JS, returnByValue=True)
            images = json.loads(res["result"]["result"]["value"])
            res = await call("Runtime.evaluate", expression=IDS_JS, returnByValue=True)
            elements = {e["id"]: e for e in json.loads(res["result"]["result"]["value"])}
            if screenshot is not None:  # the whole page, as a person scrolling it would see it
                res = await call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
                Path(screenshot).write_bytes(base64.b64decode(res["result"]["data"]))
        finally:
            task.cancel()
    return {"images": images, "errors": errors, "ids": elements}


def _end_session(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM to every process of Chromium's session, SIGKILL to what is left after `grace` seconds, and
    return once none is left."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, grace)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(wait)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)


def inspect_page(path: Path, timeout: float = 30.0, screenshot: Path | None = None) -> dict:
    """{'images': [{alt, complete, w, h, shown}], 'errors': [...], 'ids': {id: {tag, w, h, text}}} for the
    page at `path` in headless Chromium; `screenshot`: also save the whole page there as PNG."""
    exe = find_chromium()
    if exe is None:
        raise FileNotFoundError("no chromium")
    # Chromium's helpers (zygote, crashpad, renderers) outlive its main process and write into the profile
    # while they exit: they share its session, and all of them are gone before the profile is removed
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.Popen(
            [
                exe,
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-extensions",
                f"--user-data-dir={profile}",
                "--remote-debugging-port=0",
                "--window-size=1280,900",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            port = None
            deadline = time.monotonic() + timeout
            while port is None and time.monotonic() < deadline:
                line = proc.stderr.readline()
                if not line and proc.poll() is not None:
                    raise RuntimeError(f"chromium exited with {proc.returncode}")
                m = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
                if m:
                    port = int(m.group(1))
            if port is None:
                raise TimeoutError("chromium did not report its DevTools port")
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=timeout) as r:
                targets = json.load(r)
            ws_url = next(t["webSocketDebuggerUrl"] for t in targets if t.get("type") == "page")
            return asyncio.run(_inspect(ws_url, Path(path).resolve().as_uri(), timeout, screenshot))
        finally:
            _end_session(proc)
