"""What both tracers are configured with, checked once, and what makes a run."""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ._encoding import encode_one
from ._events import TraceClosed, TraceOpened
from ._sinkspec import SinkSpec, capture_override, parse_uri, uris_from_env
from ._version import __version__

__all__ = ["TracerConfig", "TraceCounts", "Run", "noop_emit"]

DEFAULT_BUFFER = 65_536
DEFAULT_BATCH = 4_096
DEFAULT_FLUSH_INTERVAL = 0.25
DEFAULT_CLOSE_TIMEOUT = 10.0


# ``emit`` of a disabled or closed tracer. A C method that takes one object
# and keeps nothing (a deque of length 0 discards at once) costs about half
# of a call to an empty Python function.
noop_emit: Callable[[Any], None] = deque(maxlen=0).append


def _positive(name: str, value: Any, kind: type) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
        raise TypeError(f"{name} must be a {kind.__name__}, not {type(value).__name__}: {value!r}")
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return kind(value)


def _clock(clock: Any) -> Callable[[], float]:
    if not callable(clock):
        raise TypeError(f"clock must be a callable returning Unix seconds, not {clock!r}")
    value = clock()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"clock() must return a float (Unix seconds), returned {value!r}")
    return clock  # type: ignore[no-any-return]


@dataclass(frozen=True)
class TracerConfig:
    """A tracer's settings: all a tracer is, before it opens (and what it pickles as)."""

    uris: tuple[str, ...]
    enabled: bool = True
    meta: Mapping[str, Any] = field(default_factory=dict)
    buffer: int = DEFAULT_BUFFER
    batch_size: int = DEFAULT_BATCH
    flush_interval: float = DEFAULT_FLUSH_INTERVAL
    close_timeout: float = DEFAULT_CLOSE_TIMEOUT
    # The wall clock that stamps ``time``; a simulation may pass its own.
    clock: Callable[[], float] = time.time

    @classmethod
    def make(
        cls,
        uris: tuple[str, ...],
        *,
        enabled: bool,
        meta: Mapping[str, Any] | None,
        buffer: int,
        batch_size: int,
        flush_interval: float,
        close_timeout: float,
        clock: Callable[[], float] = time.time,
    ) -> TracerConfig:
        if enabled and not uris:
            uris = tuple(uris_from_env())
            enabled = bool(uris)
        if capture_override:
            enabled = True  # capture_events() sees the events of every tracer
        meta = dict(meta or {})
        if not all(isinstance(k, str) for k in meta):
            raise TypeError(f"meta keys must be str, got {sorted(map(repr, meta))}")
        try:
            encode_one(meta)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"meta must be JSON-encodable: {exc}") from exc
        buffer = _positive("buffer", buffer, int)
        # At least two batches fit in the buffer: one filling, one being written.
        batch_size = min(_positive("batch_size", batch_size, int), max(1, buffer // 2))
        return cls(
            uris=uris,
            enabled=enabled,
            meta=meta,
            buffer=buffer,
            batch_size=batch_size,
            flush_interval=_positive("flush_interval", flush_interval, float),
            close_timeout=_positive("close_timeout", close_timeout, float),
            clock=_clock(clock),
        )

    def specs(self) -> list[SinkSpec]:
        """Parse the URIs (raises a ``SinkError`` subclass for a bad one)."""
        return [parse_uri(uri) for uri in self.uris] if self.enabled else []


class TraceCounts(NamedTuple):
    """What a run's ``emit`` calls came to: ``trace_closed``'s counts, at any time.

    ``pending`` is what is emitted but not yet handed to the sinks (0 once the
    run is closed, when it has become ``written`` or ``dropped``).
    """

    emitted: int = 0
    written: int = 0
    dropped: int = 0
    invalid: int = 0
    pending: int = 0


class Run:
    """One run's identity: a new ``run_id`` for every open, and in every process."""

    __slots__ = ("clock", "final", "host", "pid", "run_id")

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.run_id = uuid.uuid4().hex
        self.pid = os.getpid()
        self.host = socket.gethostname()
        self.final: TraceClosed | None = None

    def counts(self, emitted: int, written: int, invalid: int, full_drops: int) -> TraceCounts:
        """The counts so far; the final ones once ``closed()`` has been built."""
        if self.final is not None:
            f = self.final
            return TraceCounts(f.emitted, f.written, f.dropped, f.invalid, 0)
        pending = emitted - written - invalid - full_drops
        return TraceCounts(emitted, written, full_drops, invalid, pending)

    def opened(self, meta: Mapping[str, Any]) -> TraceOpened:
        return TraceOpened(
            time=self.clock(),
            seq=0,
            sdk_version=__version__,
            pid=self.pid,
            host=self.host,
            meta=dict(meta),
        )

    def closed(self, *, seq: int, emitted: int, written: int, invalid: int) -> TraceClosed:
        """The run's ``trace_closed``; the first call fixes the counts for good.

        A close that gives up at its deadline calls it first, and what the
        writer still manages after that does not change what close() reported.
        """
        if self.final is not None:
            return self.final
        self.final = TraceClosed(
            time=self.clock(),
            seq=seq,
            emitted=emitted,
            written=written,
            dropped=emitted - written - invalid,
            invalid=invalid,
        )
        return self.final
