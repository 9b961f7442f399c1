"""A real OTLP/HTTP logs receiver for the tests: decodes each request's protobuf.

It listens on 127.0.0.1 (a free port, kept when it goes down and comes back),
answers in a thread per connection (kept alive, as a collector does), and
keeps the records of every request it answered with success. ``lines()``
gives them back as the JSON lines the sink was handed: ``event`` from
``event_name``, ``time`` from ``time_unix_nano``, then the attributes.

Faults: ``down()`` stops listening and cuts every open connection (a client
is refused), ``up()`` listens again on the same port; ``delay`` holds each
answer that many seconds (``math.inf``: until ``down()`` or ``release()``;
a request held when the receiver goes down is dropped unanswered and not
kept); ``trickle`` sends each answer a byte at a time, that many seconds
apart (until ``down()``); ``fail_next(n, status)`` answers the next ``n``
requests with ``status`` and keeps nothing of them; ``reject_next(k)`` answers the next
request with a partial success that rejected its last ``k`` records (which
are not kept).

How an answer is framed (each answer has a body, so that its framing
matters): ``version = "HTTP/1.0"`` answers as ``http.server`` does by
default, closing the connection after each answer; ``length = False`` sends
no Content-Length (the body ends when the receiver closes the connection);
``close = True`` says ``Connection: close``; ``body_after`` sends the body
that many seconds after the status and headers, in a write of its own;
``cut = True`` closes the connection 10 bytes short of the Content-Length
(the records are kept all the same: the status said they were taken).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import math
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord

__all__ = ["Entry", "Receiver", "record_line", "shared_uri", "shared", "stop_shared", "value"]


def value(v: AnyValue) -> Any:
    """An OTLP ``AnyValue`` as the JSON value it stands for (empty: null)."""
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [value(item) for item in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind)


def record_line(record: LogRecord) -> dict[str, Any]:
    """A log record as the line it came from: ``event``, ``time``, then the attributes."""
    line: dict[str, Any] = {"event": record.event_name}
    if record.time_unix_nano:
        line["time"] = float(Decimal(record.time_unix_nano) / Decimal(10**9))
    for kv in record.attributes:
        line[kv.key] = value(kv.value)
    if record.HasField("body"):
        line["body"] = value(record.body)
    return line


@dataclass
class Entry:
    """One record the receiver kept, with where it came in."""

    line: dict[str, Any]
    resource: dict[str, Any]
    scope: tuple[str, str]
    record: LogRecord


@dataclass
class Seen:
    """One request as it arrived (kept or not)."""

    path: str
    headers: dict[str, str]
    records: int
    status: int = 0
    at: float = field(default_factory=time.monotonic)  # when it arrived


@dataclass
class _Plan:
    fail: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    reject: list[tuple[int, str]] = field(default_factory=list)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, receiver: Receiver, port: int) -> None:
        self.receiver = receiver
        self.connections: set[socket.socket] = set()
        self.stopped = False
        self.wake = threading.Event()
        self.gone = threading.Event()  # set by down()
        super().__init__(("127.0.0.1", port), _Handler)
        if receiver.tls is not None:
            self.socket = receiver.tls.wrap_socket(self.socket, server_side=True)

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = super().get_request()
        with self.receiver.lock:
            self.connections.add(sock)
        return sock, address

    def shutdown_request(self, request: Any) -> None:
        with self.receiver.lock:
            self.connections.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a connection cut by down() or by the client


class _Trickling:
    """A handler's ``wfile`` that sends a byte at a time, ``pause`` seconds apart."""

    def __init__(self, wfile: Any, pause: float, server: _Server) -> None:
        self.wfile, self.pause, self.server = wfile, pause, server

    @property
    def closed(self) -> bool:
        return bool(self.wfile.closed)

    def write(self, data: bytes) -> int:
        for i in range(len(data)):
            if self.server.gone.wait(self.pause):
                raise ConnectionAbortedError("the receiver went down")
            self.wfile.write(data[i : i + 1])
        return len(data)

    def flush(self) -> None:
        self.wfile.flush()

    def close(self) -> None:
        self.wfile.close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # The body goes in a write after the headers': without this, it would wait
    # for the client's delayed acknowledgement of them (40 ms).
    disable_nagle_algorithm = True
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.protocol_version = self.server.receiver.version

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        server, receiver = self.server, self.server.receiver
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        request = ExportLogsServiceRequest()
        request.ParseFromString(body)
        count = sum(
            len(scope.log_records) for rl in request.resource_logs for scope in rl.scope_logs
        )
        seen = Seen(self.path, dict(self.headers.items()), count)
        with receiver.lock:
            receiver.seen.append(seen)
        delay = receiver.delay
        if delay > 0:
            server.wake.wait(None if math.isinf(delay) else delay)
        with receiver.lock:
            if server.stopped:  # went down while holding it: dropped, unanswered
                self.close_connection = True
                return
            fail = receiver.plan.fail.pop(0) if receiver.plan.fail else None
            reject = receiver.plan.reject.pop(0) if fail is None and receiver.plan.reject else None
            if fail is None:
                receiver.keep(request, reject[0] if reject else 0)
        answer = ExportLogsServiceResponse()
        answer.partial_success.SetInParent()  # nothing rejected, but a body of 2 bytes
        status, headers = (fail[0], fail[1]) if fail else (200, {})
        if reject:
            answer.partial_success.rejected_log_records = reject[0]
            answer.partial_success.error_message = reject[1]
        payload = answer.SerializeToString() if fail is None else b"busy"
        seen.status = status
        if receiver.trickle > 0:
            self.wfile = _Trickling(self.wfile, receiver.trickle, server)
        self.send_response(status)
        self.send_header("Content-Type", "application/x-protobuf" if fail is None else "text/plain")
        if receiver.length:
            self.send_header("Content-Length", str(len(payload) + 10 * receiver.cut))
        if receiver.close:
            self.send_header("Connection", "close")
        for name, text in headers.items():
            self.send_header(name, text)
        self.end_headers()
        if not receiver.length or receiver.close or receiver.cut:
            self.close_connection = True
        if receiver.body_after > 0:
            server.gone.wait(receiver.body_after)
        self.wfile.write(payload)


