"""``jsonl://``: append JSON lines to a file, gzip-compressed for ``.jsonl.gz``."""

from __future__ import annotations

import logging
import os
import time
import zlib
from collections.abc import Mapping
from typing import Any

from ._base import Sink, SinkOptionValueError

__all__ = ["JsonlSink"]

_FSYNC_MODES = ("never", "batch", "always")
# How long a sink that writes batch after batch goes without looking at its
# path for a file deleted or moved away. A look is a system call, and on the
# writing thread every system call lets the program take the GIL, which the
# thread then waits for (a switch interval, 5 ms, while the program is busy).
_LOOK_EVERY = 0.25
logger = logging.getLogger("rollout_trace")


class JsonlSink(Sink):
    """Appends each batch to a file with one write; makes parent folders.

    The file is opened unbuffered, so nothing is held in a Python buffer that
    a forked child could write a second time. ``.jsonl.gz`` files get one
    gzip member per open, and every batch ends with a full flush: it is on a
    byte boundary, so a killed writer leaves a readable prefix, and it refers
    to nothing before it, so a reader can inflate any batch alone when
    writers shared the file (a fork) or what came before it is lost.

    A file that is deleted, or moved away (log rotation), while the sink
    writes is noticed before the first batch written after a ``flush()`` or
    a quarter of a second after the sink last looked (so within a quarter of
    a second while batches follow each other): the sink reopens its path,
    makes a new file there and says so once per reopen, rather than writing
    into a file nobody can find.

    ``fsync``: ``never`` (default) leaves durability to the OS; ``batch``
    calls ``fdatasync`` after every batch; ``always`` calls ``fsync`` after
    every batch and on ``flush()``, and syncs the folder when the file is made.
    """

    options = frozenset({"fsync"})

    def __init__(self, location: str, options: Mapping[str, str]) -> None:
        super().__init__(location, options)
        if not location:
            raise SinkOptionValueError("a jsonl sink needs a file path, e.g. jsonl:///runs/x.jsonl")
        self.fsync = options.get("fsync", "never")
        if self.fsync not in _FSYNC_MODES:
            raise SinkOptionValueError(
                f"fsync={self.fsync!r} is not one of {', '.join(_FSYNC_MODES)}"
            )
        self.path = os.path.abspath(location)
        self.reopened = 0
        self._fd = -1
        self._identity: tuple[int, int] = (0, 0)
        self._look_at = 0.0  # time.monotonic() from which a write looks at the path
        self._gzip: Any = None
        self._made_dirs: list[str] = []
        self._made_file = False

    def open(self) -> None:
        # What this open makes, so that discard() can take it back.
        self._made_dirs, self._made_file = _plan(self.path)
        try:
            self._open_file()
        except BaseException:
            self.discard()
            raise

    def _open_file(self) -> None:
        parent = os.path.dirname(self.path)
        os.makedirs(parent, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
        self._fd = fd
        st = os.fstat(fd)
        self._identity = (st.st_dev, st.st_ino)
        if self.fsync == "always":
            _fsync_dir(parent)
        if self.path.endswith(".gz"):
            self._gzip = zlib.compressobj(wbits=31)  # 31: a gzip header and trailer

    def _still_there(self) -> bool:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        return (st.st_dev, st.st_ino) == self._identity

    def _reopen(self) -> None:
        self._close_file()
        self._open_file()
        self.reopened += 1
        logger.warning(
            "rollout_trace: %s was deleted or moved away while being written; "
            "writing on in a new file at that path",
            self.path,
        )

    def write(self, data: bytes) -> None:
        now = time.monotonic()  # no system call (vDSO)
        if now >= self._look_at:
            self._look_at = now + _LOOK_EVERY
            if not self._still_there():
                self._reopen()
        if self._gzip is not None:
            data = self._gzip.compress(data) + self._gzip.flush(zlib.Z_FULL_FLUSH)
        _write_all(self._fd, data)
        if self.fsync == "batch":
            os.fdatasync(self._fd)
        elif self.fsync == "always":
            os.fsync(self._fd)

    def flush(self) -> None:
        self._look_at = 0.0  # the next write looks at the path
        if self.fsync == "always" and self._fd >= 0:
            os.fsync(self._fd)

    def _close_file(self) -> None:
        fd, self._fd = self._fd, -1
        if fd < 0:
            return
        try:
            if self._gzip is not None:
                _write_all(fd, self._gzip.flush(zlib.Z_FINISH))
                self._gzip = None
        finally:
            os.close(fd)

    def close(self) -> None:
        self._close_file()

    def discard(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)
        _undo(self.path, self._made_file, self._made_dirs)


def _write_all(fd: int, data: bytes) -> None:
    # A write may be short (a signal, a full disk): finish the batch so that
    # no line is torn on purpose.
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _plan(path: str) -> tuple[list[str], bool]:
    """The folders above ``path`` that do not exist yet (deepest first), and
    whether the file itself is new."""
    missing = []
    folder = os.path.dirname(path)
    while folder and not os.path.exists(folder):
        missing.append(folder)
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    return missing, not os.path.exists(path)


def _undo(path: str, made_file: bool, made_dirs: list[str]) -> None:
    """Remove the empty file and folders an open made."""
    if made_file and os.path.exists(path) and os.path.getsize(path) == 0:
        os.unlink(path)
    for folder in made_dirs:  # deepest first
        try:
            os.rmdir(folder)
        except OSError:
            break


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
