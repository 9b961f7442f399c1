"""``otlp+http://`` and ``otlp+https://``: events as OpenTelemetry log records, over OTLP/HTTP."""

from __future__ import annotations

import email.utils
import gzip
import http.client
import io
import ipaddress
import logging
import math
import os
import random
import re
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from contextlib import suppress
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import unquote, unquote_to_bytes, urlsplit

import msgspec

from ._base import Sink, SinkOptionValueError

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue
    from opentelemetry.proto.resource.v1.resource_pb2 import Resource

__all__ = ["OtlpExportError", "OtlpHttpSink", "OtlpHttpsSink"]

logger = logging.getLogger("rollout_trace")

EXTRA_HINT = "pip install 'rollout-trace[otlp]'"
DEFAULT_ENDPOINT = "http://localhost:4318"
LOGS_PATH = "/v1/logs"
DEFAULT_TIMEOUT_S = 5.0
_COMPRESSIONS = ("gzip", "none")
# Answers the OTLP/HTTP specification says to retry; any other error is final.
RETRYABLE = frozenset({429, 502, 503, 504})
# Backoff between tries: the first wait, doubled after each try, at most the last.
_BACKOFF_FIRST_S = 0.25
_BACKOFF_MAX_S = 2.0
# A write of more JSON than this goes in several requests, each of whole lines.
REQUEST_BYTES = 2 << 20
_INT64 = 1 << 63
# A header's name is an RFC 9110 token; its value any byte but a control
# character (a tab is allowed): a CR or LF would end the header early.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_NS = Decimal(10**9)
_decode = msgspec.json.Decoder().decode


class OtlpExportError(OSError):
    """The collector did not take a batch (the tracer reports it and stops the sink)."""


