"""Headless Chromium for the HTML timeline's tests: screenshots, and a page's behaviour.

Screenshots use Chromium's own ``--screenshot``. What a page does (requests it
makes, console messages, exceptions, dialogs, the DOM after load) comes from
the DevTools protocol: Chromium starts with ``--remote-debugging-port=0``,
writes the port it chose to ``DevToolsActivePort`` in its profile folder, and
a small websocket client (below, stdlib only) drives one page. That is exact
where parsing ``--enable-logging`` output is not: every request the page
makes is a ``Network.requestWillBeSent`` event, blocked ones included.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]


def screenshot(page: Path, out: Path, size: tuple[int, int] = (1400, 800)) -> Path:
    """Render ``page`` and save a PNG of the window at ``size``."""
    assert CHROMIUM is not None
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run(
            [
                CHROMIUM,
                *_FLAGS,
                f"--user-data-dir={profile}",
                f"--screenshot={out}",
                f"--window-size={size[0]},{size[1]}",
                page.resolve().as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert out.exists(), f"chromium wrote no screenshot (exit {proc.returncode}): {proc.stderr}"
    return out


class _Socket:
    """Just enough of RFC 6455 for one DevTools session: text frames, masked sends."""

    def __init__(self, url: str) -> None:
        assert url.startswith("ws://")
        hostport, _, path = url[5:].partition("/")
        host, _, port = hostport.partition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            (
                f"GET /{path} HTTP/1.1\r\nHost: {hostport}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                "Sec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            assert chunk, "devtools closed the connection during the handshake"
            head += chunk
        assert head.startswith(b"HTTP/1.1 101"), head[:200]
        self.buf = head.split(b"\r\n\r\n", 1)[1]

    def _read(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.sock.recv(1 << 20)
            assert chunk, "devtools closed the connection"
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def send(self, text: str) -> None:
        data = text.encode()
        mask = os.urandom(4)
        n = len(data)
        if n < 126:
            head = struct.pack("!BB", 0x81, 0x80 | n)
        elif n < 1 << 16:
            head = struct.pack("!BBH", 0x81, 0x80 | 126, n)
        else:
            head = struct.pack("!BBQ", 0x81, 0x80 | 127, n)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
        self.sock.sendall(head + mask + masked)

    def recv(self) -> str:
        message = b""
        while True:
            b0, b1 = self._read(2)
            n = b1 & 0x7F
            if n == 126:
                (n,) = struct.unpack("!H", self._read(2))
            elif n == 127:
                (n,) = struct.unpack("!Q", self._read(8))
            payload = self._read(n)
            opcode = b0 & 0x0F
            if opcode == 0x8:
                raise ConnectionError("devtools closed the websocket")
            if opcode in (0x9, 0xA):  # ping, pong: not part of a message
                continue
            message += payload
            if b0 & 0x80:
                return message.decode()


class Page:
    """One page of a headless Chromium, driven through the DevTools protocol."""

    def __init__(self) -> None:
        assert CHROMIUM is not None
        self._profile = tempfile.mkdtemp(prefix="rt-chromium-")
        self.proc = subprocess.Popen(
            [
                CHROMIUM,
                *_FLAGS,
                f"--user-data-dir={self._profile}",
                "--remote-debugging-port=0",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        port_file = Path(self._profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            assert time.monotonic() < deadline, "chromium did not open its devtools port"
            assert self.proc.poll() is None, "chromium exited at start"
            time.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30) as r:
            targets = json.load(r)
        url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
        self.ws = _Socket(url)
        self.events: list[dict[str, Any]] = []
        self._id = 0
        for domain in ("Page", "Network", "Runtime", "Log"):
            self.call(f"{domain}.enable")

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._id += 1
        mine = self._id
        self.ws.send(json.dumps({"id": mine, "method": method, "params": params}))
        while True:
            msg = self._next()
            if msg.get("id") == mine:
                assert "error" not in msg, msg["error"]
                result: dict[str, Any] = msg["result"]
                return result

    def wait_for(self, method: str, timeout: float = 30) -> dict[str, Any]:
        seen = next((e for e in self.events if e.get("method") == method), None)
        self.ws.sock.settimeout(timeout)
        while seen is None:
            msg = self._next()
            if msg.get("method") == method:
                seen = msg
        return seen

    def _next(self) -> dict[str, Any]:
        msg: dict[str, Any] = json.loads(self.ws.recv())
        if "method" in msg:
            self.events.append(msg)
        if msg.get("method") == "Page.javascriptDialogOpening":
            # An alert() blocks the page until answered; answer it and go on,
            # the event stays recorded as a problem.
            self._id += 1
            self.ws.send(
                json.dumps(
                    {
                        "id": self._id,
                        "method": "Page.handleJavaScriptDialog",
                        "params": {"accept": True},
                    }
                )
            )
        return msg

    def load(self, page: Path) -> None:
        self.events.clear()
        self.call("Page.navigate", url=page.resolve().as_uri())
        self.wait_for("Page.loadEventFired")
        # Let anything the page set off in onload run and report.
        self.evaluate("new Promise(r => setTimeout(r, 200))")

    def evaluate(self, expression: str) -> Any:
        out = self.call("Runtime.evaluate", expression=expression, awaitPromise=True)
        return out["result"].get("value")

    def requests(self) -> list[str]:
        return [
            e["params"]["request"]["url"]
            for e in self.events
            if e.get("method") == "Network.requestWillBeSent"
        ]

    def problems(self) -> list[str]:
        """Console errors and warnings, uncaught exceptions, log errors, dialogs."""
        out = []
        for e in self.events:
            method, params = e.get("method"), e.get("params", {})
            if method == "Runtime.consoleAPICalled" and params["type"] in ("error", "warning"):
                out.append(f"console.{params['type']}: {params['args']}")
            elif method == "Runtime.exceptionThrown":
                out.append(f"exception: {params['exceptionDetails']}")
            elif method == "Log.entryAdded" and params["entry"]["level"] in ("error", "warning"):
                out.append(f"log {params['entry']['level']}: {params['entry']['text']}")
            elif method == "Page.javascriptDialogOpening":
                out.append(f"dialog: {params['message']}")
        return out

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.ws.sock.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self._profile, ignore_errors=True)
