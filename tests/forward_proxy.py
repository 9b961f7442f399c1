"""A forward HTTP proxy for the tests, on 127.0.0.1: it records each request it
forwards (``requests``: method, target, headers), passes a request in
absolute form (``POST http://host:port/path``) on to its host, and opens a
tunnel for ``CONNECT host:port`` (the way to an https:// server).
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

__all__ = ["Forwarded", "Proxy"]

# Headers about one connection, which a proxy does not pass on.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)


@dataclass
class Forwarded:
    method: str
    target: str  # the absolute URL, or host:port for a CONNECT
    headers: dict[str, str]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy
        self.sockets: set[socket.socket] = set()
        super().__init__(("127.0.0.1", 0), _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a connection cut by the client or by down()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _record(self) -> None:
        proxy = self.server.proxy
        with proxy.lock:
            proxy.requests.append(Forwarded(self.command, self.path, dict(self.headers.items())))

    def do_POST(self) -> None:
        self._record()
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        target = urlsplit(self.path)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        upstream = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
        try:
            path = target.path + (f"?{target.query}" if target.query else "")
            upstream.request("POST", path, body=body, headers=headers)
            answer = upstream.getresponse()
            payload = answer.read()
        finally:
            upstream.close()
        self.send_response(answer.status, answer.reason)
        for name, value in answer.getheaders():
            if name.lower() not in _HOP_BY_HOP | {"content-length", "server", "date"}:
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_CONNECT(self) -> None:
        self._record()
        host, _, port = self.path.rpartition(":")
        upstream = socket.create_connection((host, int(port)), timeout=30)
        upstream.settimeout(None)
        with self.server.proxy.lock:
            self.server.sockets.add(upstream)
        self.send_response(200, "Connection established")
        self.end_headers()
        self.close_connection = True
        back = threading.Thread(target=_pipe, args=(upstream, self.connection), daemon=True)
        back.start()
        _pipe(self.connection, upstream)
        back.join()
        upstream.close()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    """Copy ``source`` to ``sink`` until it ends, then end ``sink`` too."""
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


class Proxy:
    """A forward proxy on 127.0.0.1; a context manager that starts and stops it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: list[Forwarded] = []
        self._server = _Server(self)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> Proxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
        with self.lock:
            tunnels = list(self._server.sockets)
        for sock in tunnels:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