class Receiver:
    """An OTLP/HTTP logs receiver on 127.0.0.1; a context manager that starts and stops it."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.tls = tls  # answer over TLS with this context
        self.lock = threading.Lock()
        self.port = 0
        self.delay = 0.0
        self.trickle = 0.0
        self.version = "HTTP/1.1"
        self.length = True
        self.close = False
        self.body_after = 0.0
        self.cut = False
        self.plan = _Plan()
        self.entries: list[Entry] = []
        self.seen: list[Seen] = []
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Receiver:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    @property
    def location(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def uri(self) -> str:
        return f"otlp+http://{self.location}"

    def up(self) -> Receiver:
        """Listen (again, on the same port once it has one)."""
        assert self._server is None, "already up"
        server = _Server(self, self.port)
        self.port = server.server_address[1]
        self._server = server
        # A short poll: down() waits for the loop to notice, for each test.
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()
        return self

    def down(self) -> None:
        """Stop listening and cut every connection; held requests are dropped."""
        server, self._server = self._server, None
        if server is None:
            return
        with self.lock:
            server.stopped = True
            server.wake.set()
            server.gone.set()
        server.shutdown()
        server.server_close()
        assert self._thread is not None
        self._thread.join()
        with self.lock:
            connections = list(server.connections)
        for sock in connections:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def release(self) -> None:
        """Answer the requests held by ``delay`` now, and stop holding new ones."""
        self.delay = 0.0
        if self._server is not None:
            self._server.wake.set()

    def fail_next(self, n: int, status: int = 503, headers: dict[str, str] | None = None) -> None:
        with self.lock:
            self.plan.fail.extend([(status, headers or {})] * n)

    def reject_next(self, rejected: int, message: str = "too many") -> None:
        with self.lock:
            self.plan.reject.append((rejected, message))

    def clear(self) -> None:
        with self.lock:
            self.entries.clear()
            self.seen.clear()
            self.plan = _Plan()
        self.delay = 0.0
        self.trickle = 0.0
        self.version = "HTTP/1.1"
        self.length = True
        self.close = False
        self.body_after = 0.0
        self.cut = False

    def keep(self, request: ExportLogsServiceRequest, rejected: int) -> None:
        """Keep a request's records (the caller holds ``lock``), less the last ``rejected``."""
        entries = []
        for rl in request.resource_logs:
            resource = {kv.key: value(kv.value) for kv in rl.resource.attributes}
            for scope_logs in rl.scope_logs:
                scope = (scope_logs.scope.name, scope_logs.scope.version)
                for record in scope_logs.log_records:
                    entries.append(Entry(record_line(record), resource, scope, record))
        self.entries.extend(entries[: len(entries) - rejected])

    @property
    def lines_kept(self) -> list[dict[str, Any]]:
        with self.lock:
            return [entry.line for entry in self.entries]

    def lines(self) -> bytes:
        """Every record kept, as JSON lines."""
        return b"".join(json.dumps(line).encode() + b"\n" for line in self.lines_kept)


_shared: list[Receiver] = []


def shared() -> Receiver:
    """One receiver for a module's tests (started on first use)."""
    if not _shared:
        _shared.append(Receiver().up())
    return _shared[0]


def shared_uri() -> str:
    """The shared receiver's URI, its records cleared (for a new test)."""
    receiver = shared()
    receiver.clear()
    return receiver.uri


def stop_shared() -> None:
    while _shared:
        _shared.pop().down()
