"""``t.attempt(...)``: one try's lifecycle in one statement, for both tracers.

The logic is one sync class: entering emits ``attempt_dispatched``, the body
or the way out emits the one end event. Nothing in it awaits (``emit`` is
sync), so ``async with`` and ``with`` are thin doors to the same methods.
"""

from __future__ import annotations

import asyncio
import sys
from types import TracebackType
from typing import Any, Literal, Protocol

from .._errors import TracerStateError
from .._schema.events import (
    AttemptAbandoned,
    AttemptDispatched,
    AttemptRefused,
    AttemptSealed,
    Event,
)

__all__ = ["Attempt", "Outcome", "is_stop"]

# What ended a try: the body's choice, or the way the block was left.
Outcome = Literal["sealed", "refused", "dropped", "failed", "cancelled"]

# Not errors of the try: it was stopped from outside (Ctrl-C, an exit, a
# generator closed), so it ends as cancelled, as a cancelled task does.
_STOPS = (asyncio.CancelledError, KeyboardInterrupt, SystemExit, GeneratorExit)


def is_stop(exc: BaseException) -> bool:
    """Whether ``exc`` stopped the try from outside rather than being its failure.

    A cancellation of any backend (anyio's class is asyncio's
    ``CancelledError`` under asyncio and uvloop, ``trio.Cancelled`` under
    trio), Ctrl-C, an exit, or a group holding nothing else. Asked without a
    running event loop: the sync tracer's blocks may be in a thread.
    """
    if isinstance(exc, _STOPS):
        return True
    trio = sys.modules.get("trio")
    if trio is not None and isinstance(exc, trio.Cancelled):
        return True
    # An exception group, duck-typed: Python 3.10 has no built-in class for it.
    inner = getattr(exc, "exceptions", None)
    return isinstance(inner, tuple) and bool(inner) and all(map(is_stop, inner))


class _Tracer(Protocol):
    """What an attempt asks of the tracer that made it (either tracer)."""

    def emit(self, ev: Event) -> None: ...

    def _unchosen(self, name: str) -> None: ...

    @property
    def _attempts(self) -> dict[Attempt, None]: ...


