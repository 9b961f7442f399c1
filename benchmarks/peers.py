"""The same event through the logging and tracing libraries people use today.

Each mode records N ``attempt_dispatched`` records to a file, in a fresh
process, with the 8 fields rollout_trace writes: the event's name, a wall-clock
time stamped by the library, ``run_id`` (bound once where the library can bind),
``seq`` (a counter the caller keeps: rollout_trace pays for its own) and
``group_id``, ``prompt_id``, ``generation_index``, ``attempt``,
``weight_version`` with the same values as in ``throughput.py``.

- ``stdlib``: ``logging`` with a ``QueueHandler`` on the logger and a
  ``QueueListener`` thread feeding a ``FileHandler`` whose formatter writes one
  ``json.dumps`` object per line (the recipe of the logging cookbook).
- ``structlog``: ``TimeStamper(fmt=None)`` and ``JSONRenderer(orjson.dumps)``
  to a ``BytesLoggerFactory`` file logger, filtering bound logger, logger
  cached on first use (the recipe of structlog's performance page). It writes
  on the caller's thread: its caller cost is its end-to-end cost.
- ``loguru``: ``logger.add(file, enqueue=True, serialize=True)``, a logger
  bound with ``run_id``, the fields as keyword arguments.
- ``otel_span``: the OpenTelemetry SDK, a span per record
  (``tracer.start_span(name, attributes=...)`` then ``end()``) through a
  ``BatchSpanProcessor`` to a ``ConsoleSpanExporter`` writing one compact JSON
  object per line to the file.
- ``otel_log``: OpenTelemetry's logs SDK, ``Logger.emit(event_name=...,
  attributes=...)`` through a ``BatchLogRecordProcessor`` to a
  ``ConsoleLogRecordExporter`` writing JSON lines to the file.

The OpenTelemetry batch processors get a queue of 65,536, rollout_trace's
default buffer, instead of their default 2,048, so that their figures are not
bought or lost with a smaller buffer; past it they drop, as rollout_trace does.

Reported as in ``throughput.py``: caller wall and CPU time of the record loop
per event, end-to-end events/s from the first record until the library is shut
down and its file complete, the lines found in the file (fewer than N are
drops), and the process's peak RSS (``ru_maxrss``).

    python benchmarks/peers.py
    python benchmarks/peers.py --quick --only structlog stdlib
"""

from __future__ import annotations

import itertools
import json
import logging
import logging.handlers
import queue
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _bench import EVENT, GROUP_ID, RUN_ID, WEIGHT_VERSION, count_lines, script_main, tmp_dir

QUEUE_SIZE = 65_536


def _measure(
    events: int, record: Callable[[int], None], shutdown: Callable[[], None], path: Path
) -> dict[str, Any]:
    c0 = time.thread_time()
    w0 = time.perf_counter()
    for i in range(events):
        record(i)
    caller_wall = time.perf_counter() - w0
    caller_cpu = time.thread_time() - c0
    shutdown()
    total = time.perf_counter() - w0
    lines = count_lines(path)
    return {
        "caller_wall_ns": caller_wall / events * 1e9,
        "caller_cpu_ns": caller_cpu / events * 1e9,
        "e2e_s": total,
        "e2e_eps": events / total,
        "lines": lines,
        "dropped": events - lines,
        "check": "ok" if lines == events else f"{events - lines} records missing",
    }


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        r: Any = record
        return json.dumps(
            {
                "event": record.getMessage(),
                "time": record.created,
                "run_id": r.run_id,
                "seq": r.seq,
                "group_id": r.group_id,
                "prompt_id": r.prompt_id,
                "generation_index": r.generation_index,
                "attempt": r.attempt,
                "weight_version": r.weight_version,
            }
        )


def run_stdlib(events: int) -> dict[str, Any]:
    with tmp_dir() as d:
        path = Path(d) / "stdlib.jsonl"
        file_handler = logging.FileHandler(path, encoding="utf-8")
        file_handler.setFormatter(_JsonFormatter())
        q: queue.Queue[logging.LogRecord] = queue.Queue(-1)
        listener = logging.handlers.QueueListener(q, file_handler)
        log = logging.getLogger("bench")
        log.setLevel(logging.INFO)
        log.propagate = False
        log.addHandler(logging.handlers.QueueHandler(q))
        listener.start()
        seq = itertools.count(1).__next__
        info = log.info

        def record(i: int) -> None:
            info(
                EVENT,
                extra={
                    "run_id": RUN_ID,
                    "seq": seq(),
                    "group_id": GROUP_ID,
                    "prompt_id": i,
                    "generation_index": i & 7,
                    "attempt": 0,
                    "weight_version": WEIGHT_VERSION,
                },
            )

        def shutdown() -> None:
            listener.stop()
            file_handler.close()

        return _measure(events, record, shutdown, path)


