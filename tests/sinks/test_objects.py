"""The object-store sinks (``s3://``, ``gs://``, ``az://``) against a real
S3-compatible server (moto's, in a process of its own, behind a proxy that can
go down, come back or hang: tests/s3server.py).

What the store holds is read with boto's own client, not through the code
under test: every count below is checked against the lines really stored.
Each test writes under a prefix of its own, so an upload a sink given up on
may still finish does not land where another test looks.

The faults run on a ``MockClock`` (``clock``), the deadlines' clock of the
tracer and of its sinks, which stands still until the test moves it: a flush
or a close that waited for a deadline (``retry_s``, a call's ``timeout_s``,
the backoff) would never return, and one that should wait for it returns
only once the test moved the clock past it.
"""

from __future__ import annotations

import gzip
import json
import logging
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec
import pytest
import s3fs
from deadlines import HANG_S, SHORT_S, WatchedClock, advancing, past_deadline
from s3server import BUCKET, S3Server
from tracecheck import check_runs, only_run
from writing.harness import DRIVERS, Driver, Handle

import rollout_trace as rt
from rollout_trace._writing import specs
from rollout_trace._writing.engine import DRAIN_SHARE
from rollout_trace._writing.specs import parse_uri
from rollout_trace.sinks import MemorySink
from rollout_trace.sinks import objects as sinks_objects
from rollout_trace.sinks.objects import AzureSink, GcsSink, S3Sink

LIFECYCLE = ("trace_opened", "trace_closed")
# The async tracer (asyncio) and the sync tracer: one sink's thread, or the
# sync tracer's writer thread writing to its lone sink itself.
TRACERS = [DRIVERS[0], DRIVERS[-1]]
TRACER_IDS = [d.name for d in TRACERS]


@pytest.fixture
def prefix() -> str:
    """A prefix of the bucket for this test alone."""
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def clock() -> WatchedClock:
    """The deadlines' clock: the tracer's (``deadline_clock=clock``), which it hands its sinks."""
    return WatchedClock()


class StoreCalls:
    """The sink's calls to the store (s3fs's uploads and listings) under way.

    Each begins once the sink fixed its deadline (``timeout_s`` on the clock):
    a clock moved while ``waiting`` moves it past that call's deadline.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.begun = 0
        self.waiting = 0
        self._lock = threading.Lock()
        for name in ("_pipe_file", "_glob"):
            monkeypatch.setattr(
                s3fs.S3FileSystem, name, self._watched(getattr(s3fs.S3FileSystem, name))
            )

    def _watched(self, call: Callable[..., Any]) -> Callable[..., Any]:
        async def watched(fs: Any, *args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.begun += 1
                self.waiting += 1
            try:
                return await call(fs, *args, **kwargs)
            finally:
                with self._lock:
                    self.waiting -= 1

        return watched


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> StoreCalls:
    return StoreCalls(monkeypatch)


@pytest.fixture
def only_our_deadlines(monkeypatch: pytest.MonkeyPatch) -> None:
    """botocore's own timeouts (timeout_s in real time, by default) out of the
    way, through fsspec's configuration, which wins: a hung call is given up
    by the sink's deadline on the clock alone, not by a second of real time
    (a minute of it is far more than a test holds a call hung)."""
    monkeypatch.setitem(
        fsspec.config.conf,
        "s3",
        {"config_kwargs": {"connect_timeout": 60, "read_timeout": 60}},
    )


def _failures(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """When (on the clock) the object-store sinks count a call to the store failed."""
    when: list[float] = []
    note = sinks_objects.ObjectStoreSink._note_failure

    def watched(sink: Any, exc: BaseException, now: float) -> None:
        when.append(now)
        note(sink, exc, now)

    monkeypatch.setattr(sinks_objects.ObjectStoreSink, "_note_failure", watched)
    return when


def _backoffs(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The waits the object-store sinks begin (``Sink.wait_until``), in seconds on
    the clock, as they begin them."""
    waits: list[float] = []
    wait_until = sinks_objects.ObjectStoreSink.wait_until

    def watched(sink: Any, deadline: float, event: threading.Event | None = None) -> bool:
        waits.append(deadline - sink.deadline_clock())
        return wait_until(sink, deadline, event)

    monkeypatch.setattr(sinks_objects.ObjectStoreSink, "wait_until", watched)
    return waits


async def _until(h: Handle, condition: Callable[[], bool], what: str) -> None:
    """Let the run go on until ``condition()`` (a hang guard of ``HANG_S``)."""
    end = time.monotonic() + HANG_S
    while not condition():
        if time.monotonic() > end:
            pytest.fail(f"{what} did not happen within {HANG_S} s")
        await h.sleep(0.005)


def _stored(store: S3Server, prefix: str) -> list[tuple[str, bytes]]:
    """The objects under ``prefix``, by key, each as its lines (gunzipped for .gz)."""
    out = []
    for key, body in sorted(store.objects(prefix + "/").items()):
        out.append((key, gzip.decompress(body) if key.endswith(".gz") else body))
    return out


def _data(store: S3Server, prefix: str) -> bytes:
    """Every line stored under ``prefix``, the segments in their order."""
    return b"".join(body for _, body in _stored(store, prefix))


def _user_lines(store: S3Server, prefix: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in _data(store, prefix).splitlines()]
    return [line for line in lines if line["event"] not in LIFECYCLE]


def _versions(store: S3Server, prefix: str) -> list[int]:
    """The events stored, by what tells them apart (the i of ``_emit``)."""
    return [line["weight_version"] for line in _user_lines(store, prefix)]


async def _emit(h: Handle, start: int, stop: int) -> None:
    for i in range(start, stop):
        h.emit(rt.WeightsSynced(weight_version=i))


def _warnings(log: pytest.LogCaptureFixture, prefix: str | None, *words: str) -> list[str]:
    """What was said of the sink writing under ``prefix`` (and not, say, of a
    sink an earlier test gave up on, whose thread may still be at work)."""
    messages = [r.getMessage() for r in log.records if r.levelno >= logging.WARNING]
    return [m for m in messages if prefix and prefix in m and all(w in m for w in words)]