class OtlpHttpSink(Sink):
    """Sends each batch as OTLP ``ExportLogsServiceRequest``s (protobuf) to a collector.

    A line becomes a log record: ``event_name`` is the event's tag,
    ``time_unix_nano`` its ``time``, ``observed_time_unix_nano`` when the
    sink sent it, and every other field (``run_id`` and ``seq`` too) an
    attribute, in the line's order (objects as key-value lists, lists as
    arrays, null as an empty value, an integer beyond 64 bits as its
    decimal string). A line that is not a JSON object with a string
    ``event`` goes as a record whose body is the line's text. Each run has a
    resource: ``service.name``, ``host.name``, ``process.pid`` and
    ``rollout_trace.run_id`` (see the README for where each comes from).

    ``open()`` sends nothing, so a collector that is down does not stop a
    job from starting. Each ``write()`` is one request (several, each of
    whole lines, above ``REQUEST_BYTES`` of JSON; the tracer hands it no
    more than that, ``max_write``) and returns once the collector accepted
    it: ``flush()`` has nothing left to do. A refused connection or an
    answer of 429, 502, 503 or 504 is tried again with exponential backoff
    (a longer ``Retry-After`` honoured) until ``timeout_s`` seconds from the
    request's start, a deadline for all of that request: each try's
    resolution, connection, request and answer too, and the waits between
    them. Any other answer, a budget spent, or a partial success that
    rejected records raises ``OtlpExportError``.

    ``close()`` may come from another thread while a write given up as hung
    is still under way: it wakes that write, which then raises and leaves
    no connection open.
    """

    options = frozenset({"timeout_s", "compression"})
    #: The tracer hands a write one request's worth of lines at most: each
    #: write is one request, within ``timeout_s``, so a slow but healthy
    #: collector does not make a call that is given up as hung.
    max_write: ClassVar[int | None] = REQUEST_BYTES
    #: ``otlp+https://``: the URI's location (or the default endpoint) is https.
    secure: ClassVar[bool] = False

    def __init__(self, location: str, options: Mapping[str, str]) -> None:
        super().__init__(location, options)
        self._proto = _load_proto()
        env = os.environ
        self.url = _endpoint(location, self.secure, env)
        parts = urlsplit(self.url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or "localhost"
        try:
            port = parts.port
        except ValueError as exc:
            raise SinkOptionValueError(f"{self.url!r} has a bad port: {exc}") from exc
        self._port = port or (443 if self._https else 80)
        self._path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.timeout_s = _timeout(options, env)
        self.compression = _compression(options, env)
        variable, text = _signal_env(env, "HEADERS")
        self.headers: dict[str, str | bytes] = {
            **_headers(text, variable),
            "Content-Type": "application/x-protobuf",
            "User-Agent": f"rollout-trace/{_sdk_version()}",
        }
        if self.compression == "gzip":
            self.headers["Content-Encoding"] = "gzip"
        # Built here, so a CA file missing or not a certificate is refused
        # with the URI rather than found at the first write.
        self._context = _tls_context(env) if self._https else None
        self._env_resource = _pairs(
            env.get("OTEL_RESOURCE_ATTRIBUTES", ""), "OTEL_RESOURCE_ATTRIBUTES"
        )
        self._env_service = env.get("OTEL_SERVICE_NAME", "").strip()
        # The connection kept alive between writes. ``close()`` may run on
        # another thread while a write is under way: both take ``_lock`` to
        # swap ``_conn``, and a write that finds the sink closed stops.
        self._lock = threading.Lock()
        self._conn: _Connection | None = None
        self._writing = False
        self._orphan: _Connection | None = None  # taken from a write by close()
        self._closed = threading.Event()
        self._clock = _Clock()
        # Per run: what its trace_opened said, and its resource once built.
        self._opened: dict[str, dict[str, Any]] = {}
        self._resources: dict[str, Resource] = {}
        self._warned: set[str] = set()
        self.requests = 0  # requests the collector accepted

    # --- the contract ---------------------------------------------------------

    def open(self) -> None:
        """Nothing to acquire: the first write connects (and retries within its budget)."""

    def write(self, data: bytes) -> None:
        with self._lock:
            if self._closed.is_set():
                raise OtlpExportError(f"the sink for {self.url} is closed")
            self._writing = True
        try:
            for chunk in _chunks(data, REQUEST_BYTES):
                lines = chunk.split(b"\n")
                if lines and not lines[-1]:
                    lines.pop()
                body = self._request(lines).SerializeToString()
                # Each request has timeout_s of its own (the time to wait for
                # each batch export, as the OpenTelemetry spec has it).
                self._clock.deadline = time.monotonic() + self.timeout_s
                self._send(body, len(lines))
        finally:
            with self._lock:
                self._writing = False
                orphan, self._orphan = self._orphan, None
            if orphan is not None:  # close() came meanwhile: the write closes it
                orphan.close()

    def flush(self) -> None:
        """Every write was sent before it returned: nothing is held here."""

    def close(self) -> None:
        with self._lock:
            self._closed.set()
            conn, self._conn = self._conn, None
            wake = None
            if conn is not None and self._writing:
                # A write given up as hung, on another thread: its connection
                # is left to it, to close as it returns (else two threads
                # would use it at once); cutting its socket wakes it.
                self._orphan, wake, conn = conn, conn, None
        if conn is not None:
            conn.close()
        sock = wake.sock if wake is not None else None
        if sock is not None:
            # The base class's shutdown: an SSLSocket's own drops its TLS
            # state under the thread still reading it. A socket the write
            # closed meanwhile raises, as one never connected has no socket.
            with suppress(OSError):
                socket.socket.shutdown(sock, socket.SHUT_RDWR)

    # --- building a request ------------------------------------------------------

    def _request(self, lines: list[bytes]) -> Any:
        p = self._proto
        observed = time.time_ns()
        by_run: dict[str, list[tuple[bytes, Any]]] = {}
        for line in lines:
            obj = _decode_line(line)
            run_id = obj.get("run_id") if obj is not None else None
            run_id = run_id if isinstance(run_id, str) else ""
            if obj is not None and obj.get("event") == "trace_opened":
                self._opened.setdefault(run_id, obj)
            by_run.setdefault(run_id, []).append((line, obj))
        request = p.ExportLogsServiceRequest()
        for run_id, items in by_run.items():
            resource_logs = request.resource_logs.add()
            resource_logs.resource.CopyFrom(self._resource(run_id))
            scope_logs = resource_logs.scope_logs.add()
            scope_logs.scope.name = "rollout_trace"
            version = self._opened.get(run_id, {}).get("sdk_version")
            scope_logs.scope.version = version if isinstance(version, str) else _sdk_version()
            records = scope_logs.log_records
            for line, obj in items:
                record = records.add()
                record.observed_time_unix_nano = observed
                if obj is None:
                    record.body.string_value = line.decode("utf-8", "replace")
                    continue
                record.event_name = obj["event"]
                attributes = record.attributes
                for key in ("run_id", "seq"):
                    if key in obj:
                        _fill(attributes.add(key=key).value, obj[key])
                nanos = _nanos(obj.get("time"))
                if nanos is not None:
                    record.time_unix_nano = nanos
                for key, value in obj.items():
                    if key in ("event", "run_id", "seq") or (key == "time" and nanos is not None):
                        continue
                    _fill(attributes.add(key=key).value, value)
        return request

    def _resource(self, run_id: str) -> Resource:
        cached = self._resources.get(run_id)
        if cached is not None:
            return cached
        opened = self._opened.get(run_id, {})
        meta = opened.get("meta")
        meta = meta if isinstance(meta, dict) else {}
        values: dict[str, object] = dict(self._env_resource)
        names = (
            meta.get("service.name"),
            meta.get("service_name"),
            self._env_service,
            self._env_resource.get("service.name"),
        )
        service = next((n for n in names if isinstance(n, str) and n), "rollout_trace")
        pid = opened.get("pid")
        host = opened.get("host")
        values.update(
            {
                "service.name": service,
                "host.name": host if isinstance(host, str) else socket.gethostname(),
                "process.pid": pid if isinstance(pid, int) else os.getpid(),
                "rollout_trace.run_id": run_id,
            }
        )
        resource: Resource = self._proto.Resource()
        for key, value in values.items():
            _fill(resource.attributes.add(key=key).value, value)
        if run_id in self._opened:  # else built again once its trace_opened is seen
            self._resources[run_id] = resource
        return resource

    # --- sending -----------------------------------------------------------------

    def _send(self, body: bytes, n: int) -> None:
        if self.compression == "gzip":
            body = gzip.compress(body, compresslevel=6)
        tries = 0
        while True:
            tries += 1
            reused = self._conn is not None
            retry_after: float | None = None
            try:
                status, reason, headers, payload = self._post(body)
            except (OSError, http.client.HTTPException) as exc:
                problem = f"{type(exc).__name__}: {exc}"
                if self._closed.is_set():
                    raise OtlpExportError(
                        f"the sink was closed while sending {n} records to the collector "
                        f"at {self.url} ({tries} tries): {problem}"
                    ) from exc
                if isinstance(exc, ssl.SSLCertVerificationError):
                    raise OtlpExportError(
                        f"the collector at {self.url} is not trusted: {problem} "
                        "(not retried; $OTEL_EXPORTER_OTLP_CERTIFICATE names a CA file)"
                    ) from exc
                if reused and tries == 1 and _stale(exc):
                    continue  # a kept-alive connection the collector had closed
            else:
                if 200 <= status < 300:
                    self.requests += 1
                    self._check_partial(payload, n)
                    return
                problem = f"HTTP {status} {reason}{_detail(headers, payload)}"
                if status not in RETRYABLE:
                    raise OtlpExportError(
                        f"the collector at {self.url} refused {n} records: {problem} "
                        "(not retried: only 429, 502, 503, 504 and connection errors are)"
                    )
                retry_after = _retry_after(headers.get("Retry-After"))
            wait = min(_BACKOFF_MAX_S, _BACKOFF_FIRST_S * 2 ** (tries - 1))
            wait *= random.uniform(0.5, 1.0)
            if retry_after is not None:
                # It can only lengthen the backoff: "0" or a date gone by
                # must not make a loop of requests to a collector that is busy.
                wait = max(wait, retry_after)
            left = self._clock.deadline - time.monotonic()
            if wait >= left:
                after = f" (it asked to wait {retry_after:g} s)" if retry_after else ""
                raise OtlpExportError(
                    f"could not send {n} records to the collector at {self.url} within "
                    f"timeout_s={self.timeout_s:g} ({tries} tries): {problem}{after}"
                )
            if self._closed.wait(wait):
                raise OtlpExportError(
                    f"the sink was closed while sending {n} records to the collector "
                    f"at {self.url} ({tries} tries): {problem}"
                )

    def _post(self, body: bytes) -> tuple[int, str, http.client.HTTPMessage, bytes]:
        """One try, every step of it within the request's deadline (``_clock``)."""
        clock = self._clock
        with self._lock:
            if self._closed.is_set():
                raise ConnectionAbortedError("the sink is closed")
            conn = self._conn
            if conn is None:
                conn = self._conn = _Connection(self._host, self._port, self._context, clock)
        try:
            if conn.sock is None:
                conn.connect()
                if self._closed.is_set():  # while it connected: close() saw no socket
                    raise ConnectionAbortedError("the sink is closed")
            conn.request("POST", self._path, body=body, headers=self.headers)
            response = conn.getresponse()
            payload = response.read()
        except BaseException:
            self._drop(conn)
            raise
        if response.will_close:
            self._drop(conn)
        else:
            with self._lock:
                kept = self._conn is conn
            if not kept:  # close() came meanwhile, on another thread
                conn.close()
        return response.status, response.reason, response.headers, payload

    def _drop(self, conn: _Connection) -> None:
        """Close a connection the write used, and forget it."""
        with self._lock:
            if self._conn is conn:
                self._conn = None
        conn.close()

    def _check_partial(self, payload: bytes, n: int) -> None:
        """A partial success that rejected records raises: the write is not all written."""
        if not payload:
            return
        answer = self._proto.ExportLogsServiceResponse()
        try:
            answer.ParseFromString(payload)
        except Exception:  # not the protobuf answer: a 2xx is a success all the same
            return
        partial = answer.partial_success
        message = partial.error_message
        if partial.rejected_log_records > 0:
            raise OtlpExportError(
                f"the collector at {self.url} rejected {partial.rejected_log_records} of "
                f"{n} records: {message or '(no message)'}"
            )
        if message and message not in self._warned:
            self._warned.add(message)
            logger.warning(
                "rollout_trace: the collector at %s took every record but said: %s",
                self.url,
                message,
            )


class _Clock:
    """The deadline of the request under way, and the time each step may still take."""

    def __init__(self) -> None:
        self.deadline = math.inf

    def left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        return left


class _Reader(io.RawIOBase):
    """A socket's bytes, each read bounded by the time left: ``sock.makefile()``
    gives each read the whole timeout, so an answer trickled a byte at a time
    could take any time."""

    def __init__(self, sock: socket.socket, clock: _Clock) -> None:
        super().__init__()
        self._sock = sock
        self._clock = clock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
        self._sock.settimeout(self._clock.left())
        return self._sock.recv_into(buffer)


class _Connection(http.client.HTTPConnection):
    """HTTP/1.1 to the collector (over TLS with ``tls``), each step within the
    deadline of ``clock``: the name's resolution, the connection, the TLS
    handshake, the request and every read of the answer. It never reconnects
    by itself (``auto_open``): a write connects it, and a closed sink does not."""

    def __init__(self, host: str, port: int, tls: ssl.SSLContext | None, clock: _Clock) -> None:
        super().__init__(host, port)
        self.auto_open = 0
        self.default_port = 443 if tls is not None else 80  # for the Host header
        self._tls = tls
        self._clock = clock

        class Response(http.client.HTTPResponse):
            def __init__(self, sock: socket.socket, *args: Any, **kwargs: Any) -> None:
                super().__init__(sock, *args, **kwargs)
                self.fp.close()  # the makefile() one
                self.fp = io.BufferedReader(_Reader(sock, clock))

        self.response_class = Response

    def send(self, data: Any) -> None:
        # The headers, then the body: each in one sendall(), whose timeout
        # bounds it as a whole.
        if self.sock is not None:
            self.sock.settimeout(self._clock.left())
        super().send(data)

    def connect(self) -> None:
        clock = self._clock
        sock = _open_socket(self.host, self.port, clock)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                sock.settimeout(clock.left())
                sock = self._tls.wrap_socket(sock, server_hostname=self.host)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


def _open_socket(host: str, port: int, clock: _Clock) -> socket.socket:
    """A TCP connection to ``host``, resolved and connected within the time left."""
    error: OSError | None = None
    for family, kind, proto, _, address in _resolve(host, port, clock):
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(clock.left())
            sock.connect(address)
        except OSError as exc:
            sock.close()
            if isinstance(exc, TimeoutError):
                raise
            error = exc
            continue
        return sock
    raise error or OSError(f"{host!r} resolved to no address")


def _resolve(host: str, port: int, clock: _Clock) -> list[Any]:
    """``getaddrinfo()`` within the time left. It has no timeout of its own (a
    DNS server that does not answer holds it for the resolver's own retries),
    so a name is looked up on a thread of its own, left behind if it is late."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:  # an address: nothing to look up
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    done = threading.Event()
    answer: list[Any] = []

    def look_up() -> None:
        try:
            answer.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except BaseException as exc:  # handed to the write, which raises it
            answer.append(exc)
        done.set()

    threading.Thread(target=look_up, name=f"rollout_trace resolve {host}", daemon=True).start()
    if not done.wait(clock.left()):
        raise TimeoutError(f"timed out resolving {host!r}")
    if isinstance(answer[0], BaseException):
        raise answer[0]
    result: list[Any] = answer[0]
    return result


class OtlpHttpsSink(OtlpHttpSink):
    """``otlp+https://``: the same over TLS (the system's trust store, or
    ``$OTEL_EXPORTER_OTLP_CERTIFICATE``)."""

    secure = True


# --- values -----------------------------------------------------------------------


def _fill(target: AnyValue, value: object) -> None:
    """Set ``target`` to ``value`` (JSON as decoded); ``None`` leaves it empty (null)."""
    if isinstance(value, str):
        target.string_value = value
    elif isinstance(value, bool):
        target.bool_value = value
    elif isinstance(value, int):
        if -_INT64 <= value < _INT64:
            target.int_value = value
        else:
            target.string_value = str(value)
    elif isinstance(value, float):
        target.double_value = value
    elif isinstance(value, list):
        array = target.array_value
        array.SetInParent()  # an empty list is a list, not null
        for item in value:
            _fill(array.values.add(), item)
    elif isinstance(value, dict):
        kvlist = target.kvlist_value
        kvlist.SetInParent()
        for key, item in value.items():
            _fill(kvlist.values.add(key=str(key)).value, item)


def _nanos(value: object) -> int | None:
    """``time`` (seconds) as whole nanoseconds, from its shortest decimal form, so
    that a time good to a nanosecond or coarser is carried exactly."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not (math.isfinite(value) and 0 <= value < 2**64 / 1e9):
        return None
    try:
        return int((Decimal(repr(value)) * _NS).to_integral_value())
    except InvalidOperation:
        return None


