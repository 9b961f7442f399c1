"""One suite over every built-in sink, through every driver: the async tracer under
asyncio, uvloop and trio, and the sync tracer (README, Reference).

Each sink must really write what it counts: the lines of the run in its output
are counted and compared with its own figure in ``trace_closed.sinks``.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable, Iterator
from pathlib import Path

import otlp_receiver
import pytest
from s3server import BUCKET, S3Server
from samples import ROLLOUT_SAMPLES
from tracecheck import only_run
from writing.harness import DRIVERS, IDS, Driver, Handle, run_child

import rollout_trace as rt
from rollout_trace.sinks import MemorySink, NullSink

N = 5_000


def _events() -> list[rt.Event]:
    """N events, every built-in kind in turn, each a fresh object."""
    fields = ("time", "run_id", "seq")
    return [
        type(sample)(**{k: getattr(sample, k) for k in sample.__struct_fields__ if k not in fields})
        for sample in (ROLLOUT_SAMPLES[i % len(ROLLOUT_SAMPLES)] for i in range(N))
    ]


async def _scenario(h: Handle) -> list[object]:
    for i, ev in enumerate(_events()):
        h.emit(ev)
        if i % 1_000 == 999:
            await h.sleep(0)
    assert await h.flush()
    return list(h.tracer.sinks)


def _via_child(stream: str, driver: Driver) -> bytes:
    proc = run_child(
        driver,
        [f"{stream}://"],
        """
        from test_sink_contract import _scenario
        await _scenario(h)
        """,
        kwargs="batch_size=512",
        prelude=f"sys.path.insert(0, {str(Path(__file__).parent)!r})",
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    if stream == "stdout":
        return proc.stdout
    return proc.stderr


def _segments(
    folder: Path, pattern: str, unpack: Callable[[bytes], bytes], *, at_least: int = 2
) -> bytes:
    """A rotated file's segments, each a whole file, in their order (``at_least`` of them)."""
    paths = sorted(folder.glob(pattern))
    assert len(paths) >= at_least, paths
    return b"".join(unpack(p.read_bytes()) for p in paths)


def _fetch(store: S3Server, prefix: str, folder: Path) -> None:
    """What the store really holds under ``prefix``, read with boto's own client, as files."""
    for key, body in store.objects(prefix).items():
        path = folder / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)


def _memory(sinks: list[object]) -> bytes:
    (sink,) = sinks
    assert isinstance(sink, MemorySink)
    return sink.getvalue()


# Each built-in sink: (name, its URI in a folder, how to read back what it got
# from the folder, the sinks of the run and the driver; "" for a sink that is
# run in a child process of its own).
SINKS: list[tuple[str, Callable[[Path], str], Callable[[Path, list[object], Driver], bytes]]] = [
    ("jsonl", lambda d: f"jsonl://{d}/t.jsonl", lambda d, s, r: (d / "t.jsonl").read_bytes()),
    ("bare path", lambda d: f"{d}/sub/t.jsonl", lambda d, s, r: (d / "sub/t.jsonl").read_bytes()),
    (
        "jsonl.gz",
        lambda d: f"jsonl://{d}/t.jsonl.gz",
        lambda d, s, r: gzip.decompress((d / "t.jsonl.gz").read_bytes()),
    ),
    # In segments of 100 kB (about ten): read back in their order.
    (
        "jsonl rotated",
        lambda d: f"jsonl://{d}/t.jsonl?rotate_mb=0.1",
        lambda d, s, r: _segments(d, "t.*.jsonl", lambda b: b),
    ),
    (
        "jsonl.gz rotated",
        lambda d: f"jsonl://{d}/t.jsonl.gz?rotate_mb=0.02",
        lambda d, s, r: _segments(d, "t.*.jsonl.gz", gzip.decompress),
    ),
    ("memory", lambda d: "memory://", lambda d, s, r: _memory(s)),
    ("stdout", lambda d: "stdout://", lambda d, s, r: _via_child("stdout", r)),
    ("stderr", lambda d: "stderr://", lambda d, s, r: _via_child("stderr", r)),
    # OpenTelemetry log records, read back from what a real OTLP/HTTP receiver
    # (tests/otlp_receiver.py) decoded from the requests it took.
    (
        "otlp",
        lambda d: otlp_receiver.shared_uri(),
        lambda d, s, r: otlp_receiver.shared().lines(),
    ),
    # Objects in a real S3-compatible server (tests/s3server.py), fetched with
    # boto's own client into "s3/" and read back in their order: one segment
    # (t.000001.jsonl), then gzip segments of 20 kB, each a whole object.
    (
        "s3",
        lambda d: f"s3://{BUCKET}/contract/t.jsonl",
        lambda d, s, r: _segments(d / "s3/contract", "t.*.jsonl", lambda b: b, at_least=1),
    ),
    (
        "s3.gz rotated",
        lambda d: f"s3://{BUCKET}/contract/t.jsonl.gz?rotate_mb=0.02",
        lambda d, s, r: _segments(d / "s3/contract", "t.*.jsonl.gz", gzip.decompress),
    ),
]
IN_A_CHILD = ("stdout", "stderr")


@pytest.fixture(scope="module", autouse=True)
def _stop_the_otlp_receiver() -> Iterator[None]:
    yield
    otlp_receiver.stop_shared()


@pytest.mark.parametrize("driver", DRIVERS, ids=IDS)
@pytest.mark.parametrize(("name", "make_uri", "read"), SINKS, ids=[s[0] for s in SINKS])
def test_every_sink_gets_every_event_once_and_counts_it(
    name: str,
    make_uri: Callable[[Path], str],
    read: Callable[[Path, list[object], Driver], bytes],
    driver: Driver,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    uri = make_uri(tmp_path)
    # The store's fixture: an empty bucket, the client's variables pointing at it.
    store: S3Server | None = request.getfixturevalue("s3") if uri.startswith("s3://") else None
    sinks = [] if name in IN_A_CHILD else driver.run([uri], _scenario, batch_size=512).value
    if store is not None:
        _fetch(store, "contract/", tmp_path / "s3")
    data = read(tmp_path, sinks, driver)
    run = only_run(data, uri=uri)  # the sink's own count is the lines really there
    assert run.closed is not None
    assert run.closed["emitted"] == run.closed["written"] == N
    assert [e["seq"] for e in run.events] == list(range(1, N + 1))
    tags = [type(ev).__struct_config__.tag for ev in _events()]
    assert [e["event"] for e in run.events] == tags


@pytest.mark.parametrize("driver", DRIVERS, ids=IDS)
def test_the_null_sink_is_handed_the_same_bytes_and_counts_them(driver: Driver) -> None:
    null, memory = driver.run(["null://", "memory://"], _scenario, batch_size=512).value
    assert isinstance(null, NullSink) and isinstance(memory, MemorySink)
    data = memory.getvalue()
    # Handed every batch the memory sink was, trace_closed included.
    assert null.bytes_written == len(data) > 0
    run = only_run(data, uri="memory://")
    (tally,) = [s for s in run.closed["sinks"] if s["uri"] == "null://"]  # type: ignore[index]
    assert tally == {"uri": "null://", "written": N, "error": None}