# --- faults, through both tracers ------------------------------------------------------


@pytest.mark.parametrize("driver", TRACERS, ids=TRACER_IDS)
def test_a_store_down_at_open_gets_everything_once_it_is_back(
    driver: Driver,
    s3: S3Server,
    prefix: str,
    trace_log: pytest.LogCaptureFixture,
    clock: WatchedClock,
) -> None:
    uri = f"s3://{BUCKET}/{prefix}/t.jsonl"
    s3.proxy.down()

    async def scenario(h: Handle) -> None:
        await _emit(h, 0, 300)
        # The job runs; the store has nothing yet. The clock stands still: the
        # flush answers after one try, it does not wait out retry_s.
        assert not await h.flush()
        assert h.counts.written == len(_versions(s3, prefix)) == 0
        assert h.counts.pending == 300
        s3.proxy.up()
        assert await h.flush()
        assert h.counts.written == len(_versions(s3, prefix)) == 300
        await _emit(h, 300, 600)

    out = driver.run([uri], scenario, deadline_clock=clock)
    assert _versions(s3, prefix) == list(range(600))  # each once, in order
    run = only_run(_data(s3, prefix), uri=uri)  # the sink's own count is the lines stored
    assert run.closed is not None and run.closed["written"] == out.counts.written == 600
    assert [key for key, _ in _stored(s3, prefix)] == [f"{prefix}/t.000001.jsonl"]
    (down,) = _warnings(trace_log, prefix, "an upload to")  # reported once
    assert f"s3://{BUCKET}/{prefix}/t.jsonl" in down
    assert "EndpointConnectionError" in down  # the refusal (no timeout: the clock stood still)
    assert len(_warnings(trace_log, prefix, "work again")) == 1
    assert len(_warnings(trace_log, prefix)) == 2


@pytest.mark.parametrize("driver", TRACERS, ids=TRACER_IDS)
def test_a_store_down_mid_run_and_back_loses_nothing(
    driver: Driver,
    s3: S3Server,
    prefix: str,
    trace_log: pytest.LogCaptureFixture,
    clock: WatchedClock,
) -> None:
    uri = f"s3://{BUCKET}/{prefix}/t.jsonl"

    async def scenario(h: Handle) -> None:
        for outage in range(2):
            start = outage * 300
            await _emit(h, start, start + 100)
            assert await h.flush()
            assert h.counts.written == len(_versions(s3, prefix)) == start + 100
            s3.proxy.down()
            await _emit(h, start + 100, start + 200)
            # Not in the store: not written, and flush says so, every time it is
            # asked, at once (the clock stands still: it waits out no retry_s).
            assert not await h.flush()
            assert not await h.flush()
            assert h.counts.written == len(_versions(s3, prefix)) == start + 100
            # Said once per outage, however many uploads fail.
            assert len(_warnings(trace_log, prefix, "an upload to")) == outage + 1
            s3.proxy.up()
            await _emit(h, start + 200, start + 300)
            assert await h.flush()
            assert h.counts.written == len(_versions(s3, prefix)) == start + 300
            assert len(_warnings(trace_log, prefix, "work again")) == outage + 1

    out = driver.run([uri], scenario, deadline_clock=clock)
    assert _versions(s3, prefix) == list(range(600))
    run = only_run(_data(s3, prefix), uri=uri)
    assert run.closed is not None and run.closed["written"] == out.counts.written == 600
    assert len(_warnings(trace_log, prefix)) == 4  # two outages, each said once and its end once


@pytest.mark.parametrize("driver", TRACERS, ids=TRACER_IDS)
def test_a_store_down_past_retry_s_stops_the_sink_with_honest_counts(
    driver: Driver,
    s3: S3Server,
    prefix: str,
    trace_log: pytest.LogCaptureFixture,
    clock: WatchedClock,
) -> None:
    uri = f"s3://{BUCKET}/{prefix}/t.jsonl?retry_s=1"
    close_timeout = 4.0

    async def scenario(h: Handle) -> tuple[bool, bool, bool]:
        await _emit(h, 0, 200)
        assert await h.flush()
        s3.proxy.down()
        await _emit(h, 200, 400)
        down = await h.flush()  # the outage begins
        clock.advance(1.0 - SHORT_S)  # just short of retry_s: tried again, not stopped
        short = await h.flush()
        assert _warnings(trace_log, prefix, "is stopped") == []
        clock.advance(SHORT_S)  # retry_s since the outage began
        await _emit(h, 400, 500)
        return down, short, await h.flush()

    # The close waits for nothing (the clock stands still): the sink had stopped.
    out = driver.run([uri], scenario, close_timeout=close_timeout, deadline_clock=clock)
    assert out.value == (False, False, False)
    # What is stored is what was written; the rest is counted lost.
    assert _versions(s3, prefix) == list(range(200))
    c = out.counts
    assert (c.emitted, c.written, c.dropped, c.pending) == (500, 200, 300, 0)
    runs = check_runs(_data(s3, prefix), uri=uri, allow_drops=True)
    assert [run.closed for run in runs.values()] == [None]  # trace_closed never got there
    (stopped,) = _warnings(trace_log, prefix, "is stopped")  # reported once
    assert uri in stopped and "retry_s=1" in stopped and "EndpointConnectionError" in stopped
    assert len(_warnings(trace_log, prefix, "an upload to")) == 1  # the outage, said once