def _decode_line(line: bytes) -> dict[str, Any] | None:
    try:
        obj = _decode(line)
    except msgspec.DecodeError:
        return None
    if isinstance(obj, dict) and isinstance(obj.get("event"), str):
        return obj
    return None


def _chunks(data: bytes, limit: int) -> list[bytes]:
    """``data`` in pieces of whole lines, each at most ``limit`` bytes (a longer
    line is a piece of its own)."""
    if len(data) <= limit:
        return [data]
    pieces, start = [], 0
    while start < len(data):
        end = data.rfind(b"\n", start, start + limit) + 1
        if end <= start:
            end = data.find(b"\n", start + limit) + 1 or len(data)
        pieces.append(data[start:end])
        start = end
    return pieces


# --- configuration ------------------------------------------------------------------


def _load_proto() -> Any:
    try:
        from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
        from opentelemetry.proto.logs.v1 import logs_pb2
        from opentelemetry.proto.resource.v1 import resource_pb2
    except ImportError as exc:
        raise SinkOptionValueError(
            f"the otlp sinks need the opentelemetry-proto package ({EXTRA_HINT}): {exc}"
        ) from exc
    if "event_name" not in logs_pb2.LogRecord.DESCRIPTOR.fields_by_name:  # before 1.35
        raise SinkOptionValueError(
            f"the otlp sinks need opentelemetry-proto 1.35 or later, whose log records "
            f"have an event_name ({EXTRA_HINT})"
        )

    class Proto:
        ExportLogsServiceRequest = logs_service_pb2.ExportLogsServiceRequest
        ExportLogsServiceResponse = logs_service_pb2.ExportLogsServiceResponse
        Resource = resource_pb2.Resource

    return Proto


