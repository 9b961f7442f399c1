"""Sinks that third parties could ship, registered as plugins by the tests."""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Mapping
from importlib.metadata import EntryPoint

import pytest

import rollout_trace._writing.specs as sinkspec
from rollout_trace.sinks import MemorySink, Sink, SinkOptionError


class FailingSink(MemorySink):
    """Keeps the first ``ok`` batches, then raises OSError on every write."""

    options = frozenset({"ok"})

    def __init__(self, location: str, options: Mapping[str, str]) -> None:
        super().__init__(location, options)
        try:
            self.ok = int(options.get("ok", "0"))
        except ValueError as exc:
            raise SinkOptionError(f"ok={options['ok']!r} is not an integer") from exc
        self.writes = 0
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes += 1
        if self.writes > self.ok:
            raise OSError(28, "No space left on device (injected)")
        super().write(data)

    def close(self) -> None:
        self.closed = True


class SlowSink(MemorySink):
    """Sleeps ``delay`` seconds in every write (on its own thread)."""

    options = frozenset({"delay"})

    def __init__(self, location: str, options: Mapping[str, str]) -> None:
        super().__init__(location, options)
        self.delay = float(options.get("delay", "0.05"))

    def write(self, data: bytes) -> None:
        time.sleep(self.delay)
        super().write(data)


class StuckSink(MemorySink):
    """Takes the first ``ok`` batches, then never finishes a write (a hung mount)."""

    options = frozenset({"ok"})

    def __init__(self, location: str, options: Mapping[str, str]) -> None:
        super().__init__(location, options)
        self.ok = int(options.get("ok", "1"))
        self.hung = threading.Event()  # set once a write hangs

    def write(self, data: bytes) -> None:
        if self.ok <= 0:
            self.hung.set()
            threading.Event().wait()  # for ever: the thread is a daemon
        self.ok -= 1
        super().write(data)


class UnopenableSink(Sink):
    def open(self) -> None:
        raise PermissionError(13, "Permission denied (injected)")


class NotASink:
    pass


if inspect.iscoroutinefunction(Sink.write):  # pragma: no cover
    # The sink API before the writer's rewrite was async. These versions let
    # the shared suites run against that code too, to show which promises it
    # broke (they fail there on behaviour, not on an import).
    import anyio

    class FailingSink(MemorySink):  # type: ignore[no-redef]
        options = frozenset({"ok"})

        def __init__(self, location: str, options: Mapping[str, str]) -> None:
            super().__init__(location, options)
            self.ok = int(options.get("ok", "0"))
            self.writes = 0
            self.closed = False

        async def write(self, data: bytes) -> None:  # type: ignore[override]
            self.writes += 1
            if self.writes > self.ok:
                raise OSError(28, "No space left on device (injected)")
            await super().write(data)  # type: ignore[misc]

        async def aclose(self) -> None:
            self.closed = True

    class SlowSink(MemorySink):  # type: ignore[no-redef]
        options = frozenset({"delay"})

        def __init__(self, location: str, options: Mapping[str, str]) -> None:
            super().__init__(location, options)
            self.delay = float(options.get("delay", "0.05"))

        async def write(self, data: bytes) -> None:  # type: ignore[override]
            await anyio.sleep(self.delay)
            await super().write(data)  # type: ignore[misc]

    class StuckSink(MemorySink):  # type: ignore[no-redef]
        options = frozenset({"ok"})

        def __init__(self, location: str, options: Mapping[str, str]) -> None:
            super().__init__(location, options)
            self.ok = int(options.get("ok", "1"))

        async def write(self, data: bytes) -> None:  # type: ignore[override]
            if self.ok <= 0:
                await anyio.sleep_forever()
            self.ok -= 1
            await super().write(data)  # type: ignore[misc]

    class UnopenableSink(Sink):  # type: ignore[no-redef]
        async def open(self) -> None:  # type: ignore[override]
            raise PermissionError(13, "Permission denied (injected)")


PLUGINS = {
    "failing": "plugin_sinks:FailingSink",
    "slow": "plugin_sinks:SlowSink",
    "stuck": "plugin_sinks:StuckSink",
    "unopenable": "plugin_sinks:UnopenableSink",
    "notasink": "plugin_sinks:NotASink",
    "broken": "plugin_sinks_missing_module:Nothing",
}


@pytest.fixture
def plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    """Install the test plugins the way an installed package would: as entry points."""
    registry = sinkspec._registry()
    for name, value in PLUGINS.items():
        monkeypatch.setitem(
            registry, name, EntryPoint(name=name, value=value, group=sinkspec.ENTRY_POINT_GROUP)
        )
