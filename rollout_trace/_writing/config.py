"""What both tracers are configured with, checked once before anything opens."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .._errors import SinkError
from .._schema.encoding import encode_one
from .._schema.reasons import non_finite_in, show
from .specs import ENV_VAR, SinkSpec, capture_override, parse_uri, uris_from_env

__all__ = ["TracerConfig", "TraceCounts"]

# Events held at most (about 36 MiB of attempt_dispatched events when full).
# A thread emitting flat out outruns a writer thread that shares the GIL with
# it whenever the writer is held up: the writer waits a switch interval for the
# GIL after every write, and on a busy machine the system may not run it for
# tens of milliseconds. A quarter of a million events rides that out.
DEFAULT_BUFFER = 262_144
DEFAULT_BATCH = 4_096
DEFAULT_FLUSH_INTERVAL = 0.25
DEFAULT_CLOSE_TIMEOUT = 10.0


# ``emit`` of a disabled tracer. A C method that takes one object and keeps
# nothing (a deque of length 0 discards at once) costs about half of a call
# to an empty Python function.
def _positive(name: str, value: Any, kind: type, *, infinite: bool = False) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
        raise TypeError(f"{name} must be a {kind.__name__}, not {type(value).__name__}: {value!r}")
    if not value > 0 or (math.isinf(value) and not infinite):
        allowed = "> 0 (math.inf for no limit)" if infinite else "> 0 and finite"
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return kind(value)


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, not {type(value).__name__}: {value!r}")
    return value


def _clock(clock: Any) -> Callable[[], float]:
    if not callable(clock):
        raise TypeError(f"clock must be a callable returning Unix seconds, not {clock!r}")
    value = clock()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"clock() must return a float (Unix seconds), returned {value!r}")
    # Every reader skips a line whose time is not > 0: a clock that starts
    # there would write a run no one can read. A later bad value makes only
    # its own event invalid (the writer's checks).
    if not value > 0 or value == math.inf:  # `not nan > 0` too
        raise ValueError(
            f"clock() must return Unix seconds, a finite number > 0, returned {value!r}"
        )
    return clock  # type: ignore[no-any-return]


def _deadline_clock(clock: Any) -> Callable[[], float]:
    if not callable(clock):
        raise TypeError(f"deadline_clock must be a callable returning seconds, not {clock!r}")
    value = clock()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TypeError(
            f"deadline_clock() must return a finite float (seconds), returned {value!r}"
        )
    return clock  # type: ignore[no-any-return]


def _meta(meta: Mapping[str, Any] | None) -> dict[str, Any]:
    """``meta`` as ``trace_opened`` holds it, refused now if it cannot be written."""
    meta = dict(meta or {})
    if not all(isinstance(k, str) for k in meta):
        raise TypeError(f"meta keys must be str, got {sorted(map(repr, meta))}")
    try:
        encode_one(meta)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"meta must be JSON-encodable: {exc}") from exc
    # msgspec writes NaN and infinity as null, which the writer's checks
    # refuse: trace_opened would be left out of the run.
    found = non_finite_in(meta)
    if found is not None:
        path, value = found
        raise ValueError(
            f"meta{path} must be a finite number, got {show(value)}: "
            "JSON cannot hold NaN or infinity"
        )
    return meta


@dataclass(frozen=True)
class TracerConfig:
    """A tracer's settings: all a tracer is, before it opens (and what it pickles as)."""

    uris: tuple[str, ...]
    enabled: bool = True
    meta: Mapping[str, Any] = field(default_factory=dict)
    buffer: int = DEFAULT_BUFFER
    batch_size: int = DEFAULT_BATCH
    flush_interval: float = DEFAULT_FLUSH_INTERVAL
    # One deadline for a close, and how long one sink call may take before the
    # sink is given up; math.inf waits for ever.
    close_timeout: float = DEFAULT_CLOSE_TIMEOUT
    # The wall clock that stamps ``time``; a simulation may pass its own.
    clock: Callable[[], float] = time.time
    # The clock of every deadline (open, flush, close, a hung sink's give-up),
    # in seconds that only go forward; a test passes ``testing.MockClock``.
    deadline_clock: Callable[[], float] = time.monotonic
    # The URIs came from $ROLLOUT_TRACE, which errors then name.
    from_env: bool = False
    # Raise at emit for an event the writer would count invalid (for tests).
    strict: bool = False

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
        deadline_clock: Callable[[], float] = time.monotonic,
        strict: bool = False,
    ) -> TracerConfig:
        from_env = False
        if enabled and not uris:
            uris = tuple(uris_from_env())
            enabled = from_env = bool(uris)
        if capture_override:
            enabled = True  # capture_events() sees the events of every tracer
        meta = _meta(meta)
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
            close_timeout=_positive("close_timeout", close_timeout, float, infinite=True),
            clock=_clock(clock),
            deadline_clock=_deadline_clock(deadline_clock),
            from_env=from_env,
            strict=_flag("strict", strict),
        )

    def specs(self) -> list[SinkSpec]:
        """Parse the URIs (raises a ``SinkError`` subclass for a bad one)."""
        if not self.enabled:
            return []
        try:
            return [parse_uri(uri) for uri in self.uris]
        except SinkError as exc:
            if not self.from_env:
                raise
            # A typo in a Ray runtime_env or a job spec is found by its name.
            raise type(exc)(exc.uri, f"{exc.reason} (from ${ENV_VAR})") from exc


class TraceCounts(NamedTuple):
    """What a run's ``emit`` calls came to: ``trace_closed``'s counts, at any time.

    ``pending`` is what is emitted but not yet written or given up (0 once
    the run is closed). ``outside_run`` counts emits made while no run was
    open (before the open, or after the close, also through an ``emit`` kept
    from the open run): they belong to no run and are not in ``trace_closed``.
    """

    emitted: int = 0
    written: int = 0
    dropped: int = 0
    invalid: int = 0
    pending: int = 0
    outside_run: int = 0
