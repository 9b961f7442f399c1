"""A trace set read in worker processes (``--jobs``) or Ray tasks (``--ray``).

A trace set is cut into pieces (``_reading.pieces``: files, and byte ranges
of large plain text files), grouped into tasks. Each task reads its pieces
into a model ``Builder`` of its own (``read_pieces``) and hands it back with
the bad lines of each piece; the caller merges the builders (gathering is
order-free: the model orders and compares only when it is built), and
counts the bad lines in piece order, each range's line numbers moved on by
the lines of the ranges before it in its file. So the figures, the notes
and the bad lines reported are those of a read in one process, whatever
the number of workers and whichever finishes first.

A worker that dies (killed, out of memory) breaks the pool: the command
stops with an error naming the pieces it was reading. Ctrl-C stops every
worker: they ignore SIGINT, and the parent ends the ones at work. A parent
that ends without a word (SIGKILL) takes its workers with it: each watches
a pipe only the parent holds open, and leaves when it closes.

Workers open the files by their paths, so a path another process cannot
open as this one does (a pipe, ``<(...)``, ``/dev/stdin``) is read in one
process. An object store URL is opened by the workers too, each through a
filesystem of its own (fsspec's are per process), with this process's
environment (the store's endpoint and credentials) as it is now. Where
worker processes cannot be started (no usable ``/dev/shm``), ``NoWorkers``
says why, and the caller reads in one process too.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import socket
import stat
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from importlib import import_module
from multiprocessing.connection import Connection
from typing import Any, NamedTuple

from .._errors import RolloutTraceError
from .._model.traceset import Builder, gc_paused
from .._reading.pieces import WHOLE, Piece, plan
from .._reading.reader import TextRange, iter_blocks
from .._reading.stores import is_url, known, remember
from .common import BadLines, progress_for

__all__ = [
    "WorkerDied",
    "NoWorkers",
    "RayMissing",
    "RayUnusable",
    "Read",
    "read_pieces",
    "read_in_processes",
    "read_in_ray",
]

# Where a piece is, in the array the workers share with the parent: the pid of
# the worker reading it; below 0, not at work.
_WAITING = 0
_DONE = -1
_STOPPED = -2  # its worker was ended by the pool or the parent
# A test hook: a worker that reads a piece of a file whose name ends so kills
# itself, as the kernel's OOM killer would.
_DIE_ON = "_ROLLOUT_TRACE_TEST_WORKER_DIES_ON"
# A test hook: a worker that reads a piece of a file whose name ends so stays
# at it until it is ended.
_HOLD_ON = "_ROLLOUT_TRACE_TEST_WORKER_HOLDS_ON"
# How long `--ray` tries to reach the address RAY_ADDRESS gives before ray.init.
_REACH_S = 5.0


class WorkerDied(RolloutTraceError):
    """A worker process or Ray task ended before it handed what it read back."""


class NoWorkers(RolloutTraceError):
    """Worker processes cannot be started here (no usable ``/dev/shm``, ...): read in one."""


class RayMissing(RolloutTraceError):
    """``--ray`` was given, and Ray is not installed."""


class RayUnusable(RolloutTraceError):
    """``--ray`` cannot run: a ``RAY_ADDRESS`` that is malformed or cannot be reached, a
    cluster that cannot be joined or started, a path the Ray workers cannot open."""


class Read(NamedTuple):
    """What a task read: its builder, and the bad lines and line count of each of its pieces."""

    builder: Builder
    problems: list[BadLines]
    lines: list[int]


# Set in each worker process by `_start_worker`.
_state: Any = None
_bytes: Any = None
_current = -1


def _start_worker(
    state: Any, done_bytes: Any, parent: Connection, environ: dict[str, str] | None
) -> None:
    global _state, _bytes
    _state, _bytes = state, done_bytes
    if environ is not None:
        # The parent's environment as the command began, not as the forkserver
        # found it when it started (an earlier command of the same program):
        # an object store's client reads its endpoint and credentials there.
        os.environ.clear()
        os.environ.update(environ)
    # Ctrl-C reaches the whole process group: the parent ends the workers at
    # work, and the others leave when the pool shuts down.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _stopped)
    threading.Thread(target=_watch, args=(parent,), name="parent-watch", daemon=True).start()


def _watch(parent: Connection) -> None:
    """End this worker when its parent is gone, however it ended (SIGKILL included).

    The parent holds the only write end of ``parent``'s pipe and never
    writes: the read returns when the parent closes it or its process ends.
    (A pid would do too, but a pid is reused; a pipe is not.)
    """
    with contextlib.suppress(EOFError, OSError):
        parent.recv_bytes()
    os._exit(1)


def _stopped(signum: int, _: Any) -> None:
    if _current >= 0:
        _state[_current] = _STOPPED
    os._exit(128 + signum)


def _count_bytes(n: int) -> None:
    with _bytes.get_lock():
        _bytes.value += n


def read_pieces(
    task: Sequence[tuple[int, Piece]],
    listed: dict[str, dict[str, Any]] | None = None,
) -> Read:
    """Read the pieces of one task (each with its place in the plan) into one builder.

    ``listed`` is what the caller's listing found of the task's objects
    (``stores.known``): they are opened with no request more.
    """
    global _current
    if listed:
        remember(listed)
    builder = Builder()
    out = Read(builder, [], [])
    on_bytes = None if _bytes is None else _count_bytes
    die_on = os.environ.get(_DIE_ON)
    hold_on = os.environ.get(_HOLD_ON)
    with gc_paused():
        for index, piece in task:
            if _state is not None:
                _current = index
                _state[index] = os.getpid()
            if die_on and piece.path.endswith(die_on):
                os.kill(os.getpid(), signal.SIGKILL)
            while hold_on and piece.path.endswith(hold_on):
                time.sleep(1)
            problems = BadLines()
            if piece.end == WHOLE:
                for path, events, _ in iter_blocks(
                    [piece.path], problems, on_bytes=on_bytes, listed=True
                ):
                    builder.add(events, source=path)
                lines = 0  # no piece of the file comes after it
            else:
                part = TextRange(piece.path, piece.start, piece.end, problems, on_bytes=on_bytes)
                for path, events, _ in part.blocks():
                    builder.add(events, source=path)
                lines = part.lines
            out.problems.append(problems)
            out.lines.append(lines)
            if _state is not None:
                _state[index] = _DONE
                _current = -1
    return out


class _Merge:
    """What the tasks read, merged in piece order as it comes, the bad lines too.

    In piece order, a file's lines stay in the order written, so a run read in
    ranges by several workers is in seq order again, as the model's fast path
    takes it (``runs.normalize``).
    """

    def __init__(self, pieces: list[Piece]) -> None:
        self.pieces = pieces
        self._builder = Builder()
        self._problems: list[BadLines | None] = [None] * len(pieces)
        self._lines = [0] * len(pieces)
        # Reads waiting for an earlier piece's, by their first piece.
        self._waiting: dict[int, tuple[Sequence[int], Builder]] = {}
        self._next = 0

    def add(self, task: Sequence[int], read: Read) -> None:
        for i, problems, lines in zip(task, read.problems, read.lines, strict=True):
            self._problems[i] = problems
            self._lines[i] = lines
        self._waiting[min(task)] = (task, read.builder)
        while self._next in self._waiting:
            done, builder = self._waiting.pop(self._next)
            self._builder.merge(builder)
            self._next = max(done) + 1

    @property
    def builder(self) -> Builder:
        """Everything read (a task of pieces that are not one range last, in order)."""
        for first in sorted(self._waiting):
            self._builder.merge(self._waiting.pop(first)[1])
        return self._builder

    def problems(self) -> BadLines:
        out = BadLines()
        before: dict[str, int] = {}  # lines of a file's ranges so far
        for piece, problems, lines in zip(self.pieces, self._problems, self._lines, strict=True):
            assert problems is not None
            offset = before.get(piece.path, 0)
            out.extend(problems, offset)
            before[piece.path] = offset + lines
        return out


def _context() -> multiprocessing.context.BaseContext:
    # Not fork: the command may run inside a program with threads (a Ray
    # driver, a logging or a tracer's writer thread), and a forked child
    # holds a copy of every lock those threads held at that moment, which no
    # thread of its own will ever release. forkserver forks each worker from
    # a server process that has run no other thread; spawn, where forkserver
    # is missing (Windows), starts a fresh interpreter.
    method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    return multiprocessing.get_context(method)


def shared(path: str) -> bool:
    """Whether another process opens the file ``path`` names by that path, as this one does.

    Not a pipe or a device, and not a path through ``/proc`` or ``/dev/fd``
    (``/dev/stdin``, ``<(...)``): another process opens its own ``/dev/stdin``.
    An object store URL is opened by any process alike.
    """
    if is_url(path):
        return True
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False
    except OSError:
        return False  # gone: read in this process, which says so as --jobs 1 does
    at = os.path.abspath(path)
    for _ in range(40):  # links followed, the kernel's own limit
        folder, name = os.path.split(at)
        folder = os.path.realpath(folder)
        if folder in ("/proc", "/dev/fd") or folder.startswith("/proc/"):
            return False
        at = os.path.join(folder, name)
        if not os.path.islink(at):
            return True
        at = os.path.join(folder, os.readlink(at))
    return False


def read_in_processes(files: Sequence[str], jobs: int) -> tuple[Builder, BadLines] | None:
    """``files`` read by ``jobs`` worker processes; None when it is for one process
    (one task holds it all, or a path only this process can open: see ``shared``).

    Raises ``WorkerDied`` when a worker dies, naming the pieces it was reading,
    and ``NoWorkers`` when they cannot be started.
    """
    if not all(shared(f) for f in files):
        return None
    pieces, tasks = plan(files, jobs)
    if len(tasks) < 2:
        return None  # a process of its own would only add its start-up
    merge = _Merge(pieces)
    # The workers' watch: the parent holds the only write end, and never writes.
    watch, alive = multiprocessing.Pipe(duplex=False)
    try:
        pool, futures, state, done_bytes = _start(pieces, tasks, min(jobs, len(tasks)), watch)
    except BaseException:
        alive.close()
        watch.close()
        raise
    progress = progress_for(files)
    try:
        pending = set(futures)
        while pending:
            finished, pending = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
            if progress is not None:
                progress.at(done_bytes.value)
            for future in finished:
                merge.add(futures[future], future.result())
    except BrokenProcessPool:
        pool.shutdown(wait=True, cancel_futures=True)
        lost = [str(pieces[i]) for i, at in enumerate(state) if at > 0]
        raise WorkerDied(_died(lost)) from None
    except BaseException:
        # Ctrl-C, or a piece that could not be read: end the workers at work.
        for at in state:
            if at > 0:
                _end(at)
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    else:
        pool.shutdown()
    finally:
        if progress is not None:
            progress.clear()
        alive.close()  # any worker still there leaves
        watch.close()
    return merge.builder, merge.problems()


_Started = tuple[ProcessPoolExecutor, dict[Future[Read], list[int]], Any, Any]


def _start(
    pieces: list[Piece], tasks: list[list[int]], workers: int, watch: Connection
) -> _Started:
    """The pool, its shared state, and every task handed to it; ``NoWorkers`` if it cannot be."""
    pool = None
    state: Any = None
    try:
        ctx = _context()
        # Shared memory: a file in /dev/shm, which may be missing or read-only.
        state = ctx.Array("q", len(pieces), lock=False)
        done_bytes: Any = ctx.Value("q", 0)
        environ = dict(os.environ) if any(is_url(p.path) for p in pieces) else None
        pool = ProcessPoolExecutor(
            max_workers=workers,
            mp_context=ctx,
            initializer=_start_worker,
            initargs=(state, done_bytes, watch, environ),
        )
        # Workers are started here (the tasks come largest first).
        futures = {
            pool.submit(read_pieces, [(i, pieces[i]) for i in t], _listed(pieces, t)): t
            for t in tasks
        }
    except (OSError, ImportError) as exc:  # ImportError: a platform without sem_open
        if pool is not None:
            for at in state:
                if at > 0:
                    _end(at)
            pool.shutdown(wait=False, cancel_futures=True)
        raise NoWorkers(f"cannot start worker processes ({exc})") from None
    return pool, futures, state, done_bytes


def _listed(pieces: Sequence[Piece], task: Sequence[int]) -> dict[str, dict[str, Any]]:
    """What the listing found of the objects of ``task``'s pieces, for its worker."""
    return known(pieces[i].path for i in task)


