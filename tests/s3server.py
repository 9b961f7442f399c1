"""A real S3-compatible server for the tests: moto's server mode in a process of
its own (as s3fs's own tests run it), behind a TCP proxy that can refuse
connections, hang, or come back, while the server keeps what it stored.

``S3Server()`` starts a server with a bucket; ``env()`` are the standard
variables an S3 client reads (``AWS_ENDPOINT_URL`` and the credentials), which
the tests set with ``monkeypatch`` or pass to a child process. ``objects()``
lists what is really stored, read through boto's own client (not through the
code under test).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

BUCKET = "traces"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class FaultyProxy:
    """Forwards 127.0.0.1:port to a target; ``down()`` refuses new connections
    and cuts the open ones, ``up()`` listens again on the same port, and
    ``hang = True`` holds every byte until it is set back to False.

    ``delay`` (seconds) holds each piece a client sends that long: a slow
    store, that answers every request, late. ``puts`` (not ``None``) is how
    many more uploads (PUTs) get through; the ones after fail: cut, or
    refused with 403 AccessDenied if ``refuse_puts``."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.port = _free_port()
        self.hang = False
        self.delay = 0.0
        self.puts: int | None = None
        self.refuse_puts = False
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.up()

    def up(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        for _ in range(100):  # the old socket may linger a moment
            try:
                listener.bind(("127.0.0.1", self.port))
                break
            except OSError:
                time.sleep(0.05)
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            conns, self._conns = self._conns, set()
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()

    def close(self) -> None:
        self._stop.set()
        self.down()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns.update((client, server))
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        sel = selectors.DefaultSelector()
        sel.register(a, selectors.EVENT_READ, b)
        sel.register(b, selectors.EVENT_READ, a)
        try:
            while not self._stop.is_set():
                for key, _ in sel.select(0.1):
                    while self.hang and not self._stop.is_set():
                        time.sleep(0.02)
                    src: socket.socket = key.fileobj  # type: ignore[assignment]
                    data = src.recv(1 << 16)
                    if not data:
                        return
                    if src is a and not self._let_through(a, data):
                        return
                    key.data.sendall(data)
        except OSError:
            return
        finally:
            sel.close()
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.close()
            with self._lock:
                self._conns.difference_update((a, b))

    def _let_through(self, client: socket.socket, data: bytes) -> bool:
        """Whether a piece the client sent goes on (after ``delay``)."""
        if self.delay:
            time.sleep(self.delay)
        if data.startswith(b"PUT /"):
            with self._lock:
                if self.puts is not None:
                    if self.puts <= 0:
                        if self.refuse_puts:
                            client.sendall(_DENIED)
                        return False
                    self.puts -= 1
        return True


_DENIED_BODY = b"<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"
_DENIED = (
    b"HTTP/1.1 403 Forbidden\r\nContent-Type: application/xml\r\n"
    + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(_DENIED_BODY)
    + _DENIED_BODY
)


class S3Server:
    def __init__(self) -> None:
        self.moto_port = _free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.moto_port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.moto_port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.proc.kill()
                    raise RuntimeError("moto's server did not start") from None
                time.sleep(0.1)
        self.proxy = FaultyProxy(self.moto_port)
        self.endpoint = f"http://127.0.0.1:{self.proxy.port}"
        self.client().create_bucket(Bucket=BUCKET)

    def env(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def client(self) -> Any:
        """boto's own client, straight to the server (not through the proxy)."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=f"http://127.0.0.1:{self.moto_port}",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )

    def objects(self, prefix: str = "") -> dict[str, bytes]:
        """Every object under ``prefix`` in the bucket, key to its bytes."""
        client = self.client()
        out: dict[str, bytes] = {}
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
            for item in page.get("Contents", []):
                key = item["Key"]
                out[key] = client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        return out

    def clear(self) -> None:
        client = self.client()
        for key in self.objects():
            client.delete_object(Bucket=BUCKET, Key=key)

    def stop(self) -> None:
        self.proxy.close()
        self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    pytest.importorskip("s3fs", reason="s3fs is not installed (pip install 'rollout-trace[s3]')")
    server = S3Server()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The server, empty, its proxy up, and the standard variables pointing at it."""
    s3_server.proxy.hang = False
    s3_server.proxy.delay = 0.0
    s3_server.proxy.puts = None
    s3_server.proxy.refuse_puts = False
    if s3_server.proxy._listener is None:
        s3_server.proxy.up()
    s3_server.clear()
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    # Clients cached by an earlier test may point at an earlier endpoint.
    import fsspec

    fsspec.AbstractFileSystem.clear_instance_cache()
    for name in list(os.environ):
        if name.startswith("FSSPEC_"):
            monkeypatch.delenv(name)
    return s3_server