def _sdk_version() -> str:
    from rollout_trace._version import __version__

    return __version__


def _signal_env(env: Mapping[str, str], name: str) -> tuple[str, str]:
    """``OTEL_EXPORTER_OTLP_LOGS_<name>`` if set, else ``OTEL_EXPORTER_OTLP_<name>``:
    the variable's name and its value ("" when neither is set)."""
    for variable in (f"OTEL_EXPORTER_OTLP_LOGS_{name}", f"OTEL_EXPORTER_OTLP_{name}"):
        value = env.get(variable, "").strip()
        if value:
            return variable, value
    return "", ""


def _endpoint(location: str, secure: bool, env: Mapping[str, str]) -> str:
    """The logs URL: the URI's location if it has one, else the variables."""
    scheme = "https" if secure else "http"
    uri = f"otlp+{scheme}://{location}"
    if location:
        parts = urlsplit(f"{scheme}://{location}")
        if not parts.hostname or parts.username is not None or parts.fragment:
            raise SinkOptionValueError(
                f"{uri!r} is not host[:port][/path] (e.g. otlp+{scheme}://collector:4318)"
            )
        try:
            port = parts.port or (4318 if scheme == "http" else 443)
        except ValueError as exc:
            raise SinkOptionValueError(f"{uri!r} has a bad port: {exc}") from exc
        path = parts.path if parts.path not in ("", "/") else LOGS_PATH
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        return f"{scheme}://{host}:{port}{path}"
    logs = env.get("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", "").strip()
    if logs:
        return _check_url(logs, "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", secure)
    base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    if base:
        _check_url(base, "OTEL_EXPORTER_OTLP_ENDPOINT", secure)
        return base.rstrip("/") + LOGS_PATH
    return (DEFAULT_ENDPOINT if not secure else "https://localhost:4318") + LOGS_PATH


