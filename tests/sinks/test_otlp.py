"""The otlp+http sink against a real OTLP/HTTP receiver (tests/otlp_receiver.py).

What the collector holds is what the receiver decoded from the requests it
answered with success: every count below is checked against those records.
"""

from __future__ import annotations

import base64
import importlib
import json
import logging
import math
import os
import random
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from deadlines import (
    HANG_S,
    POLLS_S,
    SHORT_S,
    Helper,
    WatchedClock,
    advancing,
    at_once,
    past_deadline,
)
from forward_proxy import Proxy
from otlp_receiver import Receiver
from samples import dispatched
from writing.harness import DRIVERS, IDS, Driver, Handle

import rollout_trace as rt
from rollout_trace._writing.specs import parse_uri
from rollout_trace.sinks import MemorySink
from rollout_trace.sinks import otlp as sinks_otlp
from rollout_trace.sinks.otlp import OtlpExportError, OtlpHttpSink, OtlpHttpsSink
from rollout_trace.testing import MockClock

RUN = "0123456789abcdef0123456789abcdef"
LIFECYCLE = ("trace_opened", "trace_closed")
ASYNCIO = DRIVERS[0]


@pytest.fixture(autouse=True)
def no_otel_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sets the OTEL_ variables it means; none leak in from outside."""
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)


@pytest.fixture(autouse=True)
def no_proxy_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nor do the proxy variables: each test that means a proxy names it."""
    for name in list(os.environ):
        if name.lower() in ("http_proxy", "https_proxy", "no_proxy", "all_proxy"):
            monkeypatch.delenv(name)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as r:
        yield r


@pytest.fixture
def only_the_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """A try's socket timeouts (what the clock leaves of timeout_s, as real
    seconds) out of the way: a request is given up at its deadline on the
    sink's clock alone (the watchdog), not by a socket armed while the test's
    clock stood a moment short of it."""
    far = property(lambda self: 600.0)
    monkeypatch.setattr(sinks_otlp._Left, "connect_timeout", far)
    monkeypatch.setattr(sinks_otlp._Left, "read_timeout", far)


class _Backoffs:
    """The otlp sinks' waits between tries, on their clock (a test's ``MockClock``):
    ``drawn``, each backoff a retry drew, with the retry's number (1: the first);
    ``waits``, each wait a sink began, in seconds on its clock. A wait moves the
    clock to its end at once (unless ``jump`` is False): the backoff is spent on
    the clock, not in real time. ``then(n)`` runs as the n-th wait begins."""

    def __init__(self) -> None:
        self.drawn: list[tuple[int, float]] = []
        self.waits: list[float] = []
        self.jump = True
        self.then: Callable[[int], None] = lambda n: None

    def spent(self, *, gave_up: bool, asked: float = 0.0) -> float:
        """Check each backoff drawn against the schedule, and each wait begun: the
        backoff, or the longer Retry-After ``asked``, for every one drawn but
        the last when the request was given up (``gave_up``). The seconds waited."""
        for retry, backoff in self.drawn:
            # From 0.25 s, doubled after each retry up to 2 s, jittered down
            # to half at most.
            full = min(0.25 * 2.0 ** (retry - 1), 2.0)
            assert full / 2 <= backoff <= full, (retry, backoff)
        drawn = self.drawn[:-1] if gave_up else self.drawn
        waited = [max(backoff, asked) for _, backoff in drawn]
        assert self.waits == pytest.approx(waited, abs=1e-9)
        return sum(waited)


@pytest.fixture
def backoffs(monkeypatch: pytest.MonkeyPatch) -> _Backoffs:
    seen = _Backoffs()
    draw = sinks_otlp._Retry.get_backoff_time
    wait_until = OtlpHttpSink.wait_until

    def drawn(retry: Any) -> float:
        backoff: float = draw(retry)
        seen.drawn.append((len(retry.history), backoff))
        return backoff

    def jumping(sink: OtlpHttpSink, deadline: float, event: threading.Event | None = None) -> bool:
        clock = sink.deadline_clock
        assert isinstance(clock, MockClock), "a wait on real time"
        seen.waits.append(deadline - clock())
        seen.then(len(seen.waits))
        if seen.jump:
            clock.advance(max(0.0, deadline - clock()))
        return wait_until(sink, deadline, event)

    monkeypatch.setattr(sinks_otlp._Retry, "get_backoff_time", drawn)
    monkeypatch.setattr(OtlpHttpSink, "wait_until", jumping)
    return seen


