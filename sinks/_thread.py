"""A sink's own daemon thread for its blocking calls."""

from __future__ import annotations

import concurrent.futures
import queue
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["SinkThread"]


class SinkThread(concurrent.futures.Executor):
    """Runs a sink's blocking calls one after another in one daemon thread.

    Not asyncio's default executor: a write stuck on a hung mount or a FIFO
    nobody reads would keep that executor's thread busy, and ``asyncio.run``
    and the interpreter wait for its threads at exit. A daemon thread of the
    sink's own is left behind instead. The thread starts on the first call.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(
        self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()
        self._calls.put((future, fn, args, kwargs))
        return future

    def _run(self) -> None:
        while True:
            call = self._calls.get()
            if call is None:
                return
            future, fn, args, kwargs = call
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:
                future.set_exception(exc)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Let the thread end after the calls already submitted.

        ``wait`` gives it a second to do so: enough for an idle thread, and no
        more for one stuck in a call, which is left behind (it is a daemon).
        """
        if self._thread is not None:
            self._calls.put(None)
            if wait:
                self._thread.join(1.0)
