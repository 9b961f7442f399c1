"""Runs one scenario through every tracer and backend (shared by the writing tests).

A scenario is ``async def scenario(h: Handle)``: it emits with ``h.emit`` and
flushes with ``await h.flush()``, and is run by each driver: the async tracer
under asyncio, uvloop and trio, and the sync tracer (its emits and flushes
block as they would in a thread).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio

import rollout_trace as rt


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

    @property
    def counts(self) -> rt.TraceCounts:
        return self.tracer.counts


Scenario = Callable[[Handle], Awaitable[Any]]


@dataclass
class Outcome:
    tracer: rt.Tracer | rt.SyncTracer
    value: Any

    @property
    def counts(self) -> rt.TraceCounts:
        return self.tracer.counts


class Driver:
    name: str

    def run(self, uris: list[str], scenario: Scenario, **kwargs: Any) -> Outcome:
        raise NotImplementedError


class AsyncDriver(Driver):
    def __init__(self, backend: str, options: dict[str, Any] | None = None) -> None:
        self.backend = backend
        self.options = options or {}
        self.name = "tracer-uvloop" if self.options else f"tracer-{backend}"

    def run(self, uris: list[str], scenario: Scenario, **kwargs: Any) -> Outcome:
        t = rt.tracer(*uris, **kwargs)

        async def main() -> Any:
            async with t:
                return await scenario(Handle(t))

        value = anyio.run(main, backend=self.backend, backend_options=self.options)
        return Outcome(t, value)


class SyncDriver(Driver):
    name = "sync_tracer"

    def run(self, uris: list[str], scenario: Scenario, **kwargs: Any) -> Outcome:
        t = rt.sync_tracer(*uris, **kwargs)
        with t:
            value = asyncio.run(scenario(Handle(t)))
        return Outcome(t, value)


DRIVERS: list[Driver] = [
    AsyncDriver("asyncio"),
    AsyncDriver("asyncio", {"use_uvloop": True}),
    AsyncDriver("trio"),
    SyncDriver(),
]
IDS = [d.name for d in DRIVERS]