@pytest.fixture
def least_jitter(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each backoff jittered down to its least (half): the most tries a budget allows."""
    monkeypatch.setattr(random, "uniform", lambda low, high: low)


@pytest.fixture
def made() -> Iterator[list[OtlpHttpSink]]:
    """Sinks a test made itself, closed after it (as the tracer closes its own)."""
    sinks: list[OtlpHttpSink] = []
    yield sinks
    for sink in sinks:
        sink.close()


@pytest.fixture
def make(made: list[OtlpHttpSink]) -> Callable[..., OtlpHttpSink]:
    """``make(location, options, cls=OtlpHttpSink)``: a sink, opened, closed after the test."""

    def make(
        location: str, options: dict[str, str] | None = None, cls: type[OtlpHttpSink] = OtlpHttpSink
    ) -> OtlpHttpSink:
        sink = cls(location, options or {})
        sink.open()
        made.append(sink)
        return sink

    return make


def _line(**fields: Any) -> bytes:
    return msgspec.json.encode(fields) + b"\n"


def _opened(**meta: Any) -> dict[str, Any]:
    return {
        "event": "trace_opened",
        "time": 1700000000.123456,
        "run_id": RUN,
        "seq": 0,
        "schema": 1,
        "sdk_version": "9.9.9",
        "pid": 4242,
        "host": "node-7",
        "meta": meta,
    }


def _free_port() -> int:
    """A port nobody listens on (bound, then let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def _user_lines(receiver: Receiver) -> list[dict[str, Any]]:
    return [line for line in receiver.lines_kept if line["event"] not in LIFECYCLE]


def _closed(sink: object) -> dict[str, Any]:
    """The run's trace_closed, as the memory sink beside the otlp one has it."""
    assert isinstance(sink, MemorySink)
    closed: dict[str, Any] = json.loads(sink.lines()[-1])
    assert closed["event"] == "trace_closed"
    return closed


def _warnings(log: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in log.records if r.levelno >= logging.WARNING]


async def _emit(h: Handle, start: int, stop: int) -> None:
    for i in range(start, stop):
        h.emit(dispatched(i))


def _wait_for(condition: Callable[[], bool], within: float = 20.0) -> None:
    end = time.monotonic() + within
    while not condition():
        assert time.monotonic() < end, "waited too long"
        time.sleep(0.01)


def _as_received(text: str) -> str:
    """A header value sent as UTF-8, as the receiver reads it (latin-1, as HTTP says)."""
    return text.encode().decode("latin-1")


# --- the mapping ------------------------------------------------------------------


def test_a_line_becomes_a_log_record_with_every_field_an_attribute(
    receiver: Receiver, make: Callable[..., OtlpHttpSink]
) -> None:
    event = {
        "event": "step_trained",
        "time": 1700000001.5,
        "run_id": RUN,
        "seq": 1,
        "s": "x",
        "i": 3,
        "big": 2**70,
        "neg": -(2**63),
        "f": 0.25,
        "b": True,
        "none": None,
        "empty": [],
        "list": [1, "a", None],
        "obj": {"k": {"n": 1}},
        "nobj": {},
    }
    sink = make(receiver.location)
    before = time.time_ns()
    sink.write(_line(**_opened(**{"service.name": "trainer"})) + _line(**event))
    after = time.time_ns()
    opened, entry = receiver.entries
    record = entry.record
    assert opened.record.event_name == "trace_opened"
    assert opened.record.time_unix_nano == 1700000000_123456000
    assert record.event_name == "step_trained"
    assert record.time_unix_nano == 1700000001_500000000
    assert before <= record.observed_time_unix_nano <= after
    assert not record.HasField("body")
    kinds = {kv.key: kv.value.WhichOneof("value") for kv in record.attributes}
    assert list(kinds) == ["run_id", "seq", *list(event)[4:]]  # envelope first, then in order
    assert kinds == {
        "run_id": "string_value",
        "seq": "int_value",
        "s": "string_value",
        "i": "int_value",
        "big": "string_value",  # beyond 64 bits: its decimal string
        "neg": "int_value",
        "f": "double_value",
        "b": "bool_value",
        "none": None,  # null: an empty value
        "empty": "array_value",  # an empty list is still a list
        "list": "array_value",
        "obj": "kvlist_value",
        "nobj": "kvlist_value",
    }
    assert entry.line == {**event, "big": str(2**70)}
    assert entry.resource == {
        "service.name": "trainer",
        "host.name": "node-7",
        "process.pid": 4242,
        "rollout_trace.run_id": RUN,
    }
    assert entry.scope == ("rollout_trace", "9.9.9")  # the sdk_version that wrote the run


def test_a_line_that_is_no_event_goes_as_its_text(
    receiver: Receiver, make: Callable[..., OtlpHttpSink]
) -> None:
    sink = make(receiver.location, {})
    sink.write(b"[1, 2]\nnot json\n" + _line(**_opened()))
    not_events = [e for e in receiver.entries if not e.record.event_name]
    assert [e.line["body"] for e in not_events] == ["[1, 2]", "not json"]
    assert len(receiver.entries) == 3


def test_a_traced_run_comes_back_line_for_line(receiver: Receiver) -> None:
    """Through the tracer: the records read back equal the lines a memory sink got,
    times to the last digit."""
    with rt.sync_tracer(receiver.uri, "memory://", meta={"x": [1, None, {}]}) as t:
        for i in range(300):
            t.emit(dispatched(i))
    memory = t.sinks[1]
    assert isinstance(memory, MemorySink)
    assert receiver.lines_kept == [json.loads(line) for line in memory.lines()]


# Where service.name comes from: (meta, variables, service.name sent).
SERVICE_NAMES = [
    ({"service.name": "a"}, {"OTEL_SERVICE_NAME": "b"}, "a"),  # meta wins over the variable
    ({"service_name": "a"}, {}, "a"),  # the snake_case key too
    ({"service.name": "a", "service_name": "c"}, {}, "a"),  # the dotted key first
    ({"service.name": 7}, {"OTEL_SERVICE_NAME": "b"}, "b"),  # not a string: not a name
    # As OpenTelemetry's SDKs: OTEL_SERVICE_NAME over OTEL_RESOURCE_ATTRIBUTES.
    ({}, {"OTEL_SERVICE_NAME": "b", "OTEL_RESOURCE_ATTRIBUTES": "service.name=c"}, "b"),
    ({}, {"OTEL_RESOURCE_ATTRIBUTES": "service.name=c%20d"}, "c d"),  # percent-decoded
    ({}, {}, "rollout_trace"),  # the default
]


@pytest.mark.parametrize(("meta", "env", "name"), SERVICE_NAMES)
def test_service_name(
    meta: dict[str, Any],
    env: dict[str, str],
    name: str,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with rt.sync_tracer(receiver.uri, meta=meta) as t:
        t.emit(dispatched(0))
    names = {e.resource["service.name"] for e in receiver.entries}
    assert names == {name}
    assert len(receiver.entries) == 3


def test_resource_attributes_from_the_run_and_the_variable(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=prod, team=r%2Cl,host.name=elsewhere"
    )
    with rt.sync_tracer(receiver.uri) as t:
        t.emit(dispatched(0))
    opened = receiver.entries[0].line
    assert opened["pid"] == os.getpid()
    resources = [e.resource for e in receiver.entries]
    assert resources == [resources[0]] * 3  # one resource for the run
    assert resources[0] == {
        "deployment.environment": "prod",
        "team": "r,l",
        "host.name": opened["host"],  # the run's own facts win over the variable
        "service.name": "rollout_trace",
        "process.pid": opened["pid"],
        "rollout_trace.run_id": opened["run_id"],
    }


def test_each_run_of_a_write_has_its_own_resource(
    receiver: Receiver, make: Callable[..., OtlpHttpSink]
) -> None:
    other = "f" * 32
    sink = make(receiver.location, {})
    sink.write(
        _line(**_opened())
        + _line(**{**_opened(), "run_id": other, "pid": 7})
        + _line(event="x", time=1.0, run_id=RUN, seq=1)
        + _line(event="x", time=1.0, run_id=other, seq=1)
    )
    pids = {e.line["run_id"]: e.resource["process.pid"] for e in receiver.entries}
    assert pids == {RUN: 4242, other: 7}
    assert {e.resource["rollout_trace.run_id"] for e in receiver.entries} == {RUN, other}


def test_a_large_write_goes_in_several_requests_of_whole_lines(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch, make: Callable[..., OtlpHttpSink]
) -> None:
    monkeypatch.setattr(sinks_otlp, "REQUEST_BYTES", 10_000)
    data = b"".join(
        _line(event="x", time=1.5, run_id=RUN, seq=i, pad="p" * 50) for i in range(1000)
    )
    make(receiver.location, {}).write(data)
    assert len(receiver.seen) > 5
    assert [line["seq"] for line in receiver.lines_kept] == list(range(1000))


# --- the variables, and how they meet the URI ---------------------------------------

# (URI location, variables, the request path the receiver sees). "{r}" is the
# receiver's host:port, "{dead}" one where nobody listens.
ENDPOINTS = [
    ("", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://{r}"}, "/v1/logs"),  # /v1/logs appended
    ("", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://{r}/base/"}, "/base/v1/logs"),  # under a path
    # The logs variable is used as is, and wins over the generic one.
    (
        "",
        {
            "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": "http://{r}/in",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "{dead}",
        },
        "/in",
    ),
    ("{r}", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://{dead}"}, "/v1/logs"),  # the URI wins
    ("{r}", {"OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": "http://{dead}/v1/logs"}, "/v1/logs"),  # both
    ("{r}/custom/logs", {}, "/custom/logs"),  # a path in the URI is used as is
]


@pytest.mark.parametrize(("location", "env", "path"), ENDPOINTS)
def test_endpoint(
    location: str,
    env: dict[str, str],
    path: str,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
    made: list[OtlpHttpSink],
) -> None:
    names = {"r": receiver.location, "dead": f"127.0.0.1:{_free_port()}"}
    for key, value in env.items():
        monkeypatch.setenv(key, value.format(**names))
    sink = parse_uri(f"otlp+http://{location.format(**names)}?timeout_s=1").build(
        run_id=RUN, pid=1, host="h"
    )
    assert isinstance(sink, OtlpHttpSink)
    made.append(sink)
    sink.write(_line(**_opened()))
    assert [s.path for s in receiver.seen] == [path]
    assert len(receiver.entries) == 1


def test_the_default_endpoint_is_local() -> None:
    assert OtlpHttpSink("", {}).url == "http://localhost:4318/v1/logs"
    assert OtlpHttpSink("collector", {}).url == "http://collector:4318/v1/logs"  # OTLP's port
    assert OtlpHttpsSink("collector", {}).url == "https://collector:443/v1/logs"
    assert OtlpHttpSink("[::1]:9", {}).url == "http://[::1]:9/v1/logs"


# (variables, headers the receiver must see, headers it must not).
HEADERS = [
    # Percent-decoded, blanks around keys and values dropped.
    (
        {"OTEL_EXPORTER_OTLP_HEADERS": "api-key=s3cr%3Dt, x-team = rl "},
        {"api-key": "s3cr=t", "x-team": "rl"},
        [],
    ),
    # The logs variable replaces the generic one, whole.
    (
        {"OTEL_EXPORTER_OTLP_HEADERS": "a=1", "OTEL_EXPORTER_OTLP_LOGS_HEADERS": "b=2"},
        {"b": "2"},
        ["a"],
    ),
    ({}, {"content-type": "application/x-protobuf"}, ["content-encoding"]),  # none set
    # Text beyond ASCII goes as its UTF-8 bytes, typed or percent-encoded; a tab is kept.
    (
        {"OTEL_EXPORTER_OTLP_HEADERS": "x-typed=\u4e2d,x-enc=%E4%B8%AD%C3%A9,x-tab=a%09b"},
        {"x-typed": _as_received("\u4e2d"), "x-enc": _as_received("\u4e2d\u00e9"), "x-tab": "a\tb"},
        [],
    ),
]


@pytest.mark.parametrize(("env", "present", "absent"), HEADERS)
def test_headers_from_the_variables(
    env: dict[str, str],
    present: dict[str, str],
    absent: list[str],
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
    make: Callable[..., OtlpHttpSink],
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    make(receiver.location, {}).write(_line(**_opened()))
    (seen,) = receiver.seen
    headers = {k.lower(): v for k, v in seen.headers.items()}
    assert {k: headers.get(k) for k in present} == present
    assert not set(absent) & set(headers)


# (options, variables, whether the body is gzip).
COMPRESSION = [
    ({"compression": "gzip"}, {}, True),  # the option
    ({}, {"OTEL_EXPORTER_OTLP_COMPRESSION": "gzip"}, True),  # the generic variable
    ({}, {"OTEL_EXPORTER_OTLP_LOGS_COMPRESSION": "GZIP"}, True),  # the logs one, any case
    # The logs variable over the generic one, the option over both.
    (
        {},
        {"OTEL_EXPORTER_OTLP_COMPRESSION": "gzip", "OTEL_EXPORTER_OTLP_LOGS_COMPRESSION": "none"},
        False,
    ),
    ({"compression": "none"}, {"OTEL_EXPORTER_OTLP_COMPRESSION": "gzip"}, False),
    ({}, {}, False),  # none by default, as the OTLP specification says
]


@pytest.mark.parametrize(("options", "env", "gzipped"), COMPRESSION)
def test_compression(
    options: dict[str, str],
    env: dict[str, str],
    gzipped: bool,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
    make: Callable[..., OtlpHttpSink],
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    make(receiver.location, options).write(_line(**_opened()) * 3)
    (seen,) = receiver.seen
    assert (seen.headers.get("Content-Encoding") == "gzip") is gzipped
    assert len(receiver.entries) == 3  # decoded either way


# (options, variables, seconds a write may take).
TIMEOUTS = [
    ({}, {}, 5.0),  # the default, below the tracer's close_timeout
    ({}, {"OTEL_EXPORTER_OTLP_TIMEOUT": "1500"}, 1.5),  # milliseconds, as the spec says
    ({}, {"OTEL_EXPORTER_OTLP_TIMEOUT": "1500", "OTEL_EXPORTER_OTLP_LOGS_TIMEOUT": "250"}, 0.25),
    ({"timeout_s": "2"}, {"OTEL_EXPORTER_OTLP_LOGS_TIMEOUT": "250"}, 2.0),  # the option wins
]


@pytest.mark.parametrize(("options", "env", "seconds"), TIMEOUTS)
def test_timeout(
    options: dict[str, str], env: dict[str, str], seconds: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert OtlpHttpSink("h:1", options).timeout_s == seconds


# (URI, variables, words the error must hold).
BAD = [
    ("otlp+http://h?timeout_s=0", {}, ["timeout_s='0'", "seconds above 0"]),
    ("otlp+http://h?timeout_s=soon", {}, ["timeout_s='soon'", "seconds above 0"]),
    ("otlp+http://h?timeout_s=inf", {}, ["timeout_s='inf'"]),
    ("otlp+http://h?compression=zstd", {}, ["compression='zstd'", "gzip, none"]),
    ("otlp+http://h?retries=3", {}, ["unknown option 'retries'", "known: compression, timeout_s"]),
    ("otlp+http://h:99999", {}, ["bad port"]),
    ("otlp+http://user@h:4318", {}, ["not host[:port][/path]"]),
    (
        "otlp+http://",
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"},
        ["$OTEL_EXPORTER_OTLP_ENDPOINT=", "http:// or https://"],
    ),
    (
        "otlp+http://",
        {"OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": "ftp://c/"},
        ["$OTEL_EXPORTER_OTLP_LOGS_ENDPOINT="],
    ),
    # otlp+https:// sent to an http:// endpoint would put the headers (often a
    # token) in clear text: refused, naming the variable and its value.
    (
        "otlp+https://",
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_HEADERS": "k=v"},
        ["$OTEL_EXPORTER_OTLP_ENDPOINT='http://c:4318'", "needs an https://", "otlp+http://"],
    ),
    (
        "otlp+https://",
        {"OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": "http://c:4318/v1/logs"},
        ["$OTEL_EXPORTER_OTLP_LOGS_ENDPOINT='http://c:4318/v1/logs'", "needs an https://"],
    ),
    # A CA file that is missing or not a certificate: refused with the URI,
    # not found at the first write (and retried as a network fault).
    (
        "otlp+https://h",
        {"OTEL_EXPORTER_OTLP_CERTIFICATE": "/nonexistent/ca.pem"},
        ["$OTEL_EXPORTER_OTLP_CERTIFICATE='/nonexistent/ca.pem'", "not a CA file", "No such"],
    ),
    (
        "otlp+https://h",
        {"OTEL_EXPORTER_OTLP_LOGS_CERTIFICATE": __file__},  # Python, not PEM
        [f"$OTEL_EXPORTER_OTLP_LOGS_CERTIFICATE={__file__!r}", "not a CA file", "certificate"],
    ),
    (
        "otlp+http://h",
        {"OTEL_EXPORTER_OTLP_TIMEOUT": "soon"},
        ["$OTEL_EXPORTER_OTLP_TIMEOUT='soon'", "milliseconds"],
    ),
    (
        "otlp+http://h",
        {"OTEL_EXPORTER_OTLP_LOGS_COMPRESSION": "br"},
        ["$OTEL_EXPORTER_OTLP_LOGS_COMPRESSION='br'", "gzip, none"],
    ),
    (
        "otlp+http://h",
        {"OTEL_EXPORTER_OTLP_HEADERS": "a=1,token"},
        ["$OTEL_EXPORTER_OTLP_HEADERS", "'token'", "key=value"],
    ),
    ("otlp+http://h", {"OTEL_RESOURCE_ATTRIBUTES": "=x"}, ["$OTEL_RESOURCE_ATTRIBUTES", "'=x'"]),
    # A CR LF would end the header and start another: refused, not sent.
    (
        "otlp+http://h",
        {"OTEL_EXPORTER_OTLP_HEADERS": "x-a=b%0D%0AInjected: yes"},
        ["$OTEL_EXPORTER_OTLP_HEADERS", "header 'x-a'", "'\\r'", "control characters"],
    ),
    # A NUL, in the logs variable.
    (
        "otlp+http://h",
        {"OTEL_EXPORTER_OTLP_LOGS_HEADERS": "ok=1,x-b=a%00b"},
        ["$OTEL_EXPORTER_OTLP_LOGS_HEADERS", "header 'x-b'", "'\\x00'"],
    ),
    # A raw line break in the variable itself.
    (
        "otlp+http://h",
        {"OTEL_EXPORTER_OTLP_HEADERS": "x-c=a\nb"},
        ["$OTEL_EXPORTER_OTLP_HEADERS", "header 'x-c'", "'\\n'"],
    ),
    # A proxy that is not http:// or https://, shown without its credentials.
    (
        "otlp+http://h",
        {"HTTP_PROXY": "socks5://rl:s3cret@p:1080"},
        ["'socks5://p:1080'", "$HTTP_PROXY", "not an http:// or https:// URL"],
    ),
    # A name with a blank, or a colon, is not an HTTP token.
    (
        "otlp+http://h",
        {"OTEL_EXPORTER_OTLP_HEADERS": "bad key=v"},
        ["$OTEL_EXPORTER_OTLP_HEADERS", "'bad key'", "letters, digits"],
    ),
    (
        "otlp+http://h",
        {"OTEL_EXPORTER_OTLP_HEADERS": "x%3Ay=v"},
        ["$OTEL_EXPORTER_OTLP_HEADERS", "'x:y'", "letters, digits"],
    ),
]


@pytest.mark.parametrize(("uri", "env", "words"), BAD)
def test_bad_values_are_named_when_the_uri_is_parsed(
    uri: str, env: dict[str, str], words: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(rt.SinkOptionError) as caught:
        parse_uri(uri)
    for word in words:
        assert word in str(caught.value)
    assert uri in str(caught.value)


def test_a_bad_header_value_is_not_repeated_in_the_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20s3cret%0A")
    with pytest.raises(rt.SinkOptionError, match="header 'authorization'") as caught:
        parse_uri("otlp+http://h")
    assert "s3cret" not in str(caught.value)  # a header value is often a secret


def test_without_opentelemetry_proto_the_error_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.proto.collector.logs.v1", None)
    with pytest.raises(rt.SinkOptionError, match=r"pip install 'rollout-trace\[otlp\]'"):
        parse_uri("otlp+http://h:4318")


def test_without_urllib3_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "urllib3", None)
    monkeypatch.delitem(sys.modules, "rollout_trace.sinks.otlp")
    with pytest.raises(ImportError, match=r"pip install 'rollout-trace\[otlp\]'"):
        importlib.import_module("rollout_trace.sinks.otlp")


def test_both_schemes_are_registered() -> None:
    assert parse_uri("otlp+http://h:4318").factory is OtlpHttpSink
    assert parse_uri("otlp+https://h").factory is OtlpHttpsSink


# --- faults, through the tracer --------------------------------------------------------

# The sinks beside the otlp one: a memory sink, whose trace_closed tells the
# otlp sink's own count, or none.
BESIDE = [["memory://"], []]


def _spent_the_budget_on_the_clock(backoffs: _Backoffs, moved: float, error: str) -> None:
    """A request to a collector that is down, with timeout_s=1.25 and the
    backoffs jittered to their least: waits of 0.125, 0.25 and 0.5 s on the
    clock (``moved``: all it moved); the next, 1 s, would end past the 0.375 s
    left of the budget: the fourth try is the last."""
    assert backoffs.drawn == [(1, 0.125), (2, 0.25), (3, 0.5), (4, 1.0)]
    assert backoffs.waits == [0.125, 0.25, 0.5]
    assert moved == 0.875
    assert "within timeout_s=1.25 (4 tries)" in error


@pytest.mark.usefixtures("least_jitter")
@pytest.mark.parametrize("beside", BESIDE, ids=["with-memory", "alone"])
@pytest.mark.parametrize("driver", DRIVERS, ids=IDS)
def test_a_collector_down_at_open_does_not_stop_the_job(
    driver: Driver,
    beside: list[str],
    receiver: Receiver,
    backoffs: _Backoffs,
    trace_log: pytest.LogCaptureFixture,
) -> None:
    receiver.down()
    uri = f"{receiver.uri}?timeout_s=1.25"
    clock = MockClock()
    start = clock()

    async def scenario(h: Handle) -> bool:
        await _emit(h, 0, 100)
        return await h.flush()

    out = driver.run([uri, *beside], scenario, deadline_clock=clock)
    # A flush answers for the sinks still working: none is left when it was alone.
    assert out.value is bool(beside)
    (warning,) = _warnings(trace_log)  # reported once
    assert uri in warning and "ConnectionRefusedError" in warning
    _spent_the_budget_on_the_clock(backoffs, clock() - start, warning)
    receiver.up()
    assert receiver.entries == []
    if beside:
        (tally, _) = _closed(out.tracer.sinks[1])["sinks"]
        assert tally["written"] == 0 and "could not send" in tally["error"]
        assert out.counts.written == 100
    else:
        assert (out.counts.written, out.counts.dropped) == (0, 100)


@pytest.mark.parametrize("times_out", [False, True], ids=["stalled-before", "timed-out"])
def test_a_refused_connection_is_reported_as_refused_however_loaded_the_machine(
    times_out: bool,
    monkeypatch: pytest.MonkeyPatch,
    backoffs: _Backoffs,
    make: Callable[..., OtlpHttpSink],
) -> None:
    """The second try's thread stalls past the deadline before it connects, and its
    connection then is refused (or times out): the error still names the refusal."""
    clock = MockClock()
    lookups: list[str] = []
    real = socket.getaddrinfo

    def getaddrinfo(host: str, *args: Any, **kwargs: Any) -> Any:
        lookups.append(host)
        if len(lookups) == 2:
            clock.advance(60)  # a thread of a loaded machine, run again long after
            if times_out:
                raise TimeoutError("timed out")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    sink = make(f"127.0.0.1:{_free_port()}", {"timeout_s": "5"})
    sink.deadline_clock = clock
    with pytest.raises(OtlpExportError, match=r"within timeout_s=5 \(2 tries\)") as caught:
        sink.write(_line(**_opened()))
    assert "ConnectionRefusedError" in str(caught.value)
    assert len(lookups) == 2 and len(backoffs.waits) == 1


@pytest.mark.parametrize("driver", DRIVERS, ids=IDS)
def test_a_collector_back_within_the_budget_loses_nothing(
    driver: Driver, receiver: Receiver, backoffs: _Backoffs, trace_log: pytest.LogCaptureFixture
) -> None:
    def back(n: int) -> None:
        if n == 2:  # as the write begins its second wait: its third try is taken
            receiver.up()

    backoffs.then = back

    async def scenario(h: Handle) -> bool:
        await _emit(h, 0, 50)
        assert await h.flush()
        receiver.down()
        await _emit(h, 50, 100)
        return await h.flush()  # the write retries until the collector is back

    out = driver.run([receiver.uri], scenario, deadline_clock=MockClock())
    assert out.value is True
    assert _warnings(trace_log) == []
    assert len(backoffs.drawn) == 2
    backoffs.spent(gave_up=False)
    assert [line["seq"] for line in _user_lines(receiver)] == list(range(1, 101))
    assert receiver.lines_kept[-1]["written"] == out.counts.written == 100


@pytest.mark.usefixtures("least_jitter")
@pytest.mark.parametrize("driver", DRIVERS, ids=IDS)
def test_a_collector_down_past_the_budget_stops_the_sink_with_honest_counts(
    driver: Driver, receiver: Receiver, backoffs: _Backoffs, trace_log: pytest.LogCaptureFixture
) -> None:
    uri = f"{receiver.uri}?timeout_s=1.25"
    clock = MockClock()
    start = clock()

    async def scenario(h: Handle) -> tuple[bool, bool, bool]:
        await _emit(h, 0, 50)
        first = await h.flush()
        receiver.down()
        await _emit(h, 50, 100)
        second = await h.flush()
        receiver.up()  # back, but the sink is not used again
        await _emit(h, 100, 150)
        return first, second, await h.flush()

    out = driver.run([uri, "memory://"], scenario, deadline_clock=clock)
    assert out.value == (True, True, True)  # the memory sink, still working, has all
    (warning,) = _warnings(trace_log)
    assert uri in warning
    _spent_the_budget_on_the_clock(backoffs, clock() - start, warning)
    (tally, memory) = _closed(out.tracer.sinks[1])["sinks"]
    held = _user_lines(receiver)
    assert [line["seq"] for line in held] == list(range(1, 51))
    assert tally["written"] == len(held) and tally["error"]
    assert memory["written"] == out.counts.written == 150


def _held(receiver: Receiver) -> bool:
    """The collector holds the one request it got, unanswered (``delay``)."""
    with receiver.lock:
        return [s.status for s in receiver.seen] == [0]


@pytest.mark.timeout(60)  # a hang guard: an emit or a close that waits, waits for ever
@pytest.mark.usefixtures("only_the_clock")
@pytest.mark.parametrize("driver", DRIVERS, ids=IDS)
def test_a_hung_collector_never_blocks_emit(
    driver: Driver,
    receiver: Receiver,
    trace_log: pytest.LogCaptureFixture,
) -> None:
    receiver.delay = math.inf  # holds every request, never answers
    uri = f"{receiver.uri}?timeout_s=30"  # on the clock, which stands still until the close
    clock = WatchedClock()

    async def scenario(h: Handle) -> bool:
        while not _held(receiver):  # the write of trace_opened hangs
            await h.sleep(0.005)
        await _emit(h, 0, 10_000)
        # A burst of emits, all taken while the write still hangs: none waited for it.
        return _held(receiver)

    out = driver.run(
        [uri, "memory://"],
        scenario,
        close_timeout=60,
        deadline_clock=clock,
        # The close waits for the hung write until its timeout_s, not for close_timeout.
        closing=lambda: advancing(clock, 30.0),
    )
    receiver.down()  # what it still holds is dropped, unanswered
    assert out.value is True
    (tally, _) = _closed(out.tracer.sinks[1])["sinks"]
    assert tally["written"] == len(_user_lines(receiver)) == 0
    assert "timed out" in tally["error"]
    assert out.counts.written == 10_000
    assert len(_warnings(trace_log)) == 1


@pytest.mark.parametrize("driver", DRIVERS, ids=IDS)
def test_a_slow_collector_gets_everything(
    driver: Driver,
    receiver: Receiver,
    trace_log: pytest.LogCaptureFixture,
) -> None:
    # The first answer is held for as long as the emits take, then every one
    # comes: the write's budget, on a clock that stands still, never runs out.
    receiver.delay = math.inf
    clock = MockClock()

    async def scenario(h: Handle) -> tuple[bool, bool]:
        while not _held(receiver):
            await h.sleep(0.005)
        await _emit(h, 0, 10_000)
        held = _held(receiver)  # the emits did not wait for the collector
        receiver.release()
        return held, await h.flush()

    out = driver.run([receiver.uri], scenario, deadline_clock=clock)
    assert out.value == (True, True)
    assert _warnings(trace_log) == []
    assert len(_user_lines(receiver)) == out.counts.written == 10_000


# Answers that are tried again: (status, headers, how many times, the seconds
# the collector asks to wait).
RETRIED = [
    (503, {}, 2, 0.0),  # Service Unavailable, twice, then taken
    (502, {}, 1, 0.0),  # Bad Gateway
    (504, {}, 3, 0.0),  # Gateway Timeout, three times
    (429, {"Retry-After": "1"}, 1, 1.0),  # Too Many Requests: waits the second it asks
]


@pytest.mark.parametrize(("status", "headers", "times", "asked"), RETRIED)
def test_retried_answers_lose_nothing(
    status: int,
    headers: dict[str, str],
    times: int,
    asked: float,
    receiver: Receiver,
    backoffs: _Backoffs,
    trace_log: pytest.LogCaptureFixture,
) -> None:
    receiver.fail_next(times, status, headers)
    clock = MockClock()
    start = clock()

    async def scenario(h: Handle) -> bool:
        await _emit(h, 0, 100)
        return await h.flush()

    out = ASYNCIO.run([receiver.uri], scenario, deadline_clock=clock)
    assert out.value is True
    assert _warnings(trace_log) == []
    assert [s.status for s in receiver.seen[: times + 1]] == [status] * times + [200]
    # A wait before each try again, on the clock: the backoff, or the longer
    # one the collector asked for.
    assert len(backoffs.drawn) == times
    spent = backoffs.spent(gave_up=False, asked=asked)
    assert all(wait >= asked for wait in backoffs.waits)
    assert clock() - start == pytest.approx(spent, abs=1e-9)
    assert len(_user_lines(receiver)) == out.counts.written == 100


# Answers that fail the write at once: (status, what it means).
FINAL = [
    (400, "Bad Request"),
    (401, "Unauthorized"),
    (404, "Not Found: a wrong path"),
    (413, "Payload Too Large"),
    (500, "Internal Server Error: not among the retried ones"),
]


@pytest.mark.parametrize("driver", DRIVERS, ids=IDS)
@pytest.mark.parametrize(("status", "meaning"), FINAL)
def test_other_errors_fail_at_once_and_are_reported_once(
    status: int,
    meaning: str,
    driver: Driver,
    receiver: Receiver,
    trace_log: pytest.LogCaptureFixture,
) -> None:
    receiver.fail_next(1000, status)

    async def scenario(h: Handle) -> bool:
        await _emit(h, 0, 100)
        return await h.flush()

    out = driver.run([receiver.uri, "memory://"], scenario)
    assert len(receiver.seen) == 1  # not tried again
    (warning,) = _warnings(trace_log)
    assert f"HTTP {status}" in warning and "not retried" in warning
    (tally, _) = _closed(out.tracer.sinks[1])["sinks"]
    assert tally["written"] == len(_user_lines(receiver)) == 0


def test_a_retry_after_past_the_budget_fails_at_once(
    receiver: Receiver, make: Callable[..., OtlpHttpSink]
) -> None:
    receiver.fail_next(1, 503, {"Retry-After": "30"})
    sink = make(receiver.location, {"timeout_s": "2"})
    sink.deadline_clock = MockClock()  # stands still: a wait for the answer's 30 s never ends
    with pytest.raises(OtlpExportError, match="it asked to wait 30 s"):
        at_once(lambda: sink.write(_line(**_opened())), "the write")
    assert len(receiver.seen) == 1


def _gave_up_at_the_budget(backoffs: _Backoffs, moved: float, budget: float, error: str) -> None:
    """A request tried until its budget ran out on the clock: the waits between
    its tries moved the clock (``moved``), and nothing else did; the next
    backoff would have ended past the budget. The error counts the tries."""
    spent = backoffs.spent(gave_up=True)
    assert moved == pytest.approx(spent, abs=1e-9)
    assert spent < budget <= spent + backoffs.drawn[-1][1] + 1e-9
    assert f"within timeout_s={budget:g} ({len(backoffs.drawn)} tries)" in error


# Retry-After values that ask for less than the backoff, which they cannot shorten.
SHORT_RETRY_AFTER = [
    pytest.param("0", id="zero"),
    pytest.param("Wed, 21 Oct 2015 07:28:00 GMT", id="a-date-gone-by"),
]


@pytest.mark.parametrize("retry_after", SHORT_RETRY_AFTER)
def test_a_short_retry_after_does_not_cut_the_backoff(
    retry_after: str,
    receiver: Receiver,
    backoffs: _Backoffs,
    make: Callable[..., OtlpHttpSink],
) -> None:
    receiver.fail_next(100, 429, {"Retry-After": retry_after})  # busy past the budget
    sink = make(receiver.location, {"timeout_s": "2"})
    sink.deadline_clock = clock = MockClock()
    start = clock()
    with pytest.raises(OtlpExportError, match="within timeout_s=2") as caught:
        sink.write(_line(**_opened()))
    # Each wait the backoff, from 0.25 s (jittered down to half), doubling,
    # within the budget of 2 s: four or five tries, not a loop of a hundred
    # against a busy collector.
    _gave_up_at_the_budget(backoffs, clock() - start, 2.0, str(caught.value))
    assert len(receiver.seen) == len(backoffs.drawn)
    assert len(receiver.seen) in (4, 5)


def _trickled(pause: float) -> Callable[[Receiver], None]:
    def setup(receiver: Receiver) -> None:
        receiver.trickle = pause

    return setup


def _never_answers(receiver: Receiver) -> None:
    receiver.delay = math.inf


def _always_busy(receiver: Receiver) -> None:
    receiver.fail_next(10_000, 503)


# What the write meets, with timeout_s=30 on the sink's clock, which the test
# moves: (how to set it up, whether it is taken in time). A name lookup is
# not among them: it takes what the system's resolver takes.
DEADLINES = [
    # An answer a byte every second: each read is quick, the whole answer is not.
    pytest.param(_trickled(1.0), False, id="trickled-answer"),
    # No answer at all.
    pytest.param(_never_answers, False, id="no-answer"),
    # An answer trickled while the clock stands still is taken.
    pytest.param(_trickled(0.002), True, id="trickled-within-the-budget"),
]


@pytest.mark.usefixtures("only_the_clock")
@pytest.mark.parametrize(("setup", "taken"), DEADLINES)
def test_timeout_s_is_a_deadline_for_a_whole_request(
    setup: Callable[[Receiver], None],
    taken: bool,
    receiver: Receiver,
    make: Callable[..., OtlpHttpSink],
) -> None:
    setup(receiver)
    sink = make(receiver.location, {"timeout_s": "30"})
    sink.deadline_clock = clock = WatchedClock()
    if taken:
        at_once(lambda: sink.write(_line(**_opened())), "the write")
        assert len(receiver.entries) == 1
        return
    with pytest.raises(OtlpExportError, match=r"within timeout_s=30 \(1 try\)"):
        # Still waiting just short of its deadline, over once past it.
        past_deadline(
            lambda: sink.write(_line(**_opened())),
            clock,
            30.0,
            ready=lambda: len(receiver.seen) == 1,
        )
    assert len(receiver.seen) == 1


def test_the_waits_between_tries_count_against_timeout_s(
    receiver: Receiver, make: Callable[..., OtlpHttpSink], monkeypatch: pytest.MonkeyPatch
) -> None:
    # 503 every time, and backoffs not jittered: 0.25 s, then 0.5 s. The
    # third try is at 0.75 s, and the next wait (1 s) would end past the
    # deadline (1 s): the write gives up then, without waiting.
    _always_busy(receiver)
    monkeypatch.setattr(random, "uniform", lambda low, high: high)
    sink = make(receiver.location, {"timeout_s": "1"})
    sink.deadline_clock = clock = MockClock()
    backoffs: list[float] = []
    waiting = threading.Event()
    wait_until = sink.wait_until

    def watched(deadline: float, event: threading.Event | None = None) -> bool:
        backoffs.append(deadline - clock())
        waiting.set()
        return wait_until(deadline, event)

    monkeypatch.setattr(sink, "wait_until", watched)
    writing = Helper(lambda: sink.write(_line(**_opened())), "test write")
    writing.thread.start()
    for tries, backoff in enumerate([0.25, 0.5], 1):
        assert waiting.wait(HANG_S), "the write never waited between tries"
        waiting.clear()
        assert (len(receiver.seen), backoffs[-1]) == (tries, backoff)
        # No try before the backoff is over on the clock, the next one once it is.
        clock.advance(backoff - SHORT_S)
        writing.thread.join(POLLS_S)
        assert len(receiver.seen) == tries and writing.thread.is_alive()
        clock.advance(SHORT_S)
    writing.thread.join(HANG_S)
    assert not writing.thread.is_alive(), "the write waited for a backoff past its deadline"
    with pytest.raises(OtlpExportError, match=r"within timeout_s=1 \(3 tries\)"):
        writing.result()
    assert backoffs == [0.25, 0.5]
    assert [seen.status for seen in receiver.seen] == [503] * 3


def _slow_answers(
    monkeypatch: pytest.MonkeyPatch,
    clock: MockClock,
    seconds: float,
    then: Callable[[Any], None] = lambda flight: None,
) -> None:
    """Each answer takes ``seconds`` on ``clock``: the clock moves that much as
    the sink begins to read it, then ``then(flight)`` runs (the request's)."""
    answer = OtlpHttpSink._answer

    def slow(sink: OtlpHttpSink, response: Any, flight: Any, n: int) -> None:
        clock.advance(seconds)
        then(flight)
        answer(sink, response, flight, n)

    monkeypatch.setattr(OtlpHttpSink, "_answer", slow)


# A write of several requests to a collector that takes its time over each, on
# the clock: (requests, seconds each answer takes, timeout_s). Each request has
# timeout_s of its own, as OTEL_EXPORTER_OTLP_TIMEOUT is "for each batch".
SLOW_REQUESTS = [
    (4, 0.4, "1"),  # 1.6 s in all, each request well within 1 s
    (2, 0.7, "1"),  # each request near its deadline
]


@pytest.mark.parametrize(("requests", "delay", "timeout_s"), SLOW_REQUESTS)
def test_timeout_s_is_a_deadline_for_each_request_of_a_write(
    requests: int,
    delay: float,
    timeout_s: str,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
    make: Callable[..., OtlpHttpSink],
) -> None:
    # Lines of one length, 100 of them a request.
    lines = [
        _line(event="x", time=1.5, run_id=RUN, seq=i, pad="p" * (9 - len(str(i))))
        for i in range(100 * requests)
    ]
    monkeypatch.setattr(sinks_otlp, "REQUEST_BYTES", 100 * len(lines[0]))
    data = b"".join(lines)
    sink = make(receiver.location, {"timeout_s": timeout_s})
    sink.deadline_clock = clock = MockClock()
    start = clock()
    left: list[float] = []
    _slow_answers(monkeypatch, clock, delay, lambda flight: left.append(flight.left()))
    sink.write(data)
    # Each request had timeout_s of its own, which its answer left the rest of.
    assert left == pytest.approx([float(timeout_s) - delay] * requests, abs=1e-9)
    assert clock() - start == pytest.approx(requests * delay)  # past one timeout_s
    assert len(receiver.seen) == requests
    assert [line["seq"] for line in receiver.lines_kept] == list(range(100 * requests))


@pytest.mark.usefixtures("only_the_clock")
@pytest.mark.parametrize("driver", DRIVERS, ids=IDS)
def test_a_slow_collector_is_not_given_up_after_a_burst(
    driver: Driver,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
    trace_log: pytest.LogCaptureFixture,
) -> None:
    # Requests of 20,000 bytes (about 100 events), each answered in 0.2 s on
    # the clock: a burst of 1000 events, queued while the first answer is
    # held, is a dozen. Its queued batches are gathered into writes of at
    # most max_write (one request, within timeout_s each), not into one of
    # them all (over 2 s: past close_timeout, given up as hung).
    monkeypatch.setattr(sinks_otlp, "REQUEST_BYTES", 20_000)
    monkeypatch.setattr(OtlpHttpSink, "max_write", 20_000)
    receiver.delay = math.inf
    clock = MockClock()
    _slow_answers(monkeypatch, clock, 0.2)
    lasted: list[float] = []  # each write's seconds on the clock
    write = OtlpHttpSink.write

    def timed(sink: OtlpHttpSink, data: bytes) -> None:
        began = clock()
        try:
            write(sink, data)
        finally:
            lasted.append(clock() - began)

    monkeypatch.setattr(OtlpHttpSink, "write", timed)

    async def scenario(h: Handle) -> bool:
        while not _held(receiver):
            await h.sleep(0.005)
        await _emit(h, 0, 1000)
        receiver.release()
        return await h.flush()

    out = driver.run(
        [f"{receiver.uri}?timeout_s=1", "memory://"],
        scenario,
        close_timeout=1.5,
        deadline_clock=clock,
    )
    assert out.value is True
    assert lasted == pytest.approx([0.2] * len(receiver.seen))  # one request a write
    assert _warnings(trace_log) == []
    (tally, _) = _closed(out.tracer.sinks[1])["sinks"]
    assert tally["error"] is None
    assert len(receiver.seen) >= 10
    assert len(_user_lines(receiver)) == tally["written"] == out.counts.written == 1000
    assert out.counts.dropped == 0


# What a write is doing when close() comes from another thread (the tracer
# closes a lone sink from a thread of its own once its write is given up as
# hung): (the collector's fault, waits between tries begun by then).
IN_FLIGHT = [
    # Waiting for an answer that does not come.
    pytest.param(lambda r: setattr(r, "delay", math.inf), 0, id="waiting-for-the-answer"),
    # Waiting between tries, the collector busy.
    pytest.param(lambda r: r.fail_next(10_000, 503), 1, id="between-tries"),
]


@pytest.mark.parametrize(("fault", "waits"), IN_FLIGHT)
def test_close_from_another_thread_ends_a_write_in_flight(
    fault: Callable[[Receiver], None],
    waits: int,
    receiver: Receiver,
    backoffs: _Backoffs,
    make: Callable[..., OtlpHttpSink],
) -> None:
    fault(receiver)
    sink = make(receiver.location, {"timeout_s": "60"})
    # The clock stands still, a wait too: nothing but the close ends the write.
    sink.deadline_clock = MockClock()
    backoffs.jump = False
    errors: list[BaseException] = []

    def write() -> None:
        try:
            sink.write(_line(**_opened()))
        except BaseException as exc:
            errors.append(exc)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    _wait_for(lambda: len(receiver.seen) == 1 and len(backoffs.waits) == waits)
    sink.close()
    writer.join(HANG_S)
    assert not writer.is_alive()
    assert len(backoffs.waits) == waits
    (error,) = errors
    assert isinstance(error, OtlpExportError) and "closed while sending" in str(error)
    seen = len(receiver.seen)
    with pytest.raises(OtlpExportError, match="is closed"):
        sink.write(_line(**_opened()))  # a closed sink connects no more
    assert len(receiver.seen) == seen


def test_a_partial_success_that_rejected_records_fails_the_write(
    receiver: Receiver, make: Callable[..., OtlpHttpSink]
) -> None:
    receiver.reject_next(3, "too big")
    sink = make(receiver.location, {})
    lines = b"".join(_line(event="x", time=1.0, run_id=RUN, seq=i) for i in range(10))
    with pytest.raises(OtlpExportError, match="rejected 3 of 10 records: too big"):
        sink.write(lines)
    assert len(receiver.entries) == 7  # the collector holds more than counted, never fewer


def test_a_partial_success_with_only_a_message_is_said_once(
    receiver: Receiver, trace_log: pytest.LogCaptureFixture, make: Callable[..., OtlpHttpSink]
) -> None:
    sink = make(receiver.location, {})
    for _ in range(2):
        receiver.reject_next(0, "slow down")
        sink.write(_line(**_opened()))
    assert len(receiver.entries) == 2
    (warning,) = _warnings(trace_log)
    assert "slow down" in warning


def test_a_connection_the_collector_closed_is_replaced_at_once(
    receiver: Receiver, backoffs: _Backoffs, make: Callable[..., OtlpHttpSink]
) -> None:
    sink = make(receiver.location, {})
    sink.deadline_clock = MockClock()
    sink.write(_line(**_opened()))
    receiver.down()
    receiver.up()
    sink.write(_line(**_opened()))
    assert len(receiver.entries) == 2
    assert backoffs.drawn == []  # a new connection at once, no try waited for


# --- how the collector frames its answers ------------------------------------------------

# Answers that end when the collector closes the connection (receiver settings).
FRAMINGS = [
    # HTTP/1.0 without a Content-Length: the body ends with the connection.
    pytest.param({"version": "HTTP/1.0", "length": False}, id="http1.0-ended-by-close"),
    # HTTP/1.1 with Connection: close, the body in a later write than the headers.
    pytest.param({"close": True, "body_after": 0.05}, id="http1.1-close-body-later"),
    # Python's http.server as it is by default: HTTP/1.0, a Content-Length, the
    # body in a write of its own.
    pytest.param({"version": "HTTP/1.0", "body_after": 0.05}, id="http1.0-body-later"),
]


@pytest.mark.parametrize("framing", FRAMINGS)
def test_an_answer_ended_by_closing_the_connection_is_read_and_each_request_sent_once(
    framing: dict[str, Any], receiver: Receiver, make: Callable[..., OtlpHttpSink]
) -> None:
    for name, setting in framing.items():
        setattr(receiver, name, setting)
    sink = make(receiver.location, {"timeout_s": "2"})
    for seq in range(3):  # each on a connection of its own, the last one closed
        sink.write(_line(event="x", time=1.0, run_id=RUN, seq=seq))
    assert [seen.status for seen in receiver.seen] == [200] * 3
    assert [line["seq"] for line in receiver.lines_kept] == [0, 1, 2]
    assert sink.requests == 3


@pytest.mark.parametrize("driver", DRIVERS, ids=IDS)
def test_every_record_reaches_an_http10_collector_once(
    driver: Driver, receiver: Receiver, trace_log: pytest.LogCaptureFixture
) -> None:
    # As Python's http.server answers: HTTP/1.0, the body after the headers.
    receiver.version = "HTTP/1.0"
    receiver.body_after = 0.01

    async def scenario(h: Handle) -> bool:
        for start in range(0, 300, 100):
            await _emit(h, start, start + 100)
            assert await h.flush()
        return True

    out = driver.run([receiver.uri, "memory://"], scenario)
    assert out.value is True
    assert _warnings(trace_log) == []
    memory = out.tracer.sinks[1]
    assert isinstance(memory, MemorySink)
    assert receiver.lines_kept == [json.loads(line) for line in memory.lines()]  # each once
    (tally, _) = _closed(memory)["sinks"]
    assert tally["error"] is None and tally["written"] == out.counts.written == 300
    assert [seen.status for seen in receiver.seen] == [200] * len(receiver.seen)


def test_a_request_answered_2xx_is_not_sent_again_when_its_answer_is_cut(
    receiver: Receiver, make: Callable[..., OtlpHttpSink]
) -> None:
    receiver.cut = True  # 200 and its headers, then the connection closed short of the body
    sink = make(receiver.location, {"timeout_s": "2"})
    with pytest.raises(OtlpExportError, match=r"answered HTTP 200 OK .*: not sent again"):
        sink.write(_line(**_opened()) * 3)
    assert [seen.status for seen in receiver.seen] == [200]  # one request, not tried again
    assert len(receiver.entries) == 3
    assert sink.requests == 0  # counted as not written: its answer was not read


# --- TLS ----------------------------------------------------------------------------------


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key (made with openssl)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            *(openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"),
            *("-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def test_https_with_the_certificate_variable(
    certificate: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
    make: Callable[..., OtlpHttpSink],
) -> None:
    cert, key = certificate
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    with Receiver(tls=context) as receiver:
        untrusted = make(receiver.location, {}, OtlpHttpsSink)
        with pytest.raises(OtlpExportError, match="not trusted"):
            untrusted.write(_line(**_opened()))
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", str(cert))
        sink = make(receiver.location, {}, OtlpHttpsSink)
        sink.write(_line(**_opened()))
        assert len(receiver.entries) == 1


# --- proxies ------------------------------------------------------------------------------


@pytest.fixture
def proxy() -> Iterator[Proxy]:
    with Proxy() as p:
        yield p


@pytest.mark.parametrize("variable", ["HTTP_PROXY", "http_proxy"])
def test_requests_go_through_the_proxy_the_environment_names(
    variable: str,
    receiver: Receiver,
    proxy: Proxy,
    monkeypatch: pytest.MonkeyPatch,
    make: Callable[..., OtlpHttpSink],
) -> None:
    # Credentials in the proxy's URL, percent-encoded, as curl takes them.
    monkeypatch.setenv(variable, proxy.url.replace("//", "//rl:p%40ss@"))
    sink = make(receiver.location, {})
    sink.write(_line(**_opened()))
    sink.write(_line(**_opened()))
    target = f"http://{receiver.location}/v1/logs"
    assert [(f.method, f.target) for f in proxy.requests] == [("POST", target)] * 2
    credentials = base64.b64encode(b"rl:p@ss").decode()
    to_proxy = {k.lower(): v for k, v in proxy.requests[0].headers.items()}
    assert to_proxy["proxy-authorization"] == f"Basic {credentials}"
    assert len(receiver.entries) == 2
    assert "proxy-authorization" not in {k.lower() for k in receiver.seen[0].headers}


@pytest.mark.parametrize(
    "no_proxy", ["127.0.0.1", "localhost, 127.0.0.1", "*", "127.0.0.1:{port}", "NO-MATCH"]
)
def test_no_proxy_lists_the_hosts_reached_without_it(
    no_proxy: str,
    receiver: Receiver,
    proxy: Proxy,
    monkeypatch: pytest.MonkeyPatch,
    make: Callable[..., OtlpHttpSink],
) -> None:
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    monkeypatch.setenv("NO_PROXY", no_proxy.format(port=receiver.port))
    make(receiver.location, {}).write(_line(**_opened()))
    assert len(receiver.entries) == 1
    assert len(proxy.requests) == (1 if no_proxy == "NO-MATCH" else 0)


def test_https_goes_through_the_proxy_in_a_tunnel(
    certificate: tuple[Path, Path],
    proxy: Proxy,
    monkeypatch: pytest.MonkeyPatch,
    make: Callable[..., OtlpHttpSink],
) -> None:
    cert, key = certificate
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", str(cert))
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{_free_port()}")  # for http:// only
    with Receiver(tls=context) as receiver:
        make(receiver.location, {}, OtlpHttpsSink).write(_line(**_opened()))
        assert [(f.method, f.target) for f in proxy.requests] == [("CONNECT", receiver.location)]
        assert len(receiver.entries) == 1
