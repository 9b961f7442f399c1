"""Tracers shipped to real Ray actors through their constructors (a local cluster).

How a Ray worker ends decides whether its runs close (Ray 2.60, read in
``ray/_private/worker.py``, ``ray/actor.py`` and the workers' own logs):

- ``ray.actor.exit_actor()``, ``actor.__ray_terminate__``, an actor handle
  going out of scope, and SIGTERM to the worker are graceful: Ray's own SIGTERM
  handler (``Worker.main_loop``, installed before any actor code runs and never
  replaced by ours) raises ``SystemExit``; the actor's ``__ray_shutdown__``
  runs, then the interpreter exits and runs ``atexit`` hooks, ours too. By
  then an async actor's event loop is stopped and its thread joined.
- ``ray.kill()`` and an owner that exits (the driver at ``ray.shutdown()``, or
  at its own exit) are force kills: the worker's C++ core ends the process
  at once ("Force kill actor request has received. exiting immediately"),
  with no Python code run, so no run can write ``trace_closed`` there. End
  actors gracefully before ``ray.shutdown()``.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tracecheck import check_runs, only_run

import rollout_trace as rt

ray = pytest.importorskip("ray")

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

N = 2_000


# The workers import the package these tests import (a checkout other than
# the installed one, too), and the tests' helpers.
_PYTHONPATH = os.pathsep.join(
    [str(Path(rt.__file__).resolve().parent.parent), str(Path(__file__).parent)]
)


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": _PYTHONPATH}},
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


# --- how an actor ends, and whether its run closes -------------------------------


def _emit(t: rt.Tracer | rt.SyncTracer, lane: int, n: int) -> None:
    for i in range(n):
        t.emit(
            rt.AttemptDispatched(
                group_id=f"lane{lane}",
                prompt_id=i,
                generation_index=lane,
                attempt=0,
                weight_version=0,
            )
        )


@ray.remote(max_concurrency=2)
class ThreadedController:
    """A threaded actor that opens its sync tracer in ``__init__`` (the worker's
    main thread) and emits from two calls at once."""

    def __init__(self, tracer: rt.SyncTracer) -> None:
        self.tracer = tracer.open()

    def work(self, lane: int, n: int) -> dict[str, Any]:
        _emit(self.tracer, lane, n)
        handler = signal.getsignal(signal.SIGTERM)
        return {
            "pid": os.getpid(),
            "run_id": self.tracer.run_id,
            "flushed": self.tracer.flush(timeout=30),
            "sigterm": f"{handler.__module__}.{handler.__qualname__}",  # type: ignore[union-attr]
        }

    def exit(self) -> None:
        ray.actor.exit_actor()


@ray.remote
class AsyncController:
    """An async actor that holds an async tracer open across calls, as a
    controller would: opened by one call, used by the next ones."""

    def __init__(self, tracer: rt.Tracer) -> None:
        self.tracer = tracer
        self._stack = contextlib.AsyncExitStack()

    async def start(self) -> None:
        await self._stack.enter_async_context(self.tracer)

    async def work(self, lane: int, n: int) -> dict[str, Any]:
        _emit(self.tracer, lane, n)
        return {
            "pid": os.getpid(),
            "run_id": self.tracer.run_id,
            "flushed": await self.tracer.flush(),
        }

    async def exit(self) -> None:
        ray.actor.exit_actor()


@ray.remote
class AsyncSyncController:
    """An async actor with a sync tracer opened in ``__init__`` (which runs on
    the actor's event loop thread, not the worker's main thread)."""

    def __init__(self, tracer: rt.SyncTracer) -> None:
        self.tracer = tracer.open()

    async def work(self, lane: int, n: int) -> dict[str, Any]:
        _emit(self.tracer, lane, n)
        return {"pid": os.getpid(), "run_id": self.tracer.run_id, "flushed": self.tracer.flush(30)}

    async def exit(self) -> None:
        ray.actor.exit_actor()


def _wait_gone(pid: int, timeout: float = 60.0) -> None:
    """Until the worker process has ended (Ray's raylet reaps it)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rpartition(")")[2].split()[0] == "Z":
                    return
        except FileNotFoundError:
            return
        except OSError:  # no /proc: ask the process
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
        time.sleep(0.05)
    raise AssertionError(f"worker {pid} did not end within {timeout:g} s")


def _start_controllers(uri: str, n: int) -> tuple[list[Any], list[dict[str, Any]]]:
    actors = [
        ThreadedController.remote(rt.sync_tracer(uri)),  # type: ignore[attr-defined]
        AsyncController.remote(rt.tracer(uri)),  # type: ignore[attr-defined]
        AsyncSyncController.remote(rt.sync_tracer(uri)),  # type: ignore[attr-defined]
    ]
    ray.get(actors[1].start.remote())
    lanes = [ray.get([a.work.remote(lane, n) for lane in (0, 1)]) for a in actors]
    infos = []
    for (first, second), name in zip(lanes, ("threaded", "async", "async-sync"), strict=True):
        assert first["pid"] == second["pid"] and first["run_id"] == second["run_id"]
        assert first["flushed"] and second["flushed"], name
        infos.append({**first, "name": name})
    return actors, infos


def _check_closed(tmp_path: Path, infos: list[dict[str, Any]], n: int) -> None:
    for info in infos:
        path = tmp_path / f"{info['run_id']}.jsonl"
        run = only_run(path.read_bytes())  # each seq once; trace_closed's counts == lines
        assert run.closed is not None, f"{info['name']}: no trace_closed"
        assert run.closed["written"] == 2 * n, info["name"]
        assert run.opened["pid"] == info["pid"]


@pytest.mark.usefixtures("cluster")
@pytest.mark.parametrize("how", ["exit_actor", "ray_terminate", "sigterm"])
def test_an_actor_that_ends_gracefully_closes_its_run(how: str, tmp_path: Path) -> None:
    n = 500
    actors, infos = _start_controllers(f"jsonl://{tmp_path}/{{run_id}}.jsonl", n)
    # Ray's own SIGTERM handler is in place in the worker, and stays.
    assert infos[0]["sigterm"] == "ray._private.worker.Worker.main_loop.<locals>.sigterm_handler"
    for actor, info in zip(actors, infos, strict=True):
        if how == "exit_actor":
            with pytest.raises(ray.exceptions.RayActorError):
                ray.get(actor.exit.remote(), timeout=60)
        elif how == "ray_terminate":
            actor.__ray_terminate__.remote()
        else:
            os.kill(info["pid"], signal.SIGTERM)  # what Kubernetes and SLURM send first
    for info in infos:
        _wait_gone(info["pid"])
    _check_closed(tmp_path, infos, n)


@pytest.mark.usefixtures("cluster")
def test_ray_kill_ends_an_actor_with_no_python_run(tmp_path: Path) -> None:
    # Documented as such ("atexit handlers installed in the actor will not be
    # run"): what was flushed is there, trace_closed cannot be.
    n = 200
    actor = ThreadedController.remote(rt.sync_tracer(f"jsonl://{tmp_path}/{{run_id}}.jsonl"))  # type: ignore[attr-defined]
    info = ray.get(actor.work.remote(0, n))
    assert info["flushed"]
    ray.kill(actor, no_restart=True)
    _wait_gone(info["pid"])
    run = only_run((tmp_path / f"{info['run_id']}.jsonl").read_bytes())
    assert run.closed is None and len(run.events) == n


_SHUTDOWN_DRIVER = """
import json, os, sys, time
import ray
import rollout_trace as rt
from test_ray import ThreadedController, AsyncController, _emit, _wait_gone

out = sys.argv[1]
ray.init(
    address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
    runtime_env={"env_vars": {"PYTHONPATH": os.environ["PYTHONPATH"]}},
)
uri = f"jsonl://{out}/{{run_id}}.jsonl"
ended = [ThreadedController.remote(rt.sync_tracer(uri)), AsyncController.remote(rt.tracer(uri))]
left = [ThreadedController.remote(rt.sync_tracer(uri)), AsyncController.remote(rt.tracer(uri))]
ray.get([ended[1].start.remote(), left[1].start.remote()])
infos = {}
for group, actors in (("ended", ended), ("left", left)):
    infos[group] = [ray.get(a.work.remote(0, 100)) for a in actors]
# The way to close them: end them gracefully, then shut down.
for actor in ended:
    actor.__ray_terminate__.remote()
for info in infos["ended"]:
    _wait_gone(info["pid"])
ray.shutdown()
for info in infos["left"]:
    _wait_gone(info["pid"])
print(json.dumps(infos))
"""


def test_ray_shutdown_force_kills_the_actors_so_end_them_before(tmp_path: Path) -> None:
    # A cluster of its own: ray.shutdown() ends it. The driver's exit makes
    # the GCS kill every actor it owns with force_kill, and the workers end
    # from C++ at once; now and then a worker's SIGTERM handler runs first and
    # its run closes. So an actor left to shutdown may or may not close its
    # run (the README says to end actors first); what it flushed is kept.
    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent(_SHUTDOWN_DRIVER))
    env = {**os.environ, "PYTHONPATH": _PYTHONPATH}
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        capture_output=True,
        env=env,
        timeout=240,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    infos = json.loads(proc.stdout.splitlines()[-1])
    for group in ("ended", "left"):
        for info in infos[group]:
            assert info["flushed"]
            runs = check_runs((tmp_path / f"{info['run_id']}.jsonl").read_bytes())
            run = runs[info["run_id"]]
            if group == "ended":
                assert run.closed is not None, (group, info)
            assert len(run.events) == 100