@pytest.mark.parametrize("driver", TRACERS, ids=TRACER_IDS)
def test_a_store_down_at_the_close_counts_what_it_did_not_get_as_lost(
    driver: Driver,
    s3: S3Server,
    prefix: str,
    trace_log: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    clock: WatchedClock,
) -> None:
    # retry_s (300 s) is far beyond the close's deadline: the close tries
    # again until its drain deadline (its share of close_timeout), then gives
    # the staged batches up. (It may end a little sooner: it begins no try
    # that, as long as the longest so far, would end past that deadline; a
    # try the clock jumped over lasted all of the jump.) botocore makes one
    # attempt a request (fsspec's configuration, which wins over the sink's
    # own): each try of the close is one refused connection.
    monkeypatch.setitem(
        fsspec.config.conf, "s3", {"config_kwargs": {"retries": {"max_attempts": 1}}}
    )
    uri = f"s3://{BUCKET}/{prefix}/t.jsonl"
    close_timeout = 3.0

    async def scenario(h: Handle) -> None:
        await _emit(h, 0, 100)
        assert await h.flush()
        s3.proxy.down()
        await _emit(h, 100, 200)

    out = driver.run(
        [uri],
        scenario,
        close_timeout=close_timeout,
        deadline_clock=clock,
        closing=lambda: advancing(clock, close_timeout * DRAIN_SHARE, early=False),
    )
    assert _versions(s3, prefix) == list(range(100))
    c = out.counts
    assert (c.emitted, c.written, c.dropped) == (200, 100, 100)
    (stopped,) = _warnings(trace_log, prefix, "is stopped")
    assert "did not deliver what it staged before the close deadline" in stopped
    assert "EndpointConnectionError" in stopped  # why, as the sink last saw it
    # Said once: the sink, given up, is not reported again as left behind,
    # nor the run as given up at its deadline.
    assert len(_warnings(trace_log, prefix)) == 2  # the outage, and the stop
    assert _warnings(trace_log, out.tracer.run_id) == []


@pytest.mark.parametrize("driver", TRACERS, ids=TRACER_IDS)
def test_a_store_gone_when_only_the_last_lines_are_left_fails_the_close_briefly(
    driver: Driver,
    s3: S3Server,
    prefix: str,
    trace_log: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    clock: WatchedClock,
) -> None:
    # Every event delivered, then the store goes: only trace_closed is left to
    # upload, which close() tries for a moment (_CLOSE_S, not retry_s nor
    # close_timeout), then reports once. The counts stand: every event is in
    # the store.
    monkeypatch.setitem(
        fsspec.config.conf, "s3", {"config_kwargs": {"retries": {"max_attempts": 1}}}
    )
    uri = f"s3://{BUCKET}/{prefix}/t.jsonl"
    close_timeout = 10.0
    backoffs = _backoffs(monkeypatch)

    async def scenario(h: Handle) -> None:
        await _emit(h, 0, 100)
        assert await h.flush()
        s3.proxy.down()

    # The sink's close waits between its tries, on the clock: it ends once the
    # clock is moved _CLOSE_S (its next wait would end beyond that), with
    # close_timeout (and the drain's deadline, 8 s) far off, never reached.
    out = driver.run(
        [uri],
        scenario,
        close_timeout=close_timeout,
        deadline_clock=clock,
        closing=lambda: advancing(
            clock, sinks_objects._CLOSE_S, ready=lambda: bool(backoffs), early=False
        ),
    )
    assert _versions(s3, prefix) == list(range(100))
    c = out.counts
    assert (c.emitted, c.written, c.dropped) == (100, 100, 0)
    assert b"trace_closed" not in _data(s3, prefix)
    (failed,) = _warnings(trace_log, prefix, "failed at the close")
    assert "EndpointConnectionError" in failed
    assert len(_warnings(trace_log, prefix)) == 2  # the outage, and the close


@pytest.mark.usefixtures("only_our_deadlines")
@pytest.mark.parametrize("driver", TRACERS, ids=TRACER_IDS)
def test_a_hung_store_never_blocks_emit_and_the_close_keeps_its_deadline(
    driver: Driver,
    s3: S3Server,
    prefix: str,
    trace_log: pytest.LogCaptureFixture,
    clock: WatchedClock,
    calls: StoreCalls,
) -> None:
    # upload_s=0.05: the writes themselves upload, and hang with the store
    # (timeout_s, 8 s, never passes: the clock moves 1 s in all before the close).
    uri = f"s3://{BUCKET}/{prefix}/t.jsonl?upload_s=0.05"
    close_timeout = 2.0

    async def scenario(h: Handle) -> bool:
        await _emit(h, 0, 100)
        assert await h.flush()
        s3.proxy.hang = True  # takes connections, holds every byte
        begun = calls.begun
        clock.advance(0.05)  # the next batch finds an upload due
        await _emit(h, 100, 1_100)
        await _until(h, lambda: calls.waiting == 1, "a hung upload")
        for n in range(1, 20):
            await _emit(h, 100 + 1_000 * n, 100 + 1_000 * (n + 1))
            clock.advance(0.05)
        # Twenty bursts, all emitted while the first upload hangs: none waited for it.
        return calls.waiting == 1 and calls.begun == begun + 1

    try:
        # The close gives the hung sink up once its call has lasted past
        # close_timeout on the clock: it must wait for the clock to move.
        out = driver.run(
            [uri],
            scenario,
            close_timeout=close_timeout,
            deadline_clock=clock,
            closing=lambda: advancing(clock, close_timeout, early=False),
        )
        stored = _versions(s3, prefix)  # before the proxy lets anything through
    finally:
        s3.proxy.hang = False
    assert out.value is True
    assert stored == list(range(100))
    c = out.counts
    assert c.emitted == 20_100 and c.written == 100 and c.dropped == 20_000
    assert len(_warnings(trace_log, prefix, "is stopped")) == 1