def _check_url(url: str, variable: str, secure: bool) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SinkOptionValueError(
            f"${variable}={url!r} is not an http:// or https:// URL (e.g. http://collector:4318)"
        )
    if secure and parts.scheme != "https":
        # Else the headers (often a token) would go in clear text.
        raise SinkOptionValueError(
            f"${variable}={url!r} is not an https:// URL: otlp+https:// needs an "
            "https:// endpoint (use otlp+http:// for plain http)"
        )
    return url


def _tls_context(env: Mapping[str, str]) -> ssl.SSLContext:
    """The system's trust store, or the CA file the variables name (refused here
    if it cannot be read or holds no certificate)."""
    variable, cafile = _signal_env(env, "CERTIFICATE")
    try:
        return ssl.create_default_context(cafile=cafile or None)
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        if not cafile:
            raise SinkOptionValueError(f"the system's trust store cannot be loaded: {exc}") from exc
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise SinkOptionValueError(
            f"${variable}={cafile!r} is not a CA file that can be used: {reason} "
            "(it names a PEM file of the certificates that sign the collector's)"
        ) from exc


def _timeout(options: Mapping[str, str], env: Mapping[str, str]) -> float:
    """``timeout_s``, else the variables' milliseconds, else ``DEFAULT_TIMEOUT_S``."""
    text = options.get("timeout_s")
    if text is not None:
        value = _number(text)
        if not (math.isfinite(value) and value > 0):
            raise SinkOptionValueError(
                f"timeout_s={text!r} is not a number of seconds above 0 (e.g. timeout_s=5)"
            )
        return value
    variable, text = _signal_env(env, "TIMEOUT")
    if not text:
        return DEFAULT_TIMEOUT_S
    value = _number(text)
    if not (math.isfinite(value) and value > 0):
        raise SinkOptionValueError(
            f"${variable}={text!r} is not a number of milliseconds above 0 (e.g. 5000)"
        )
    return value / 1000


