"""``otlp+http://`` and ``otlp+https://``: events as OpenTelemetry log records, over OTLP/HTTP."""

from __future__ import annotations

import contextvars
import gzip
import logging
import math
import os
import random
import re
import socket
import ssl
import threading
import time
import urllib.request
from collections.abc import Mapping
from contextlib import suppress
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import unquote, unquote_to_bytes, urlsplit

import msgspec

from ._base import WAIT_SLICE_S, Sink, SinkOptionError

try:
    import urllib3
    from urllib3.connection import HTTPConnection, HTTPSConnection
    from urllib3.exceptions import HTTPError, InvalidHeader, LocationValueError, NewConnectionError
except ImportError as exc:  # the otlp extra is not installed
    raise ImportError(
        f"the otlp sinks need urllib3 (pip install 'rollout-trace[otlp]'): {exc}"
    ) from exc

if TYPE_CHECKING:
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue
    from opentelemetry.proto.resource.v1.resource_pb2 import Resource
    from typing_extensions import Self

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
    ``rollout_trace.run_id`` (see the docs, Sinks, for where each comes from).

    ``open()`` sends nothing, so a collector that is down does not stop a
    job from starting. Each ``write()`` is one request (several, each of
    whole lines, above ``REQUEST_BYTES`` of JSON; the tracer hands it no
    more than that, ``max_write``) and returns once the collector accepted
    it: ``flush()`` has nothing left to do. A refused or cut connection, or
    an answer of 429, 502, 503 or 504, is tried again with exponential
    backoff (a longer ``Retry-After`` honoured) until ``timeout_s`` seconds
    from the request's start, a deadline for all of that request: each
    try's connection, TLS handshake, request and answer too, and the waits
    between them (a name lookup takes what the system's resolver takes).
    A request the collector answered with a 2xx status is never sent again:
    an answer then cut fails the write. Any other answer, a budget spent, or
    a partial success that rejected records raises ``OtlpExportError``.
    The deadline and the backoff are on ``Sink.deadline_clock`` (the
    tracer's): a request is cut, and a backoff ends, within
    ``WAIT_SLICE_S`` of the clock passing them. Each try's socket waits at
    most what is left of the budget, in real time.

    Requests go through the proxy ``$HTTP_PROXY`` or ``$HTTPS_PROXY`` names
    (lower-case names too) unless ``$NO_PROXY`` lists the collector's host,
    as curl and the OpenTelemetry exporters have it.

    ``close()`` may come from another thread while a write given up as hung
    is still sending or waiting for its answer: it wakes that write, which
    then raises and leaves no connection open (the one socket call here: a
    shutdown, as urllib3's own ``HTTPResponse.shutdown`` does). A write
    still connecting ends at its own ``timeout_s``.
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
        self.timeout_s = _timeout(options, env)
        self.compression = _compression(options, env)
        variable, text = _signal_env(env, "HEADERS")
        self.headers: dict[str, str] = {
            **_headers(text, variable),
            "Content-Type": "application/x-protobuf",
            "User-Agent": f"rollout-trace/{_sdk_version()}",
        }
        if self.compression == "gzip":
            self.headers["Content-Encoding"] = "gzip"
        # Built here, so a CA file missing or not a certificate is refused
        # with the URI rather than found at the first write.
        tls = _tls_context(env) if urlsplit(self.url).scheme == "https" else None
        self._http = _pool_manager(self.url, tls)
        self._env_resource = _pairs(
            env.get("OTEL_RESOURCE_ATTRIBUTES", ""), "OTEL_RESOURCE_ATTRIBUTES"
        )
        self._env_service = env.get("OTEL_SERVICE_NAME", "").strip()
        # close() may run on another thread while a write is under way: it
        # cuts that write's request (``_flight``), and no write starts after it.
        # The watchdog, a thread started by the first write, cuts a request at
        # its deadline; it waits on ``_lock``, which close() and each new
        # request notify.
        self._lock = threading.Condition()
        self._closed = threading.Event()
        self._flight: _Flight | None = None
        self._watchdog: threading.Thread | None = None
        # Per run: what its trace_opened said, and its resource once built.
        self._opened: dict[str, dict[str, Any]] = {}
        self._resources: dict[str, Resource] = {}
        self._warned: set[str] = set()
        self.requests = 0  # requests the collector accepted

    # --- the contract ---------------------------------------------------------

    def open(self) -> None:
        """Nothing to acquire: the first write connects (and retries within its budget)."""

    def write(self, data: bytes) -> None:
        if self._closed.is_set():
            raise OtlpExportError(f"the sink for {self.url} is closed")
        for chunk in _chunks(data, REQUEST_BYTES):
            lines = chunk.split(b"\n")
            if lines and not lines[-1]:
                lines.pop()
            self._send(self._request(lines).SerializeToString(), len(lines))

    def flush(self) -> None:
        """Every write was sent before it returned: nothing is held here."""

    def close(self) -> None:
        with self._lock:
            self._closed.set()
            flight = self._flight
            self._lock.notify()  # the watchdog ends
        if flight is not None:  # a write given up as hung, still under way
            flight.cut("closed")
        self._http.clear()

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
        """POST one request of ``n`` records, within a ``timeout_s`` of its own (the
        time to wait for each batch export, as the OpenTelemetry spec has it)."""
        if self.compression == "gzip":
            body = gzip.compress(body, compresslevel=6)
        flight = _Flight(self, self.timeout_s)
        with self._lock:
            if self._closed.is_set():
                raise OtlpExportError(f"the sink for {self.url} is closed")
            self._flight = flight
            self._lock.notify()  # the watchdog watches it
            if self._watchdog is None or not self._watchdog.is_alive():  # or a forked child
                self._watchdog = threading.Thread(
                    target=self._watch, name=f"rollout_trace {self.url} deadlines", daemon=True
                )
                self._watchdog.start()
        token = _FLIGHT.set(flight)
        try:
            response = self._http.urlopen(
                "POST",
                self.url,
                body=body,
                headers=self.headers,
                retries=_Retry(
                    flight,
                    total=None,
                    other=0,  # not a connection or read error (TLS, a proxy's refusal): final
                    allowed_methods=None,  # POST too: OTLP export requests may be sent again
                    status_forcelist=RETRYABLE,
                    backoff_factor=_BACKOFF_FIRST_S,
                    backoff_max=_BACKOFF_MAX_S,
                ),
                timeout=_Left(flight),
                redirect=False,
                preload_content=False,  # the body is read here, once the status is known
            )
            self._answer(response, flight, n)
        except _GiveUp as exc:
            raise self._failure(flight, n) from exc
        except OtlpExportError:
            raise
        except (HTTPError, OSError) as exc:  # not retried, or cut as a try began
            flight.failed(exc)
            raise self._failure(flight, n, _chain(exc)[-1]) from exc
        finally:
            _FLIGHT.reset(token)
            with self._lock:
                self._flight = None

    def _watch(self) -> None:
        """Cut each request at its deadline, until the sink is closed: each step of a
        request times out by itself when no byte comes, but an answer trickled a byte
        at a time does not. A request is watched in slices of ``WAIT_SLICE_S`` (its
        deadline is on ``deadline_clock``, which a test moves); with none to watch, the
        watchdog sleeps until a request or the close wakes it."""
        with self._lock:
            while not self._closed.is_set():
                flight = self._flight
                if flight is None or flight.cut_by is not None:
                    self._lock.wait()
                elif (left := flight.left()) > 0:
                    self._lock.wait(min(left, WAIT_SLICE_S))
                else:
                    flight.cut("deadline")

    def _answer(self, response: urllib3.BaseHTTPResponse, flight: _Flight, n: int) -> None:
        """Read the answer to a request: a 2xx is the collector's, never sent again."""
        status = f"HTTP {response.status} {response.reason}"
        if not 200 <= response.status < 300:
            payload = b""
            with suppress(HTTPError, OSError):
                payload = response.read()
            raise OtlpExportError(
                f"the collector at {self.url} refused {n} records: "
                f"{status}{_detail(response.headers, payload)} "
                "(not retried: only 429, 502, 503, 504 and connection errors are)"
            )
        try:
            payload = response.read()
        except (HTTPError, OSError) as exc:
            problem = _describe(exc, flight)[0]
            if flight.cut_by == "closed":
                problem = "the sink was closed"
            raise OtlpExportError(
                f"the collector at {self.url} answered {status} to {n} records, but its "
                f"answer could not be read ({problem}): not sent again, as the collector "
                "may hold them, and not counted as written"
            ) from exc
        self.requests += 1
        self._check_partial(payload, n)

    def _failure(
        self, flight: _Flight, n: int, final: BaseException | None = None
    ) -> OtlpExportError:
        """Why a request was given up: the sink closed, its deadline passed, or
        ``final``, an error that is not retried."""
        tries = f"{flight.tries} {'try' if flight.tries == 1 else 'tries'}"
        if flight.cut_by == "closed" or self._closed.is_set():
            return OtlpExportError(
                f"the sink was closed while sending {n} records to the collector at "
                f"{self.url} ({tries}): {flight.problem}"
            )
        if isinstance(final, ssl.SSLCertVerificationError):
            return OtlpExportError(
                f"the collector at {self.url} is not trusted: {flight.problem} "
                "(not retried; $OTEL_EXPORTER_OTLP_CERTIFICATE names a CA file)"
            )
        if final is not None and flight.cut_by is None:
            return OtlpExportError(
                f"could not send {n} records to the collector at {self.url}: "
                f"{flight.problem} (not retried: only connection errors and 429, 502, "
                "503, 504 are)"
            )
        after = f" (it asked to wait {flight.asked:g} s)" if flight.asked else ""
        return OtlpExportError(
            f"could not send {n} records to the collector at {self.url} within "
            f"timeout_s={self.timeout_s:g} ({tries}): {flight.problem}{after}"
        )

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


class OtlpHttpsSink(OtlpHttpSink):
    """``otlp+https://``: the same over TLS (the system's trust store, or
    ``$OTEL_EXPORTER_OTLP_CERTIFICATE``)."""

    secure = True


# --- one request, on urllib3 --------------------------------------------------------


class _GiveUp(Exception):
    """Raised between tries: the sink is closed, or the deadline leaves no time."""


class _Flight:
    """A request under way: its deadline, its tries and why they failed, and the
    socket it is on, which ``cut()`` shuts down (at the deadline, or from
    ``close()`` on another thread) to wake a read or a send blocked on it."""

    def __init__(self, sink: OtlpHttpSink, timeout_s: float) -> None:
        self.sink = sink
        self.deadline = sink.deadline_clock() + timeout_s
        self.closed = sink._closed
        self.tries = 1
        self.problem = ""  # why the last try failed
        self.asked: float | None = None  # the Retry-After of the last answer, in seconds
        self.cut_by: str | None = None  # "deadline" or "closed"
        self._cause: str | None = None  # the last failure that was not a timeout
        self._sock: Any = None
        self._lock = threading.Lock()

    def left(self) -> float:
        return self.deadline - self.sink.deadline_clock()

    def failed(
        self, error: BaseException | None, response: urllib3.BaseHTTPResponse | None = None
    ) -> None:
        """Say why a try failed by its real cause: a try that the deadline cut
        short does not hide why the tries before it failed."""
        if response is not None:
            problem, timed_out = f"HTTP {response.status} {response.reason}", False
        else:
            problem, timed_out = _describe(error, self)
        if not timed_out:
            self._cause = problem
        elif self._cause:
            problem = f"{self._cause}, then the last try timed out"
        self.problem = problem

    def use(self, sock: Any) -> None:
        """The connection is about to send on ``sock`` (``None``: it connects
        first); raises once the request is cut, so that it sends no more."""
        with self._lock:
            if self.cut_by is not None:
                raise ConnectionAbortedError(f"the request was cut ({self.cut_by})")
            if sock is not None:
                self._sock = sock

    def cut(self, why: str) -> None:
        with self._lock:
            self.cut_by = self.cut_by or why
            sock = self._sock
        if sock is not None:
            # As urllib3's HTTPResponse.shutdown() does: a socket closed
            # meanwhile raises, and a TLS-in-TLS one has nothing to shut.
            with suppress(OSError, AttributeError):
                sock.shutdown(socket.SHUT_RDWR)


# The request under way on this thread, which its connection tells the socket
# it sends on (urllib3 gives no other way to reach the connection in use).
_FLIGHT: contextvars.ContextVar[_Flight | None] = contextvars.ContextVar(
    "rollout_trace_otlp_flight", default=None
)


class _Connection(HTTPConnection):
    """urllib3's connection, on a socket the request under way can cut."""

    def send(self, data: Any) -> None:
        flight = _FLIGHT.get()
        if flight is not None:
            flight.use(self.sock)
        super().send(data)


class _TlsConnection(_Connection, HTTPSConnection):
    pass


class _Pool(urllib3.HTTPConnectionPool):
    ConnectionCls = _Connection


class _TlsPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = _TlsConnection


class _Left(urllib3.Timeout):
    """Each step's timeout (connecting, the TLS handshake, sending, waiting for
    the answer): the time left until the request's deadline."""

    def __init__(self, flight: _Flight) -> None:
        super().__init__()
        self._flight = flight

    def clone(self) -> _Left:
        return _Left(self._flight)

    @property
    def connect_timeout(self) -> float:
        return max(self._flight.left(), 1e-3)

    read_timeout = connect_timeout


class _Retry(urllib3.Retry):
    """urllib3's retries until the request's deadline: each wait is the
    exponential backoff, or a longer ``Retry-After``; a wait that would end
    past the deadline, or a close, raises ``_GiveUp`` instead."""

    def __init__(self, flight: _Flight, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.flight = flight

    def new(self, **kwargs: Any) -> Self:
        return super().new(flight=self.flight, **kwargs)

    def get_backoff_time(self) -> float:
        # From the first retry on (urllib3's own tries a second time at
        # once), jittered down to half so that clients do not retry in step.
        backoff = self.backoff_factor * 2.0 ** (len(self.history) - 1)
        return min(self.backoff_max, backoff) * random.uniform(0.5, 1.0)

    def sleep(self, response: urllib3.BaseHTTPResponse | None = None) -> None:
        flight = self.flight
        flight.failed(self.history[-1].error, response)
        flight.asked = None
        if response is not None:
            with suppress(InvalidHeader):
                flight.asked = self.get_retry_after(response)
        # A Retry-After can only lengthen the backoff: "0" or a date gone by
        # must not make a loop of requests to a collector that is busy.
        wait = max(self.get_backoff_time(), flight.asked or 0.0)
        if flight.closed.is_set() or wait >= flight.left():
            raise _GiveUp
        if flight.sink.wait_until(flight.sink.deadline_clock() + wait, flight.closed):
            raise _GiveUp
        flight.tries += 1


def _quiet(record: logging.LogRecord) -> bool:
    """urllib3 logs a warning for each retry; this sink's are not (a failure is
    reported once, by the tracer)."""
    return not (isinstance(record.args, tuple) and any(isinstance(a, _Retry) for a in record.args))


logging.getLogger("urllib3.connectionpool").addFilter(_quiet)


def _chain(error: BaseException) -> list[BaseException]:
    """``error`` and what it wraps, down to what went wrong under urllib3's
    wrappers (``MaxRetryError``, ``ProxyError``, ``ProtocolError``...)."""
    chain = [error]
    while isinstance(error, HTTPError):
        inner = (
            getattr(error, "reason", None)
            or getattr(error, "original_error", None)
            or error.__cause__
            or next((a for a in error.args if isinstance(a, BaseException)), None)
        )
        if not isinstance(inner, BaseException) or inner in chain:
            break
        chain.append(error := inner)
    return chain


def _describe(error: BaseException | None, flight: _Flight) -> tuple[str, bool]:
    """A failure as the user reads it, and whether it is a timeout. Once the
    deadline cut the request, whatever the cut raised is one; a connection
    that could not be made failed by itself (the cut had no socket to shut)."""
    chain = _chain(error) if error is not None else []
    if not chain:
        return "no answer", False
    connecting = any(isinstance(e, NewConnectionError) for e in chain)
    if flight.cut_by == "deadline" and not connecting:
        return "TimeoutError: timed out", True
    root = chain[-1]
    return f"{type(root).__name__}: {root}", isinstance(root, TimeoutError)


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
        raise SinkOptionError(
            f"the otlp sinks need the opentelemetry-proto package ({EXTRA_HINT}): {exc}"
        ) from exc
    if "event_name" not in logs_pb2.LogRecord.DESCRIPTOR.fields_by_name:  # before 1.35
        raise SinkOptionError(
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
            raise SinkOptionError(
                f"{uri!r} is not host[:port][/path] (e.g. otlp+{scheme}://collector:4318)"
            )
        try:
            port = parts.port or (4318 if scheme == "http" else 443)
        except ValueError as exc:
            raise SinkOptionError(f"{uri!r} has a bad port: {exc}") from exc
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
        raise SinkOptionError(
            f"${variable}={url!r} is not an http:// or https:// URL (e.g. http://collector:4318)"
        )
    try:
        parts.port  # noqa: B018
    except ValueError as exc:
        raise SinkOptionError(f"${variable}={url!r} has a bad port: {exc}") from exc
    if secure and parts.scheme != "https":
        # Else the headers (often a token) would go in clear text.
        raise SinkOptionError(
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
            raise SinkOptionError(f"the system's trust store cannot be loaded: {exc}") from exc
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise SinkOptionError(
            f"${variable}={cafile!r} is not a CA file that can be used: {reason} "
            "(it names a PEM file of the certificates that sign the collector's)"
        ) from exc


def _pool_manager(url: str, tls: ssl.SSLContext | None) -> urllib3.PoolManager:
    """A kept-alive connection to the collector, through the proxy the
    environment names for ``url`` if any (refused here if urllib3 cannot use it)."""
    proxy = _proxy(url)
    manager: urllib3.PoolManager
    if proxy is None:
        manager = urllib3.PoolManager(maxsize=1, ssl_context=tls)
    else:
        parts = urlsplit(proxy)
        credentials = None
        if parts.username is not None:  # user:password@ in the URL, as curl takes them
            credentials = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        try:
            manager = urllib3.ProxyManager(
                proxy,
                proxy_headers=urllib3.make_headers(proxy_basic_auth=credentials),
                maxsize=1,
                ssl_context=tls,
            )
        except LocationValueError as exc:
            shown = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()
            scheme = urlsplit(url).scheme
            raise SinkOptionError(
                f"${scheme.upper()}_PROXY (or ${scheme}_proxy)={shown!r} is not an "
                f"http:// or https:// URL: {exc}"
            ) from exc
    manager.pool_classes_by_scheme = {"http": _Pool, "https": _TlsPool}
    return manager


def _proxy(url: str) -> str | None:
    """``$HTTP_PROXY`` or ``$HTTPS_PROXY`` (or their lower-case names) by the
    scheme of ``url``, unless ``$NO_PROXY`` lists its host: the proxy curl and
    the OpenTelemetry exporters would use."""
    parts = urlsplit(url)
    proxy = urllib.request.getproxies().get(parts.scheme, "").strip()
    host = parts.hostname or ""
    if not proxy or urllib.request.proxy_bypass(f"{host}:{parts.port}" if parts.port else host):
        return None
    return proxy if "://" in proxy else f"http://{proxy}"


def _timeout(options: Mapping[str, str], env: Mapping[str, str]) -> float:
    """``timeout_s``, else the variables' milliseconds, else ``DEFAULT_TIMEOUT_S``."""
    text = options.get("timeout_s")
    if text is not None:
        value = _number(text)
        if not (math.isfinite(value) and value > 0):
            raise SinkOptionError(
                f"timeout_s={text!r} is not a number of seconds above 0 (e.g. timeout_s=5)"
            )
        return value
    variable, text = _signal_env(env, "TIMEOUT")
    if not text:
        return DEFAULT_TIMEOUT_S
    value = _number(text)
    if not (math.isfinite(value) and value > 0):
        raise SinkOptionError(
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
        raise SinkOptionError(f"{name}={text!r} is not one of {', '.join(_COMPRESSIONS)}")
    return text.lower()


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def _headers(text: str, variable: str) -> dict[str, str]:
    """The headers variable: ``k=v,k2=v2``, percent-decoded; each value's bytes
    are sent as they are (text in UTF-8; held as latin-1 text, which HTTP
    sends byte for byte). A name that is not an HTTP token or a value with a
    control character (CR, LF, NUL...) is refused here, naming the header but
    not its value (often a secret)."""
    headers: dict[str, str] = {}
    for name, value in _pairs(text, variable, decode=False).items():
        if not _TOKEN.fullmatch(name):
            raise SinkOptionError(
                f"${variable} names a header {name!r}: a header name is letters, digits "
                "and !#$%&'*+-.^_`|~ only (no blanks or other characters)"
            )
        raw = unquote_to_bytes(value)
        bad = _CONTROL.search(raw)
        if bad:
            char = bad.group().decode("latin-1")
            raise SinkOptionError(
                f"${variable} gives header {name!r} a value with the control character "
                f"{char!r} (byte {bad.start() + 1} of the value, percent-decoded): a header "
                "value may hold anything but control characters (CR, LF, NUL...; a tab is "
                "allowed)"
            )
        headers[name] = raw.decode("latin-1")
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
            raise SinkOptionError(
                f"${variable} holds {entry.strip()!r}, not key=value (entries are "
                "comma-separated key=value pairs, percent-encoded)"
            )
        pairs[key] = unquote(value.strip()) if decode else value.strip()
    return pairs


def _detail(headers: Mapping[str, str], payload: bytes) -> str:
    """A short text from an error answer (a protobuf Status is left out)."""
    if not payload or "protobuf" in headers.get("Content-Type", ""):
        return ""
    text = payload[:200].decode("utf-8", "replace").strip()
    return f": {text}" if text else ""