def run_structlog(events: int) -> dict[str, Any]:
    import orjson
    import structlog

    with tmp_dir() as d:
        path = Path(d) / "structlog.jsonl"
        f = open(path, "wb")  # noqa: SIM115 (closed in shutdown, inside the clock)
        structlog.configure(
            processors=[
                structlog.processors.TimeStamper(fmt=None, key="time"),
                structlog.processors.JSONRenderer(serializer=orjson.dumps),
            ],
            wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
            logger_factory=structlog.BytesLoggerFactory(file=f),
            cache_logger_on_first_use=True,
        )
        log = structlog.get_logger().bind(run_id=RUN_ID)
        seq = itertools.count(1).__next__
        info = log.info

        def record(i: int) -> None:
            info(
                EVENT,
                seq=seq(),
                group_id=GROUP_ID,
                prompt_id=i,
                generation_index=i & 7,
                attempt=0,
                weight_version=WEIGHT_VERSION,
            )

        return _measure(events, record, f.close, path)


def run_loguru(events: int) -> dict[str, Any]:
    from loguru import logger

    with tmp_dir() as d:
        path = Path(d) / "loguru.jsonl"
        logger.remove()
        logger.add(path, enqueue=True, serialize=True, format="{message}")
        log = logger.bind(run_id=RUN_ID)
        seq = itertools.count(1).__next__
        info = log.info

        def record(i: int) -> None:
            info(
                EVENT,
                seq=seq(),
                group_id=GROUP_ID,
                prompt_id=i,
                generation_index=i & 7,
                attempt=0,
                weight_version=WEIGHT_VERSION,
            )

        def shutdown() -> None:
            logger.complete()
            logger.remove()

        return _measure(events, record, shutdown, path)


def run_otel_span(events: int) -> dict[str, Any]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    with tmp_dir() as d:
        path = Path(d) / "otel_span.jsonl"
        f = open(path, "w", encoding="utf-8")  # noqa: SIM115 (closed in shutdown)
        exporter = ConsoleSpanExporter(out=f, formatter=lambda s: s.to_json(indent=None) + "\n")
        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=QUEUE_SIZE))
        tracer = provider.get_tracer("bench")
        seq = itertools.count(1).__next__
        start_span = tracer.start_span

        def record(i: int) -> None:
            start_span(
                EVENT,
                attributes={
                    "run_id": RUN_ID,
                    "seq": seq(),
                    "group_id": GROUP_ID,
                    "prompt_id": i,
                    "generation_index": i & 7,
                    "attempt": 0,
                    "weight_version": WEIGHT_VERSION,
                },
            ).end()

        def shutdown() -> None:
            provider.shutdown()
            f.close()

        return _measure(events, record, shutdown, path)


def run_otel_log(events: int) -> dict[str, Any]:
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, ConsoleLogRecordExporter

    with tmp_dir() as d:
        path = Path(d) / "otel_log.jsonl"
        f = open(path, "w", encoding="utf-8")  # noqa: SIM115 (closed in shutdown)
        exporter = ConsoleLogRecordExporter(
            out=f, formatter=lambda r: r.to_json(indent=None) + "\n"
        )
        provider = LoggerProvider()
        provider.add_log_record_processor(
            BatchLogRecordProcessor(exporter, max_queue_size=QUEUE_SIZE)
        )
        emit = provider.get_logger("bench").emit
        seq = itertools.count(1).__next__

        def record(i: int) -> None:
            emit(
                event_name=EVENT,
                attributes={
                    "run_id": RUN_ID,
                    "seq": seq(),
                    "group_id": GROUP_ID,
                    "prompt_id": i,
                    "generation_index": i & 7,
                    "attempt": 0,
                    "weight_version": WEIGHT_VERSION,
                },
            )

        def shutdown() -> None:
            provider.shutdown()
            f.close()

        return _measure(events, record, shutdown, path)


MODES = {
    "stdlib": run_stdlib,
    "structlog": run_structlog,
    "loguru": run_loguru,
    "otel_span": run_otel_span,
    "otel_log": run_otel_log,
}

COLUMNS = [
    ("events/s end to end", "e2e_eps", 0),
    ("caller wall ns/ev", "caller_wall_ns", 0),
    ("caller CPU ns/ev", "caller_cpu_ns", 0),
    ("lines", "lines", 0),
    ("dropped", "dropped", 0),
    ("peak RSS MiB", "maxrss_mib", 1),
]

if __name__ == "__main__":
    script_main("peers.py", MODES, __doc__, COLUMNS)
