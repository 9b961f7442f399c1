"""Runs one scenario through every tracer and backend (shared by the writing tests).

A scenario is ``async def scenario(h: Handle)``: it emits with ``h.emit`` and
flushes with ``await h.flush()``, and is run by each driver: the async tracer
under asyncio, uvloop and trio, and the sync tracer (its emits and flushes
block as they would in a thread). ``await h.sleep(s)`` lets time pass on any
of them (the sync tracer's writer runs on its own thread meanwhile).

``driver.make(...)`` builds a tracer without opening it, ``driver.drive(t,
scenario)`` opens it, runs the scenario and closes it (an exception from the
scenario comes out as it went in), and ``driver.run(uris, scenario)`` does
both. ``after=`` runs a second scenario on the same event loop once the
tracer has closed. ``run_child`` does the same in a fresh interpreter, for
what only a process of its own shows (its standard streams, a SIGKILL).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

import rollout_trace as rt

TESTS = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent


@dataclass
class Handle:
    tracer: rt.Tracer | rt.SyncTracer

    def emit(self, ev: rt.Event) -> None:
        self.tracer.emit(ev)

    async def flush(self) -> bool:
        t = self.tracer
        if isinstance(t, rt.SyncTracer):
            return t.flush()
        return await t.flush()

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)

    @property
    def counts(self) -> rt.TraceCounts:
        return self.tracer.counts


Scenario = Callable[[Handle], Awaitable[Any]]
# Entered as the scenario ends, left once the close returned (on the thread
# that closes): ``deadlines.advancing`` moves a test's clock past the close's
# deadline.
Closing = Callable[[], AbstractContextManager[Any]]


@dataclass
class Outcome:
    tracer: rt.Tracer | rt.SyncTracer
    value: Any
    # Seconds from the scenario's end to the tracer's close returning.
    close_s: float = 0.0
    after: Any = field(default=None)

    @property
    def counts(self) -> rt.TraceCounts:
        return self.tracer.counts


class Driver:
    name: str
    #: "async" for rt.tracer, "sync" for rt.sync_tracer
    kind: str

    def make(self, *uris: str, **kwargs: Any) -> rt.Tracer | rt.SyncTracer:
        """A tracer of this driver's kind, not opened."""
        raise NotImplementedError

    def drive(
        self,
        t: Any,
        scenario: Scenario,
        *,
        after: Scenario | None = None,
        closing: Closing | None = None,
    ) -> Outcome:
        """Open ``t``, run ``scenario``, close ``t`` (inside ``closing()``);
        then ``after`` on the same loop."""
        raise NotImplementedError

    def run(
        self,
        uris: list[str],
        scenario: Scenario,
        *,
        after: Scenario | None = None,
        closing: Closing | None = None,
        **kwargs: Any,
    ) -> Outcome:
        return self.drive(self.make(*uris, **kwargs), scenario, after=after, closing=closing)

    def __repr__(self) -> str:
        return self.name


class AsyncDriver(Driver):
    kind = "async"

    def __init__(self, backend: str, options: dict[str, Any] | None = None) -> None:
        self.backend = backend
        self.options = options or {}
        self.name = "tracer-uvloop" if self.options else f"tracer-{backend}"

    def make(self, *uris: str, **kwargs: Any) -> rt.Tracer:
        return rt.tracer(*uris, **kwargs)

    def drive(
        self,
        t: Any,
        scenario: Scenario,
        *,
        after: Scenario | None = None,
        closing: Closing | None = None,
    ) -> Outcome:
        times: list[float] = []

        async def main() -> tuple[Any, Any]:
            with contextlib.ExitStack() as stack:
                try:
                    async with t:
                        try:
                            return_value = await scenario(Handle(t))
                        finally:
                            times.append(time.monotonic())
                            if closing is not None:
                                stack.enter_context(closing())
                finally:
                    times.append(time.monotonic())
            after_value = None if after is None else await after(Handle(t))
            return return_value, after_value

        value, after_value = self.call(main)
        return Outcome(t, value, times[1] - times[0], after_value)

    def call(self, main: Callable[[], Awaitable[Any]]) -> Any:
        """Run ``main`` on a new event loop of this driver's backend."""
        return anyio.run(main, backend=self.backend, backend_options=self.options)


class SyncDriver(Driver):
    name = "sync_tracer"
    kind = "sync"

    def make(self, *uris: str, **kwargs: Any) -> rt.SyncTracer:
        return rt.sync_tracer(*uris, **kwargs)

    def drive(
        self,
        t: Any,
        scenario: Scenario,
        *,
        after: Scenario | None = None,
        closing: Closing | None = None,
    ) -> Outcome:
        times: list[float] = []
        with contextlib.ExitStack() as stack:
            try:
                with t:
                    try:
                        value = asyncio.run(scenario(Handle(t)))
                    finally:
                        times.append(time.monotonic())
                        if closing is not None:
                            stack.enter_context(closing())
            finally:
                times.append(time.monotonic())
        after_value = None if after is None else asyncio.run(after(Handle(t)))
        return Outcome(t, value, times[1] - times[0], after_value)

    def call(self, main: Callable[[], Awaitable[Any]]) -> Any:
        return asyncio.run(main())  # type: ignore[arg-type]


DRIVERS: list[Driver] = [
    AsyncDriver("asyncio"),
    AsyncDriver("asyncio", {"use_uvloop": True}),
    AsyncDriver("trio"),
    SyncDriver(),
]
IDS = [d.name for d in DRIVERS]
BY_NAME = {d.name: d for d in DRIVERS}
ASYNC_DRIVERS = [d for d in DRIVERS if d.kind == "async"]


def child_env() -> dict[str, str]:
    """The environment of a child interpreter that imports what this one does."""
    paths = [str(TESTS), str(HERE), *filter(None, os.environ.get("PYTHONPATH", "").split(":"))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def child_code(
    driver: Driver,
    uris: list[str],
    body: str,
    *,
    kwargs: str = "",
    prelude: str = "",
    then: str = "",
) -> str:
    """A program that runs ``driver`` with a scenario whose body is ``body``.

    ``body`` is the scenario's code (``h`` is the handle; ``rt``, ``anyio``,
    ``os``, ``signal``, ``sys`` and ``time`` are imported); ``kwargs`` is
    Python source for the tracer's keyword arguments, ``prelude`` code run
    first (event classes of one's own, helpers), ``then`` code run after the
    tracer closed, with its ``Outcome`` as ``out``. Run it with ``child_env()``.
    """
    return (
        "import os, signal, sys, time\n"
        "import anyio\n"
        "import rollout_trace as rt\n"
        "from harness import BY_NAME\n"
        + textwrap.dedent(prelude)
        + "\nasync def scenario(h):\n"
        + textwrap.indent(textwrap.dedent(body), "    ")
        + f"\nout = BY_NAME[{driver.name!r}].run({uris!r}, scenario, {kwargs})\n"
        + textwrap.dedent(then)
    )


def run_child(
    driver: Driver,
    uris: list[str],
    body: str,
    *,
    kwargs: str = "",
    prelude: str = "",
    then: str = "",
    timeout: float = 60,
) -> subprocess.CompletedProcess[bytes]:
    """Run ``child_code(...)`` in a fresh interpreter; its output is captured."""
    code = child_code(driver, uris, body, kwargs=kwargs, prelude=prelude, then=then)
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        timeout=timeout,
        env=child_env(),
        check=False,
    )
