"""Every trick that leans on CPython's or a dependency's internals, in one place.

Each one says what it assumes and what it saves; ``tests/test_internals.py``
fails when an assumption stops holding, so a new Python or anyio release
shows up there first rather than as a silent miscount.
"""

from __future__ import annotations

import itertools

import anyio

__all__ = [
    "peek_count",
    "first_caller",
    "is_cancellation",
]


def peek_count(counter: itertools.count[int]) -> int:
    """The next value of an ``itertools.count``, without taking it.

    Assumes ``repr(count(N))`` is ``"count(N)"`` (true since Python 2.7). The
    emit path takes ``seq`` with ``next()`` on a count, which is atomic under
    the GIL and costs about 30 ns; a lock would cost about 370 ns per emit,
    and reading the count back is needed only for ``counts`` and at close.
    """
    return int(repr(counter)[6:-1])


def first_caller(counter: itertools.count[int]) -> bool:
    """Whether this call is the first on ``counter``, from any number of threads.

    ``next()`` on a count is one C call, atomic under the GIL: exactly one
    thread sees 0. Every sink's thread acknowledges each batch, and the first
    one counts it as written; a lock there would cost about 370 ns per call.
    A free-threaded build would need a lock here.
    """
    return next(counter) == 0


def is_cancellation(exc: BaseException) -> bool:
    """Whether ``exc`` is the running backend's cancellation exception."""
    return isinstance(exc, anyio.get_cancelled_exc_class())