def _compression(options: Mapping[str, str], env: Mapping[str, str]) -> str:
    text = options.get("compression")
    name = "compression"
    if text is None:
        variable, text = _signal_env(env, "COMPRESSION")
        name = f"${variable}"
    if not text:
        return "none"
    if text.lower() not in _COMPRESSIONS:
        raise SinkOptionValueError(f"{name}={text!r} is not one of {', '.join(_COMPRESSIONS)}")
    return text.lower()


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def _headers(text: str, variable: str) -> dict[str, bytes]:
    """The headers variable: ``k=v,k2=v2``, percent-decoded; each value's bytes
    are sent as they are (text in UTF-8). A name that is not an HTTP token or
    a value with a control character (CR, LF, NUL...) is refused here, naming
    the header but not its value (often a secret)."""
    headers: dict[str, bytes] = {}
    for name, value in _pairs(text, variable, decode=False).items():
        if not _TOKEN.fullmatch(name):
            raise SinkOptionValueError(
                f"${variable} names a header {name!r}: a header name is letters, digits "
                "and !#$%&'*+-.^_`|~ only (no blanks or other characters)"
            )
        raw = unquote_to_bytes(value)
        bad = _CONTROL.search(raw)
        if bad:
            char = bad.group().decode("latin-1")
            raise SinkOptionValueError(
                f"${variable} gives header {name!r} a value with the control character "
                f"{char!r} (byte {bad.start() + 1} of the value, percent-decoded): a header "
                "value may hold anything but control characters (CR, LF, NUL...; a tab is "
                "allowed)"
            )
        headers[name] = raw
    return headers


