"""One suite over every built-in sink, through both tracers (SPEC sections 1, 2 and 5)."""

from __future__ import annotations

import asyncio
import gzip
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from samples import ROLLOUT_SAMPLES
from tracecheck import only_run

import rollout_trace as rt
from sinks import MemorySink, NullSink

N = 5_000


def _scenario(t: rt.Tracer | rt.SyncTracer) -> list[rt.Event]:
    sent: list[rt.Event] = []
    for i in range(N):
        ev = type(ROLLOUT_SAMPLES[i % len(ROLLOUT_SAMPLES)])(
            **{
                k: getattr(ROLLOUT_SAMPLES[i % len(ROLLOUT_SAMPLES)], k)
                for k in ROLLOUT_SAMPLES[i % len(ROLLOUT_SAMPLES)].__struct_fields__
                if k not in ("time", "run_id", "seq")
            }
        )
        t.emit(ev)
        sent.append(ev)
    return sent


def run_async(uris: list[str]) -> tuple[list[rt.Event], list[object]]:
    async def main() -> tuple[list[rt.Event], list[object]]:
        async with rt.tracer(*uris, batch_size=512) as t:
            sent = _scenario(t)
            await t.flush()
            sinks = list(t.sinks)
        return sent, sinks

    return asyncio.run(main())


def run_sync(uris: list[str]) -> tuple[list[rt.Event], list[object]]:
    with rt.sync_tracer(*uris, batch_size=512) as t:
        sent = _scenario(t)
        assert t.flush(timeout=30)
        sinks = list(t.sinks)
    return sent, sinks


RUNNERS = {"tracer": run_async, "sync_tracer": run_sync}


def _via_subprocess(stream: str, runner: str) -> bytes:
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_sink_contract import RUNNERS
        RUNNERS[{runner!r}](["{stream}://"])
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        timeout=120,
        check=True,
        env={"PYTHONPATH": str(Path(__file__).parents[1])},
    )
    return proc.stdout if stream == "stdout" else proc.stderr


# Each built-in sink, and how to read back what it got: (name, uri maker, reader).
SINKS: list[tuple[str, Callable[[Path], str], Callable[[Path, list[object], str], bytes]]] = [
    ("jsonl", lambda d: f"jsonl://{d}/t.jsonl", lambda d, s, r: (d / "t.jsonl").read_bytes()),
    ("bare path", lambda d: f"{d}/sub/t.jsonl", lambda d, s, r: (d / "sub/t.jsonl").read_bytes()),
    (
        "jsonl.gz",
        lambda d: f"jsonl://{d}/t.jsonl.gz",
        lambda d, s, r: gzip.decompress((d / "t.jsonl.gz").read_bytes()),
    ),
    ("memory", lambda d: "memory://", lambda d, s, r: s[0].getvalue()),  # type: ignore[attr-defined]
    ("stdout", lambda d: "", lambda d, s, r: _via_subprocess("stdout", r)),
    ("stderr", lambda d: "", lambda d, s, r: _via_subprocess("stderr", r)),
]


@pytest.mark.parametrize("runner", sorted(RUNNERS))
@pytest.mark.parametrize(("name", "make_uri", "read"), SINKS, ids=[s[0] for s in SINKS])
def test_every_sink_gets_every_event_once(
    name: str,
    make_uri: Callable[[Path], str],
    read: Callable[[Path, list[object], str], bytes],
    runner: str,
    tmp_path: Path,
) -> None:
    uri = make_uri(tmp_path)
    sent, sinks = RUNNERS[runner]([uri]) if uri else ([], [])
    data = read(tmp_path, sinks, runner)
    run = only_run(data)
    assert run.closed is not None
    assert run.closed["emitted"] == run.closed["written"] == N
    assert [e["seq"] for e in run.events] == list(range(1, N + 1))
    if sent:
        assert [e["event"] for e in run.events] == [type(ev).__struct_config__.tag for ev in sent]


@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_null_sink_is_handed_the_same_bytes(runner: str) -> None:
    _, sinks = RUNNERS[runner](["null://", "memory://"])
    null, memory = sinks
    assert isinstance(null, NullSink) and isinstance(memory, MemorySink)
    assert null.bytes_written == len(memory.getvalue()) > 0
