"""Tracers shipped to real Ray actors through their constructors (a local cluster)."""

from __future__ import annotations

import collections
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import rollout_trace as rt

ray = pytest.importorskip("ray")

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

N = 2_000


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    tests_dir = str(Path(__file__).parent)
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": tests_dir}},
    )
    try:
        yield
    finally:
        ray.shutdown()


@ray.remote(max_concurrency=2)
class ThreadedWorker:
    """A threaded actor: two calls run at once in two threads, one sync tracer."""

    def __init__(self, tracer: rt.SyncTracer, off: rt.SyncTracer) -> None:
        self.tracer = tracer
        self.off = off  # the disabled default a controller class would carry

    def work(self, lane: int) -> int:
        for i in range(N):
            self.tracer.emit(
                rt.AttemptDispatched(
                    group_id=f"lane{lane}",
                    prompt_id=i,
                    generation_index=lane,
                    attempt=0,
                    weight_version=0,
                )
            )
            self.off.emit(rt.WeightsSynced(weight_version=i))
        return threading.get_ident()

    def close(self) -> str | None:
        self.tracer.close()
        return self.tracer.run_id


@ray.remote
class AsyncWorker:
    """An async actor: its tracer is opened in the actor's event loop."""

    def __init__(self, tracer: rt.Tracer) -> None:
        self.tracer = tracer

    async def work(self) -> str | None:
        async with self.tracer as t:
            for i in range(N):
                t.emit(rt.StepTrained(step=i, group_ids=[f"g{i}"]))
            await t.flush()
        return t.run_id


def _read(paths: list[Path]) -> dict[str, list[dict[str, Any]]]:
    runs: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for path in paths:
        for line in path.read_bytes().splitlines():
            obj = json.loads(line)
            runs[obj["run_id"]].append(obj)
    return runs


@pytest.mark.usefixtures("cluster")
def test_tracers_travel_to_actors_and_every_event_arrives_once(tmp_path: Path) -> None:
    uri = f"jsonl://{tmp_path}/{{pid}}-{{run_id}}.jsonl"
    threaded = [
        ThreadedWorker.remote(rt.sync_tracer(uri), rt.sync_tracer(enabled=False))  # type: ignore[attr-defined]
        for _ in range(2)
    ]
    idents = ray.get([w.work.remote(lane) for w in threaded for lane in (0, 1)])
    assert len(set(idents)) >= 2  # the calls really ran in threads
    threaded_runs = ray.get([w.close.remote() for w in threaded])
    async_worker = AsyncWorker.remote(rt.tracer(uri))  # type: ignore[attr-defined]
    async_run = ray.get(async_worker.work.remote())

    runs = _read(sorted(tmp_path.glob("*.jsonl")))
    assert set(runs) == {*threaded_runs, async_run}
    for run_id, objs in runs.items():
        names = [o["event"] for o in objs]
        assert names[0] == "trace_opened" and names[-1] == "trace_closed", run_id
        seqs = sorted(o["seq"] for o in objs)
        assert seqs == list(range(len(objs))), run_id  # every event exactly once
        closed = objs[-1]
        assert closed["dropped"] == 0 and closed["written"] == len(objs) - 2
    for run_id in threaded_runs:
        keys = collections.Counter(
            (o["generation_index"], o["prompt_id"])
            for o in runs[run_id]
            if o["event"] == "attempt_dispatched"
        )
        assert len(keys) == 2 * N and max(keys.values()) == 1
    assert len(runs[async_run]) == N + 2
    pids = {o["pid"] for objs in runs.values() for o in objs if o["event"] == "trace_opened"}
    assert len(pids) == 3  # one process per actor, each its own file


@pytest.mark.usefixtures("cluster")
def test_the_environment_switches_tracing_on_for_an_actor(tmp_path: Path) -> None:
    @ray.remote
    class EnvWorker:
        def __init__(self) -> None:
            self.tracer = rt.sync_tracer()  # no URI: $ROLLOUT_TRACE decides

        def work(self) -> bool:
            self.tracer.emit(rt.WeightsSynced(weight_version=1))
            self.tracer.close()
            return self.tracer.enabled

    target = tmp_path / "env.jsonl"
    worker = EnvWorker.options(  # type: ignore[attr-defined]
        runtime_env={"env_vars": {"ROLLOUT_TRACE": str(target)}}
    ).remote()
    assert ray.get(worker.work.remote()) is True
    names = [json.loads(line)["event"] for line in target.read_bytes().splitlines()]
    assert names == ["trace_opened", "weights_synced", "trace_closed"]