def _end(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # it ended on its own
        os.kill(pid, signal.SIGTERM)


def _died(pieces: Sequence[str]) -> str:
    where = " or ".join(pieces) if pieces else "a piece of the trace set"
    return (
        f"a worker process ended before it was done (killed, or out of memory?) while "
        f"reading {where}; --jobs 1 reads in this process"
    )


def read_in_ray(files: Sequence[str]) -> tuple[Builder, BadLines]:
    """``files`` read as Ray tasks: on the cluster ``RAY_ADDRESS`` names, else
    a local one. The workers open the files by the same paths."""
    ray = _import_ray()
    for path in files:
        if not shared(path):
            raise RayUnusable(
                f"--ray: Ray workers cannot open {path!r} by its path (a pipe, /dev/stdin or "
                "<(...)?): give a file, or read without --ray"
            )
    started = not ray.is_initialized()
    if started:
        _init_ray(ray)
    try:
        cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        pieces, tasks = plan(files, cpus)
        merge = _Merge(pieces)
        remote: Callable[..., Any] = ray.remote(max_retries=0)(read_pieces).remote
        refs = {
            remote([(i, pieces[i]) for i in task], _listed(pieces, task)): task for task in tasks
        }
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            task = refs[ready[0]]
            try:
                read = ray.get(ready[0])
            except ray.exceptions.RayTaskError as exc:
                # A piece that could not be read: the error it met, as --jobs gives it.
                cause = getattr(exc, "cause", None)
                if isinstance(cause, (RolloutTraceError, OSError)):
                    raise cause from None
                raise
            except ray.exceptions.RayError as exc:
                lost = [str(pieces[i]) for i in task]
                raise WorkerDied(f"{_died(lost)} ({type(exc).__name__})") from None
            merge.add(task, read)
        return merge.builder, merge.problems()
    finally:
        if started:
            ray.shutdown()


def _init_ray(ray: Any) -> None:
    """``ray.init`` on the cluster ``RAY_ADDRESS`` names, else a local one; ``RayUnusable``
    in one line if the address is malformed, cannot be reached, or Ray refuses it."""
    address = os.environ.get("RAY_ADDRESS", "")
    options: dict[str, Any] = {"logging_level": "ERROR", "log_to_driver": False}
    if address:
        _reach(address)
    else:
        options["include_dashboard"] = False
    try:
        ray.init(**options)
    except (ValueError, ConnectionError, RuntimeError) as exc:
        said = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        where = f"the Ray cluster at RAY_ADDRESS={address!r}" if address else "a local Ray cluster"
        raise RayUnusable(f"--ray: cannot connect to {where}: {said}") from None


def _reach(address: str) -> None:
    """Check that the cluster ``address`` (RAY_ADDRESS) names answers on its port.

    ``ray.init`` tries an address that does not answer for many minutes, deaf
    to Ctrl-C and SIGTERM; Ray offers no time limit for it.
    """
    if address in ("auto", "local"):
        return  # the local cluster `ray start` recorded, or a new one
    scheme, _, rest = address.rpartition("://")
    if scheme and scheme != "ray":
        return  # a Ray Client plugin's scheme: Ray says what it makes of it
    host, _, port = rest.rpartition(":")
    host = host.strip("[]")  # an IPv6 address: [::1]:6379
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        if scheme:
            return  # ray://host, the client's default port: Ray says what it makes of it
        raise RayUnusable(
            f"--ray: RAY_ADDRESS={address!r} is not a Ray cluster address: give host:port (the "
            "head node's GCS, as `ray start --head` prints it), ray://host:port (Ray Client), "
            "auto or local, or unset it to start a local cluster"
        )
    try:
        with socket.create_connection((host, int(port)), timeout=_REACH_S):
            pass
    except OSError as exc:
        said = f"no answer within {_REACH_S:g} s" if isinstance(exc, TimeoutError) else exc
        raise RayUnusable(
            f"--ray: cannot reach the Ray cluster at RAY_ADDRESS={address!r}: {said}"
        ) from None


def _import_ray() -> Any:
    try:
        return import_module("ray")
    except ImportError:
        raise RayMissing(
            "--ray reads the trace set as Ray tasks, but Ray is not installed; "
            "install it with: pip install 'rollout-trace[ray]'"
        ) from None