@pytest.mark.usefixtures("only_our_deadlines")
@pytest.mark.parametrize("driver", TRACERS, ids=TRACER_IDS)
def test_a_store_hung_longer_than_the_close_timeout_is_waited_out(
    driver: Driver,
    s3: S3Server,
    prefix: str,
    trace_log: pytest.LogCaptureFixture,
    clock: WatchedClock,
    calls: StoreCalls,
) -> None:
    # A PUT waits for its "100 Continue" with no timeout of botocore's: each
    # call is cut at timeout_s instead, so no call outlasts close_timeout
    # (which would give the sink up as hung) and the outage is retried.
    uri = f"s3://{BUCKET}/{prefix}/t.jsonl?timeout_s=1&upload_s=0.05"
    close_timeout = 3.0

    async def scenario(h: Handle) -> None:
        await _emit(h, 0, 100)
        assert await h.flush()
        s3.proxy.hang = True
        clock.advance(0.05)  # the next batch finds an upload due
        n = 100
        try:  # (a check that fails lets the store go, so that the close ends)
            for _ in range(4):  # 4 s of hung uploads and the waits between: past close_timeout
                begun = calls.begun
                await _emit(h, n, n + 100)
                n += 100
                await _until(h, lambda: calls.waiting == 1, "an upload")
                assert calls.begun == begun + 1  # one upload at a time, each after the last
                clock.advance(1.0)  # its timeout_s: it is cut, and counted a failure
                await _until(h, lambda: calls.waiting == 0, "the cut")
                clock.advance(sinks_objects._MAX_BACKOFF_S)  # the backoff, whatever it is
            # A flush tries too, and is cut at timeout_s: not before.
            with advancing(clock, 1.0, ready=lambda: calls.waiting == 1):
                assert not await h.flush()
        finally:
            s3.proxy.hang = False
        assert await h.flush()
        assert h.counts.written == len(_versions(s3, prefix)) == n

    try:
        out = driver.run([uri], scenario, close_timeout=close_timeout, deadline_clock=clock)
    finally:
        s3.proxy.hang = False
    c = out.counts
    assert c.dropped == 0 and c.written == c.emitted == len(_versions(s3, prefix))
    assert _versions(s3, prefix) == list(range(c.emitted))
    assert _warnings(trace_log, prefix, "is stopped") == []
    assert len(_warnings(trace_log, prefix, "timeout_s=1")) == 1  # the outage, once


