"""The cost analysis's first read in worker processes (``--jobs``) or Ray tasks (``--ray``).

A trace set is cut into pieces (``_reading.pieces``: files, and byte ranges
of large plain text files), grouped into tasks. Each task folds its pieces
into a ``CostAnalysis`` of its own (``fold_pieces``) and hands it back with
the bad lines of each piece; the caller merges the folds, which are
order-free (``CostAnalysis.merge``), and counts the bad lines in piece
order, each range's line numbers moved on by the lines of the ranges before
it in its file. So the figures, the notes and the bad lines reported are
those of a read in one process, whatever the number of workers and
whichever finishes first.

A worker that dies (killed, out of memory) breaks the pool: the command
stops with an error naming the pieces it was reading. Ctrl-C stops every
worker: they ignore SIGINT, and the parent ends the ones at work.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from importlib import import_module
from typing import Any, NamedTuple

from .._analysis.cost import CostAnalysis, gc_paused
from .._errors import RolloutTraceError
from .._reading.pieces import WHOLE, Piece, plan
from .._reading.reader import TextRange, iter_blocks
from .common import BadLines, progress_for

__all__ = ["WorkerDied", "RayMissing", "Folded", "fold_pieces", "fold_in_processes", "fold_in_ray"]

# Where a piece is, in the array the workers share with the parent: the pid of
# the worker reading it; below 0, not at work.
_WAITING = 0
_DONE = -1
_STOPPED = -2  # its worker was ended by the pool or the parent
# A test hook: a worker that reads a piece of a file whose name ends so kills
# itself, as the kernel's OOM killer would.
_DIE_ON = "_ROLLOUT_TRACE_TEST_WORKER_DIES_ON"


class WorkerDied(RolloutTraceError):
    """A worker process or Ray task ended before it handed its fold back."""


class RayMissing(RolloutTraceError):
    """``--ray`` was given, and Ray is not installed."""


class Folded(NamedTuple):
    """What a task read: its fold, and the bad lines and line count of each of its pieces."""

    analysis: CostAnalysis
    problems: list[BadLines]
    lines: list[int]


# Set in each worker process by `_start_worker`.
_state: Any = None
_bytes: Any = None
_current = -1


def _start_worker(state: Any, done_bytes: Any) -> None:
    global _state, _bytes
    _state, _bytes = state, done_bytes
    # Ctrl-C reaches the whole process group: the parent ends the workers at
    # work, and the others leave when the pool shuts down.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _stopped)


def _stopped(signum: int, _: Any) -> None:
    if _current >= 0:
        _state[_current] = _STOPPED
    os._exit(128 + signum)


def _count_bytes(n: int) -> None:
    with _bytes.get_lock():
        _bytes.value += n


def fold_pieces(task: Sequence[tuple[int, Piece]]) -> Folded:
    """Fold the pieces of one task (each with its place in the plan) into one analysis."""
    global _current
    analysis = CostAnalysis(copies_later=True)
    out = Folded(analysis, [], [])
    on_bytes = None if _bytes is None else _count_bytes
    die_on = os.environ.get(_DIE_ON)
    with gc_paused():
        for index, piece in task:
            if _state is not None:
                _current = index
                _state[index] = os.getpid()
            if die_on and piece.path.endswith(die_on):
                os.kill(os.getpid(), signal.SIGKILL)
            problems = BadLines()
            if piece.end == WHOLE:
                for path, events, _ in iter_blocks(
                    [piece.path], problems, on_bytes=on_bytes, lean=True
                ):
                    analysis.add(events, source=path)
                lines = 0  # no piece of the file comes after it
            else:
                part = TextRange(
                    piece.path, piece.start, piece.end, problems, on_bytes=on_bytes, lean=True
                )
                for path, events, _ in part.blocks():
                    analysis.add(events, source=path)
                lines = part.lines
            out.problems.append(problems)
            out.lines.append(lines)
            if _state is not None:
                _state[index] = _DONE
                _current = -1
    return out


class _Merge:
    """The folds of the tasks, merged as they come; the bad lines put in piece order."""

    def __init__(self, pieces: list[Piece]) -> None:
        self.pieces = pieces
        self.analysis = CostAnalysis(copies_later=True)
        self._problems: list[BadLines | None] = [None] * len(pieces)
        self._lines = [0] * len(pieces)

    def add(self, task: Sequence[int], folded: Folded) -> None:
        self.analysis.merge(folded.analysis)
        for i, problems, lines in zip(task, folded.problems, folded.lines, strict=True):
            self._problems[i] = problems
            self._lines[i] = lines

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


def fold_in_processes(files: Sequence[str], jobs: int) -> tuple[CostAnalysis, BadLines] | None:
    """The first read of ``files`` by ``jobs`` worker processes; None when one task holds it all.

    Raises ``WorkerDied`` when a worker dies, naming the pieces it was reading.
    """
    pieces, tasks = plan(files, jobs)
    if len(tasks) < 2:
        return None  # a process of its own would only add its start-up
    ctx = _context()
    state: Any = ctx.Array("q", len(pieces), lock=False)
    done_bytes: Any = ctx.Value("q", 0)
    merge = _Merge(pieces)
    progress = progress_for(files)
    pool = ProcessPoolExecutor(
        max_workers=min(jobs, len(tasks)),
        mp_context=ctx,
        initializer=_start_worker,
        initargs=(state, done_bytes),
    )
    try:
        # The largest first, so that the last ones to finish are small.
        order = sorted(tasks, key=lambda t: -sum(_weight(pieces[i]) for i in t))
        futures: dict[Future[Folded], list[int]] = {
            pool.submit(fold_pieces, [(i, pieces[i]) for i in task]): task for task in order
        }
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
    finally:
        if progress is not None:
            progress.clear()
    pool.shutdown()
    return merge.analysis, merge.problems()


def _weight(piece: Piece) -> int:
    return os.path.getsize(piece.path) if piece.end == WHOLE else piece.end - piece.start


def _end(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # it ended on its own
        os.kill(pid, signal.SIGTERM)


def _died(pieces: Sequence[str]) -> str:
    where = " or ".join(pieces) if pieces else "a piece of the trace set"
    return (
        f"a worker process ended before it was done (killed, or out of memory?) while "
        f"reading {where}; --jobs 1 reads in this process"
    )


def fold_in_ray(files: Sequence[str]) -> tuple[CostAnalysis, BadLines]:
    """The first read of ``files`` as Ray tasks: on the cluster ``RAY_ADDRESS`` names, else
    a local one. The workers open the files by the same paths."""
    ray = _import_ray()
    started = not ray.is_initialized()
    if started:
        options: dict[str, Any] = {"logging_level": "ERROR", "log_to_driver": False}
        if not os.environ.get("RAY_ADDRESS"):
            options["include_dashboard"] = False
        ray.init(**options)
    try:
        cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        pieces, tasks = plan(files, cpus)
        merge = _Merge(pieces)
        remote: Callable[..., Any] = ray.remote(max_retries=0)(fold_pieces).remote
        refs = {remote([(i, pieces[i]) for i in task]): task for task in tasks}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            task = refs[ready[0]]
            try:
                folded = ray.get(ready[0])
            except ray.exceptions.RayTaskError as exc:
                # A piece that could not be read: the error it met, as --jobs gives it.
                cause = getattr(exc, "cause", None)
                if isinstance(cause, (RolloutTraceError, OSError)):
                    raise cause from None
                raise
            except ray.exceptions.RayError as exc:
                lost = [str(pieces[i]) for i in task]
                raise WorkerDied(f"{_died(lost)} ({type(exc).__name__})") from None
            merge.add(task, folded)
        return merge.analysis, merge.problems()
    finally:
        if started:
            ray.shutdown()


def _import_ray() -> Any:
    try:
        return import_module("ray")
    except ImportError:
        raise RayMissing(
            "--ray reads the trace set as Ray tasks, but Ray is not installed; "
            "install it with: pip install 'rollout-trace[ray]'"
        ) from None