def _pairs(text: str, variable: str, *, decode: bool = True) -> dict[str, str]:
    """``k=v,k2=v2`` (keys percent-decoded, and values unless ``decode`` is
    false; blanks around them dropped)."""
    pairs: dict[str, str] = {}
    for entry in text.split(","):
        if not entry.strip():
            continue
        key, eq, value = entry.partition("=")
        key = unquote(key.strip())
        if not eq or not key:
            raise SinkOptionValueError(
                f"${variable} holds {entry.strip()!r}, not key=value (entries are "
                "comma-separated key=value pairs, percent-encoded)"
            )
        pairs[key] = unquote(value.strip()) if decode else value.strip()
    return pairs


def _retry_after(text: str | None) -> float | None:
    """``Retry-After`` in seconds: a number of them, or an HTTP date."""
    if not text:
        return None
    text = text.strip()
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _stale(exc: BaseException) -> bool:
    return isinstance(
        exc,
        (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError),
    )


def _detail(headers: http.client.HTTPMessage, payload: bytes) -> str:
    """A short text from an error answer (a protobuf Status is left out)."""
    if not payload or "protobuf" in headers.get("Content-Type", ""):
        return ""
    text = payload[:200].decode("utf-8", "replace").strip()
    return f": {text}" if text else ""