@pytest.mark.usefixtures("only_our_deadlines")
@pytest.mark.parametrize(
    "timeout_s",
    [
        1.0,  # a call's own limit well under close_timeout
        # past close_timeout: the tracer waits timeout_s for the store's
        # answer at open, rather than give the sink up as hung
        2.5,
    ],
    ids=["under-close_timeout", "past-close_timeout"],
)
@pytest.mark.parametrize("driver", TRACERS, ids=TRACER_IDS)
def test_a_store_hung_at_open_does_not_stop_the_tracer(
    driver: Driver,
    s3: S3Server,
    prefix: str,
    timeout_s: float,
    clock: WatchedClock,
    calls: StoreCalls,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    uri = f"s3://{BUCKET}/{prefix}/t.jsonl?timeout_s={timeout_s}"
    s3.proxy.hang = True
    began = clock()
    failures = _failures(monkeypatch)

    async def scenario(h: Handle) -> None:
        await _emit(h, 0, 100)  # taken while the store is still hung
        s3.proxy.hang = False
        # The open waited for the store's answer until timeout_s, and no longer.
        assert failures == [began + timeout_s]
        assert await h.flush()

    try:
        # The open's listing hangs: moved just short of timeout_s, the open
        # still waits; moved to it, the listing is given up and the run opens.
        with advancing(clock, timeout_s, ready=lambda: calls.waiting == 1):
            out = driver.run([uri], scenario, close_timeout=1.5, deadline_clock=clock)
    finally:
        s3.proxy.hang = False
    assert out.counts.written == 100 == len(_versions(s3, prefix))
    assert [key for key, _ in _stored(s3, prefix)] == [f"{prefix}/t.000001.jsonl"]


@pytest.mark.parametrize("driver", TRACERS, ids=TRACER_IDS)
def test_a_failed_upload_is_tried_again_at_the_next_batch(
    driver: Driver,
    s3: S3Server,
    prefix: str,
    trace_log: pytest.LogCaptureFixture,
    clock: WatchedClock,
    calls: StoreCalls,
) -> None:
    # upload_s (60 s) is far off and no flush comes after the failed one: the
    # batches that follow retry, so a short outage does not use up retry_s.
    uri = f"s3://{BUCKET}/{prefix}/t.jsonl?retry_s=4"

    async def scenario(h: Handle) -> None:
        sink = h.tracer.sinks[0]
        await _emit(h, 0, 100)
        s3.proxy.down()
        assert not await h.flush()
        s3.proxy.up()
        begun = calls.begun
        await _emit(h, 100, 110)  # within the backoff: taken, and not tried yet
        await _until(h, lambda: sink.staged_lines() == 111, "the batch")  # and trace_opened
        assert calls.begun == begun and h.counts.written == 0
        clock.advance(sinks_objects._FIRST_BACKOFF_S)
        await _emit(h, 110, 120)  # the next batch tries again, and uploads all
        await _until(h, lambda: h.counts.written == 120, "the upload of the next batch")
        clock.advance(6.0)  # past retry_s since the outage began: it is over
        await _emit(h, 120, 130)

    out = driver.run([uri], scenario, deadline_clock=clock)
    assert _warnings(trace_log, prefix, "is stopped") == []
    assert len(_warnings(trace_log, prefix, "work again")) == 1
    c = out.counts
    assert c.dropped == 0 and c.written == c.emitted == len(_versions(s3, prefix))


@pytest.mark.parametrize("driver", TRACERS, ids=TRACER_IDS)
def test_no_credentials_fail_the_open(
    driver: Driver, s3: S3Server, prefix: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Not an outage to wait out for retry_s: a setup to fix, said at once.
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(rt.SinkOpenError, match="NoCredentialsError"):
        driver.run([f"s3://{BUCKET}/{prefix}/t.jsonl"], _nothing)


async def _nothing(h: Handle) -> None:
    pass


@pytest.mark.parametrize("driver", TRACERS, ids=TRACER_IDS)
def test_more_staged_than_the_sink_holds_stops_it_with_honest_counts(
    driver: Driver,
    s3: S3Server,
    prefix: str,
    trace_log: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    clock: WatchedClock,
) -> None:
    # A long outage of a busy run: past 20 kB staged (256 MB in earnest),
    # the sink stops rather than hold more.
    monkeypatch.setattr(sinks_objects, "_MAX_STAGED", 20_000)
    uri = f"s3://{BUCKET}/{prefix}/t.jsonl"

    async def scenario(h: Handle) -> tuple[bool, bool]:
        await _emit(h, 0, 100)
        first = await h.flush()
        s3.proxy.down()
        for n in range(10):
            await _emit(h, 100 + 100 * n, 200 + 100 * n)
            await h.sleep(0.01)
        return first, await h.flush()

    out = driver.run([uri], scenario, deadline_clock=clock)
    assert out.value == (True, False)
    assert _versions(s3, prefix) == list(range(100))
    c = out.counts
    assert (c.emitted, c.written, c.dropped) == (1_100, 100, 1_000)
    (stopped,) = _warnings(trace_log, prefix, "is stopped")
    assert "MB staged" in stopped and "are not held" in stopped


@pytest.mark.parametrize("driver", TRACERS, ids=TRACER_IDS)
def test_a_store_that_refuses_the_object_stops_the_sink_at_once(
    driver: Driver,
    s3: S3Server,
    prefix: str,
    trace_log: pytest.LogCaptureFixture,
    clock: WatchedClock,
) -> None:
    # The bucket is deleted mid-run: the store answers, and will not take the
    # object (no retry can change that).
    bucket = f"doomed-{prefix}"
    client = s3.client()
    client.create_bucket(Bucket=bucket)
    uri = f"s3://{bucket}/runs/t.jsonl"

    async def scenario(h: Handle) -> tuple[bool, bool, int]:
        await _emit(h, 0, 100)
        first = await h.flush()
        for item in client.list_objects_v2(Bucket=bucket).get("Contents", []):
            client.delete_object(Bucket=bucket, Key=item["Key"])
        client.delete_bucket(Bucket=bucket)
        await _emit(h, 100, 200)
        return first, await h.flush(), h.counts.written

    out = driver.run([uri], scenario, deadline_clock=clock)
    assert out.value == (True, False, 100)  # what was there when flushed
    c = out.counts
    assert (c.emitted, c.written, c.dropped) == (200, 100, 100)
    (stopped,) = _warnings(trace_log, bucket)  # stopped, said once: no retries
    assert "is stopped" in stopped and "FileNotFoundError" in stopped
    assert f"s3://{bucket}/runs/t.000001.jsonl" in stopped  # the object it would not take


# A call that uploaded one segment and then found the sink must stop: the
# upload still counts (what limit stops it, and the tries it takes to get there).
STOPPED_AFTER_AN_UPLOAD = [
    # An outage older than retry_s: the store takes one upload, then fails again.
    pytest.param("retry_s", "&retry_s=1", 1_000, id="past-retry_s"),
    # The store answers the next upload with 403: a refusal stops the sink at once.
    pytest.param("refused", "", 1_000, id="refused"),
    # What is left staged is more than the sink holds (60 kB here, 256 MB in earnest).
    pytest.param("max_staged", "", 1_500, id="past-max-staged"),
]


@pytest.mark.parametrize("driver", TRACERS, ids=TRACER_IDS)
@pytest.mark.parametrize(("limit", "options", "more"), STOPPED_AFTER_AN_UPLOAD)
def test_an_upload_just_before_the_sink_stops_counts_as_written(
    driver: Driver,
    s3: S3Server,
    prefix: str,
    limit: str,
    options: str,
    more: int,
    trace_log: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    clock: WatchedClock,
) -> None:
    # Segments of 20 kB (about 150 events): one call uploads several.
    if limit == "max_staged":
        monkeypatch.setattr(sinks_objects, "_MAX_STAGED", 60_000)
    uri = f"s3://{BUCKET}/{prefix}/t.jsonl?rotate_mb=0.02{options}"
    s3.proxy.puts = 0  # every upload fails (the connection is cut)

    async def scenario(h: Handle) -> bool:
        await _emit(h, 0, 300)  # 40 kB staged: the upload of each segment ended fails
        await _until(h, lambda: bool(_warnings(trace_log, prefix, "an upload to")), "a failure")
        clock.advance(1.0)  # retry_s=1 since the outage began, and past the backoff
        s3.proxy.puts = 1  # one upload gets through, the next fails
        s3.proxy.refuse_puts = limit == "refused"
        await _emit(h, 300, 300 + more)
        return await h.flush()

    out = driver.run([uri], scenario, close_timeout=4.0, deadline_clock=clock)
    assert out.value is False
    stored = _versions(s3, prefix)
    assert stored == list(range(len(stored))) and len(stored) > 100  # one segment, at least
    c = out.counts
    assert (c.written, c.dropped) == (len(stored), 300 + more - len(stored))
    (stopped,) = _warnings(trace_log, prefix, "is stopped")
    why = {"retry_s": "(retry_s=1)", "refused": "PermissionError", "max_staged": "are not held"}
    assert why[limit] in stopped


@pytest.mark.parametrize("driver", TRACERS, ids=TRACER_IDS)
def test_a_slow_store_is_not_taken_for_a_hung_one(
    driver: Driver, s3: S3Server, prefix: str, trace_log: pytest.LogCaptureFixture
) -> None:
    # Each upload takes about 0.3 s, well within timeout_s (a loaded machine
    # doubles it); one batch ends some 13 segments, which one call would
    # upload in 4 s, past close_timeout. In real time (time.monotonic): what
    # a call fits in is how long its uploads really take.
    uri = f"s3://{BUCKET}/{prefix}/t.jsonl?rotate_mb=0.02&timeout_s=2"
    close_timeout = 3.0

    async def scenario(h: Handle) -> int:
        s3.proxy.delay = 0.15
        await _emit(h, 0, 2_000)
        flushes = 1
        while not await h.flush():  # each delivers some, the rest stays staged
            flushes += 1
            assert flushes < 30
        assert h.counts.written == len(_versions(s3, prefix)) == 2_000
        return flushes

    out = driver.run([uri], scenario, close_timeout=close_timeout)
    assert out.value > 1  # a flush's call uploads only what fits in its time
    assert _versions(s3, prefix) == list(range(2_000))
    assert out.counts.written == 2_000 and out.counts.dropped == 0
    assert _warnings(trace_log, prefix) == []  # never given up


@pytest.mark.usefixtures("only_our_deadlines")
@pytest.mark.parametrize("driver", TRACERS, ids=TRACER_IDS)
def test_a_slow_store_gets_everything(
    driver: Driver,
    s3: S3Server,
    prefix: str,
    trace_log: pytest.LogCaptureFixture,
    clock: WatchedClock,
    calls: StoreCalls,
) -> None:
    uri = f"s3://{BUCKET}/{prefix}/t.jsonl?upload_s=0.05"

    async def scenario(h: Handle) -> bool:
        # The store holds the first upload for as long as the emits take
        # (within its timeout_s: the clock moves 0.05 s in all).
        s3.proxy.hang = True
        begun = calls.begun
        clock.advance(0.05)  # the next batch finds an upload due
        await _emit(h, 0, 1_000)
        await _until(h, lambda: calls.waiting == 1, "a held upload")
        for n in range(1, 10):
            await _emit(h, 1_000 * n, 1_000 * (n + 1))
        held = calls.waiting == 1 and calls.begun == begun + 1  # the emits did not wait
        s3.proxy.hang = False
        assert await h.flush()
        assert h.counts.written == len(_versions(s3, prefix)) == 10_000
        return held

    try:
        out = driver.run([uri], scenario, deadline_clock=clock)
    finally:
        s3.proxy.hang = False
    assert out.value is True
    assert _versions(s3, prefix) == list(range(10_000))
    assert out.counts.written == 10_000
    assert _warnings(trace_log, prefix) == []


# --- opening, options, the extra ---------------------------------------------------------


@pytest.mark.parametrize("driver", TRACERS, ids=TRACER_IDS)
def test_a_missing_bucket_fails_the_open_naming_it(driver: Driver, s3: S3Server) -> None:
    uri = "s3://no-such-bucket-here/runs/t.jsonl"
    t = driver.make(uri)

    async def scenario(h: Handle) -> None:
        raise AssertionError("opened")

    with pytest.raises(rt.SinkOpenError) as caught:
        driver.drive(t, scenario)
    assert "no-such-bucket-here" in str(caught.value)
    assert "FileNotFoundError" in str(caught.value)


@pytest.mark.parametrize("driver", TRACERS, ids=TRACER_IDS)
def test_a_missing_bucket_fails_the_open_however_slow_the_store_answers(
    driver: Driver, s3: S3Server, clock: WatchedClock
) -> None:
    # A loaded machine or a far store: the answer comes after seconds, and
    # it still decides (no timer on the clock, which stands still, takes the
    # store for unreachable; botocore's read timeout, real, is timeout_s).
    s3.proxy.delay = 1.5
    t = driver.make("s3://no-such-bucket-here/runs/t.jsonl?timeout_s=6", deadline_clock=clock)

    async def scenario(h: Handle) -> None:
        raise AssertionError("opened")

    try:
        with pytest.raises(rt.SinkOpenError) as caught:
            driver.drive(t, scenario)
    finally:
        s3.proxy.delay = 0.0
    assert "no-such-bucket-here" in str(caught.value)
    assert "FileNotFoundError" in str(caught.value)


# A URI the sink refuses when the tracer is built: (URI, words the error has).
BAD = [
    # Not above 0, not a number, never: each option names the value and its unit.
    (f"s3://{BUCKET}/t.jsonl?rotate_mb=0", ["rotate_mb='0'", "megabytes above 0"]),
    (f"s3://{BUCKET}/t.jsonl?rotate_mb=-5", ["rotate_mb='-5'", "megabytes above 0"]),
    (f"s3://{BUCKET}/t.jsonl?rotate_s=inf", ["rotate_s='inf'", "seconds above 0"]),
    (f"s3://{BUCKET}/t.jsonl?upload_s=soon", ["upload_s='soon'", "seconds above 0"]),
    (f"s3://{BUCKET}/t.jsonl?retry_s=nan", ["retry_s='nan'", "seconds above 0"]),
    (f"s3://{BUCKET}/t.jsonl?timeout_s=0", ["timeout_s='0'", "seconds above 0"]),
    # A segment is held in memory while written: no bigger than the sink holds.
    (f"s3://{BUCKET}/t.jsonl?rotate_mb=400", ["rotate_mb='400'", "at most 256 megabytes"]),
    (f"s3://{BUCKET}/t.jsonl?rotate_mb=1e303", ["rotate_mb='1e303'", "at most 256 megabytes"]),
    # An option the sink does not know: the known ones are listed.
    (f"s3://{BUCKET}/t.jsonl?fsync=batch", ["'fsync'", "retry_s", "rotate_mb"]),
    # No bucket and name: the form it needs, with an example.
    ("s3://t.jsonl", ["bucket/prefix/name.jsonl", "'t.jsonl'"]),
    # Not .jsonl or .jsonl.gz: segments would lose their kind.
    (f"s3://{BUCKET}/t.log", ["bucket/prefix/name.jsonl", "(or .jsonl.gz)", "'traces/t.log'"]),
    (f"gs://{BUCKET}/t.gz", ["gs:// needs bucket/prefix/name.jsonl"]),
]


@pytest.mark.parametrize(("uri", "words"), BAD)
def test_bad_values_are_named_when_the_tracer_is_built(uri: str, words: list[str]) -> None:
    with pytest.raises(rt.SinkOptionError) as caught:
        rt.sync_tracer(uri)
    for word in words:
        assert word in str(caught.value)


# Each scheme, the package that implements it and the extra that installs it.
SCHEMES = [
    ("s3", "s3fs", "s3", S3Sink),
    ("gs", "gcsfs", "gcs", GcsSink),
    ("az", "adlfs", "azure", AzureSink),
]


@pytest.mark.parametrize(("scheme", "package", "extra", "cls"), SCHEMES)
def test_without_its_package_the_error_names_the_extra(
    scheme: str, package: str, extra: str, cls: type[S3Sink], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, package, None)  # imports of it fail
    with pytest.raises(rt.SinkOptionError) as caught:
        parse_uri(f"{scheme}://{BUCKET}/runs/t.jsonl")
    assert f"pip install 'rollout-trace[{extra}]'" in str(caught.value)
    assert package in str(caught.value)


@pytest.mark.parametrize(("scheme", "package", "extra", "cls"), SCHEMES)
def test_every_scheme_is_registered(
    scheme: str, package: str, extra: str, cls: type[S3Sink]
) -> None:
    uri = f"{scheme}://{BUCKET}/runs/t.jsonl"
    assert specs._load(uri, scheme) is cls  # (built, it needs its package)
    assert (cls.protocol, cls.package, cls.extra) == (scheme, package, extra)


# --- segments ------------------------------------------------------------------------------


def _run(
    uri: str, n: int, *, pause_every: int = 0, pause_s: float = 0.0, clock: Any = None
) -> rt.TraceCounts:
    """``n`` events, flushed every ``pause_every``, then ``clock`` moved ``pause_s``."""
    kwargs = {} if clock is None else {"deadline_clock": clock}
    with rt.sync_tracer(uri, batch_size=64, **kwargs) as t:
        for i in range(n):
            t.emit(rt.WeightsSynced(weight_version=i))
            if pause_every and i % pause_every == pause_every - 1:
                assert t.flush(timeout=10)
                clock.advance(pause_s)
    return t.counts


@pytest.mark.parametrize(
    ("suffix", "unpack"),
    [
        (".jsonl", lambda b: b),  # plain
        (".jsonl.gz", gzip.decompress),  # each segment whole gzip (of one or more members)
    ],
)
def test_segments_stay_within_their_size_each_a_whole_object(
    s3: S3Server, prefix: str, suffix: str, unpack: Callable[[bytes], bytes]
) -> None:
    limit = 20_000
    uri = f"s3://{BUCKET}/{prefix}/t{suffix}?rotate_mb={limit / 1e6}"
    counts = _run(uri, 20_000)
    objects = sorted(s3.objects(prefix + "/").items())
    names = [key for key, _ in objects]
    assert names == [f"{prefix}/t.{i:06d}{suffix}" for i in range(1, len(names) + 1)]
    assert len(names) >= 3
    sizes = [len(body) for _, body in objects]
    # Within the size as stored (gzip: headers, trailers and flush markers aside).
    assert all(size <= limit + 64 for size in sizes), sizes
    bodies = [unpack(body) for _, body in objects]
    assert all(body.endswith(b"\n") for body in bodies)  # whole lines in each
    run = only_run(b"".join(bodies), uri=uri)  # every event once, in order, counted
    assert [e["weight_version"] for e in run.events] == list(range(20_000))
    assert counts.written == 20_000
    if suffix == ".jsonl":  # full but for the line that did not fit
        longest = max(len(line) for body in bodies for line in body.splitlines()) + 1
        assert all(size > limit - longest for size in sizes[:-1]), sizes


def test_a_segment_older_than_rotate_s_ends_before_the_next_batch(
    s3: S3Server, prefix: str, clock: WatchedClock
) -> None:
    # Three bursts, each flushed and followed by 0.5 s on the clock; segments
    # of 0.5 s: a segment a burst, and trace_closed in a fourth (a segment is
    # ended only when a batch comes, so none is empty).
    uri = f"s3://{BUCKET}/{prefix}/t.jsonl?rotate_s=0.5"
    _run(uri, 300, pause_every=100, pause_s=0.5, clock=clock)
    stored = _stored(s3, prefix)
    assert [key for key, _ in stored] == [f"{prefix}/t.{i:06d}.jsonl" for i in range(1, 5)]
    assert [len(body.splitlines()) for _, body in stored] == [101, 100, 100, 1]
    assert _versions(s3, prefix) == list(range(300))


def _wait(condition: Callable[[], bool], what: str) -> None:
    """Until ``condition()`` (a hang guard of ``HANG_S``)."""
    end = time.monotonic() + HANG_S
    while not condition():
        if time.monotonic() > end:
            pytest.fail(f"{what} did not happen within {HANG_S} s")
        time.sleep(0.005)


def test_the_segment_written_is_uploaded_again_every_upload_s(
    s3: S3Server, prefix: str, clock: WatchedClock
) -> None:
    # gzip: each upload ends a member, and the object is its last upload plus
    # more, so it stays valid gzip of several members.
    uri = f"s3://{BUCKET}/{prefix}/t.jsonl.gz?upload_s=0.2"
    with rt.sync_tracer(uri, batch_size=16, deadline_clock=clock) as t:
        sink = t.sinks[0]
        seen = []
        for burst in range(3):
            for i in range(100 * burst, 100 * (burst + 1)):
                t.emit(rt.WeightsSynced(weight_version=i))
            # Taken, not uploaded (upload_s has not passed): trace_opened too at first.
            staged = 100 + (burst == 0)
            _wait(lambda staged=staged: sink.staged_lines() == staged, "the burst")
            assert t.counts.pending == staged - (burst == 0)
            clock.advance(0.2)
            t.emit(rt.WeightsSynced(weight_version=-1 - burst))  # a batch after upload_s
            _wait(lambda: not t.counts.pending, "the upload")
            # Uploaded without a flush: written counts it, and it is there.
            stored = [v for v in _versions(s3, prefix) if v >= 0]
            assert t.counts.written == len(_versions(s3, prefix))
            seen.append(len(stored))
        assert seen == [100, 200, 300]
    ((key, body),) = s3.objects(prefix + "/").items()
    assert key == f"{prefix}/t.000001.jsonl.gz"
    members, rest = 0, body
    while rest:
        d = zlib.decompressobj(wbits=31)
        d.decompress(rest)
        assert d.eof  # each member whole
        members, rest = members + 1, d.unused_data
    assert members >= 4  # a member an upload: three due, and the close's
    run = only_run(gzip.decompress(body), uri=uri)
    assert run.closed is not None and run.closed["written"] == t.counts.written == 303


def segment_name(n: int) -> str:
    return f"t.{n:06d}.jsonl"


# What the prefix holds before a run: (keys there, the segment a run writes first).
NUMBERED = [
    ([], 1),  # nothing: from 000001
    (["t.000007.jsonl", "t.000002.jsonl"], 8),  # on from the highest
    (["t.1000000.jsonl"], 1_000_001),  # seven digits past a million
    (["t.20261204.jsonl", "t.000009.jsonl.gz", "u.000005.jsonl", "t.x.jsonl"], 1),  # none of t's
]


@pytest.mark.parametrize(("there", "first"), NUMBERED)
@pytest.mark.parametrize("down_at_open", [False, True], ids=["up", "down-at-open"])
def test_numbering_goes_on_from_the_highest_segment_stored(
    s3: S3Server, prefix: str, there: list[str], first: int, down_at_open: bool
) -> None:
    client = s3.client()
    for name in there:
        client.put_object(Bucket=BUCKET, Key=f"{prefix}/{name}", Body=b"")
    uri = f"s3://{BUCKET}/{prefix}/t.jsonl?rotate_mb=0.01"
    back = threading.Timer(0.5, s3.proxy.up)
    if down_at_open:  # listed when the store first answers
        s3.proxy.down()
        back.start()
    try:
        counts = _run(uri, 300)
    finally:
        if down_at_open:
            back.join()
    made = sorted(set(s3.objects(prefix + "/")) - {f"{prefix}/{name}" for name in there})
    assert len(made) >= 2
    assert made == [f"{prefix}/{segment_name(first + i)}" for i in range(len(made))]
    assert counts.written == len(_versions(s3, prefix)) == 300
    # A second run goes on after the first.
    _run(uri, 10)
    again = sorted(set(s3.objects(prefix + "/")) - {f"{prefix}/{name}" for name in there})
    assert again[len(made) :] == [f"{prefix}/{segment_name(first + len(made))}"]


# --- read back --------------------------------------------------------------------------------


@pytest.mark.parametrize("driver", TRACERS, ids=TRACER_IDS)
@pytest.mark.parametrize(
    "name",
    [
        "t.jsonl?rotate_mb=0.05",  # plain segments
        "t.jsonl.gz?rotate_mb=0.01&upload_s=0.05",  # gzip segments of several members
    ],
)
def test_the_readers_read_the_run_as_written(
    driver: Driver, s3: S3Server, prefix: str, name: str, tmp_path: Path, clock: WatchedClock
) -> None:
    async def scenario(h: Handle) -> None:
        for n in range(6):
            await _emit(h, 500 * n, 500 * (n + 1))
            clock.advance(0.05)  # upload_s: a batch after it uploads again (gzip: a member)

    out = driver.run(
        [f"s3://{BUCKET}/{prefix}/{name}", "memory://"], scenario, deadline_clock=clock
    )
    memory = out.tracer.sinks[1]
    assert isinstance(memory, MemorySink)
    assert len(s3.objects(prefix + "/")) >= 2
    local = tmp_path / "as-written.jsonl"
    local.write_bytes(memory.getvalue())  # what the memory sink beside it got
    problems: list[rt.ReadProblem] = []
    read = list(rt.read(f"s3://{BUCKET}/{prefix}/", problems))
    assert read == list(rt.read(str(local))) and len(read) == 3_002
    assert problems == []


def test_a_stop_waiting_for_the_next_call_is_the_reason_given_for_what_is_staged(
    s3: S3Server, prefix: str
) -> None:
    # The sink alone: a write that ends two segments, the first stored and the
    # second refused, returns (the upload counts) and keeps the refusal for
    # its next call; until then it is why the rest is staged, as the tracer
    # says when its close deadline comes first.
    sink = sinks_objects.S3Sink(f"{BUCKET}/{prefix}/t.jsonl", {"rotate_mb": "0.02"})
    sink.open()
    s3.proxy.puts = 1  # one upload gets through, the next is refused
    s3.proxy.refuse_puts = True
    sink.write(b"".join(b'{"i":%05d,"pad":"%s"}\n' % (i, b"x" * 100) for i in range(500)))
    assert [key for key, _ in _stored(s3, prefix)] == [f"{prefix}/t.000001.jsonl"]
    why = sink.why_staged()
    assert why is not None and "PermissionError" in why and "t.000002.jsonl" in why
    with pytest.raises(OSError, match="PermissionError"):
        sink.flush()


@pytest.mark.usefixtures("only_our_deadlines")
def test_a_hung_call_is_cut_at_its_timeout_on_the_clock_not_in_real_time(
    s3: S3Server, prefix: str, clock: WatchedClock
) -> None:
    # timeout_s far shorter than the time the clock is held still: a call cut
    # in real time would end before the clock reaches its deadline.
    sink = sinks_objects.S3Sink(f"{BUCKET}/{prefix}/t.jsonl", {"timeout_s": "0.02"})
    sink.deadline_clock = clock
    sink.open()
    s3.proxy.hang = True
    try:
        with pytest.raises(TimeoutError, match=r"timeout_s=0\.02"):
            past_deadline(lambda: sink._bounded("ls", f"{BUCKET}/{prefix}"), clock, 0.02)
    finally:
        s3.proxy.hang = False
    sink.close()