class Attempt:
    """One try of one sibling, from its dispatch to its one end event.

    Made by ``t.attempt(...)`` of either tracer and used as a context manager:
    ``async with t.attempt(...) as a:`` or ``with t.attempt(...) as a:``
    (the two are the same: nothing here awaits). Entering emits
    ``attempt_dispatched``; exactly one end event follows:

    - what the body chose, emitted when it chooses: ``a.seal()``
      (``attempt_sealed``), ``a.refuse(reason)`` (``attempt_refused``) or
      ``a.drop()`` (``attempt_abandoned``, reason ``dropped``);
    - else, on an exception, ``attempt_abandoned`` with reason ``failed``, or
      ``cancelled`` for a cancellation (asyncio's, trio's, anyio's), Ctrl-C
      or an exit; the exception goes on as it came;
    - else (the block left without a choice): ``attempt_abandoned`` with
      reason ``dropped``, the try's result having been kept nowhere, and a
      warning naming the try (once a run); a strict tracer raises
      ``TracerStateError`` instead of warning, after emitting it.

    Choosing twice, or outside the block, raises ``TracerStateError``: an
    attempt ends once. A retry is a new ``t.attempt(..., attempt=n + 1)``.
    Every call is O(1) and never blocks (each is one ``emit``).
    """

    __slots__ = ("_closed_out", "_entered", "_ids", "_outcome", "_tracer", "_weight_version")

    def __init__(
        self,
        tracer: _Tracer,
        group_id: str,
        prompt_id: int | str,
        generation_index: int,
        attempt: int,
        weight_version: int,
    ) -> None:
        self._tracer = tracer
        self._ids = (group_id, prompt_id, generation_index, attempt)
        self._weight_version = weight_version
        self._entered = False
        self._outcome: Outcome | None = None
        self._closed_out = False  # ended by the tracer's close (``close_out``)

    # --- what the body sees ------------------------------------------------------

    @property
    def outcome(self) -> Outcome | None:
        """How the try ended (``sealed``, ``refused``, or the abandon's reason);
        ``None`` while it runs."""
        return self._outcome

    def seal(self) -> None:
        """End the try with its result kept: emits ``attempt_sealed`` now."""
        self._end("sealed")

    def refuse(self, reason: str) -> None:
        """End the try as turned down, for ``reason`` (the controller's own word):
        emits ``attempt_refused`` now."""
        if not isinstance(reason, str):
            raise TypeError(f"refuse() takes a str reason, not {type(reason).__name__}: {reason!r}")
        self._end("refused", reason)

    def drop(self) -> None:
        """End the try as thrown away (stale, say): emits ``attempt_abandoned``
        with reason ``dropped`` now."""
        self._end("dropped")

    def __repr__(self) -> str:
        state = self._outcome or ("running" if self._entered else "not dispatched")
        return f"<rollout_trace.Attempt {self._name()}: {state}>"

    # --- the lifecycle -----------------------------------------------------------

    def _fields(self) -> dict[str, Any]:
        """The try's identity, as the fields of its events."""
        group_id, prompt_id, generation_index, attempt = self._ids
        return {
            "group_id": group_id,
            "prompt_id": prompt_id,
            "generation_index": generation_index,
            "attempt": attempt,
        }

    def _name(self) -> str:
        group_id, prompt_id, generation_index, attempt = self._ids
        return (
            f"attempt {attempt} of sibling (prompt_id={prompt_id!r}, "
            f"generation_index={generation_index!r}) in group {group_id!r}"
        )

    def _enter(self) -> Attempt:
        if self._entered:
            raise TracerStateError(
                f"{self._name()} was dispatched already: enter each t.attempt(...) once "
                "(a retry is a new t.attempt(..., attempt=n + 1))"
            )
        self._tracer.emit(AttemptDispatched(**self._fields(), weight_version=self._weight_version))
        # Only now: a dispatch that strict mode refused leaves nothing to end.
        self._entered = True
        self._tracer._attempts[self] = None
        return self

    def close_out(self) -> None:
        """End a try still running when its tracer closes, as ``cancelled``,
        so that its end is in the run; what the body does with it after that
        does nothing (the tracer is closed)."""
        if self._outcome is None and self._entered:
            self._end("cancelled")
            self._closed_out = True

    def _end(self, outcome: Outcome, refusal: str = "") -> None:
        if self._closed_out:
            return
        if self._outcome is not None:
            raise TracerStateError(
                f"{self._name()} has ended already ({self._outcome}): an attempt ends "
                "once, by one of a.seal(), a.refuse(reason) or a.drop()"
            )
        if not self._entered:
            raise TracerStateError(
                f"{self._name()} is not dispatched: end it inside its block, "
                "`async with t.attempt(...) as a:` (or `with` on a sync tracer)"
            )
        self._outcome = outcome
        self._tracer._attempts.pop(self, None)
        ids = self._fields()
        ev: Event
        if outcome == "sealed":
            ev = AttemptSealed(**ids)
        elif outcome == "refused":
            ev = AttemptRefused(**ids, reason=refusal)
        else:
            ev = AttemptAbandoned(**ids, reason=outcome)
        self._tracer.emit(ev)

    def _exit(self, exc: BaseException | None) -> None:
        if self._outcome is not None or not self._entered:
            return  # the body chose: an exception after that goes on untouched
        if exc is not None:
            self._end("cancelled" if is_stop(exc) else "failed")
            return
        self._end("dropped")
        self._tracer._unchosen(self._name())

    def __enter__(self) -> Attempt:
        return self._enter()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._exit(exc)

    async def __aenter__(self) -> Attempt:
        return self._enter()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._exit(exc)
