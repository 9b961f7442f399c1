"""What both tracer facades are, before and after their runs."""

from __future__ import annotations

from sinks import Sink

from .config import TracerConfig
from .emitting import EmitReport
from .engine import Engine, State

__all__ = ["TracerFacade"]


class TracerFacade:
    """The configuration, state and last sinks every tracer has; the engine does the rest."""

    _state: State
    _engine: Engine
    run_id: str | None

    def __init__(self, config: TracerConfig) -> None:
        self._config = config
        self._specs = config.specs()
        self._state = State.NEW
        self._sinks: list[Sink] = []
        self._report = EmitReport()
        self.run_id = None

    @property
    def enabled(self) -> bool:
        return self._config.enabled

    @property
    def uris(self) -> tuple[str, ...]:
        return self._config.uris

    @property
    def state(self) -> str:
        """``new``, ``opening``, ``open``, ``closing`` or ``closed``."""
        return self._state.value

    @property
    def sinks(self) -> list[Sink]:
        """The sinks of the open or last run (``t.sinks[0].lines()`` of a ``memory://``)."""
        return list(self._sinks)

    def _settled(self) -> bool:
        """``flush()``'s answer when no run is open: was nothing emitted lost?

        A run that never opened has no ``trace_closed``, so it says ``False``.
        """
        if not self._config.enabled:
            return True
        if self._report.outside_run:
            return False
        engine = getattr(self, "_engine", None)
        if self._state is State.NEW or engine is None:  # no run yet (or closed before one)
            return True
        final = engine.final
        return final is not None and final.dropped == 0 and not any(t.error for t in final.sinks)

    def __repr__(self) -> str:
        uris = ", ".join(self._config.uris) or "disabled"
        name = type(self).__name__
        return f"<rollout_trace.{name} {self.state} run_id={self.run_id} sinks=[{uris}]>"
