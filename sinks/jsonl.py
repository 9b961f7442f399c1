"""``jsonl://``: append JSON lines to a file, gzip-compressed for ``.jsonl.gz``."""

from __future__ import annotations

import os
import zlib
from collections.abc import Mapping
from typing import Any

import aiofiles
import aiofiles.os

from ._base import Sink, SinkOptionValueError
from ._thread import SinkThread

__all__ = ["JsonlSink"]

_FSYNC_MODES = ("never", "batch", "always")


class JsonlSink(Sink):
    """Appends each batch to a file with one write; makes parent folders.

    The file is opened unbuffered, so nothing is held in a Python buffer that
    a forked child could write a second time. ``.jsonl.gz`` files get one
    gzip member per open, flushed to a byte boundary after every batch, so a
    killed writer leaves a readable prefix.

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
        self._file: Any = None
        self._gzip: Any = None
        self._made_dirs: list[str] = []
        self._made_file = False
        self._thread = SinkThread(f"rollout_trace {self.path}")
        self._compress = aiofiles.os.wrap(self._compress_sync)
        self._sync = aiofiles.os.wrap(os.fsync if self.fsync == "always" else os.fdatasync)

    async def open(self) -> None:
        parent = os.path.dirname(self.path)
        # What this open makes, so that discard() can take it back. Even a
        # stat may block on a network file system: off the event loop.
        run = self._thread
        self._made_dirs, self._made_file = await aiofiles.os.wrap(_plan)(self.path, executor=run)
        try:
            await aiofiles.os.makedirs(parent, exist_ok=True, executor=run)
            self._file = await aiofiles.open(self.path, "ab", buffering=0, executor=run)
            if self.fsync == "always":
                await aiofiles.os.wrap(_fsync_dir)(parent, executor=run)
        except BaseException:
            await self.discard()
            raise
        if self.path.endswith(".gz"):
            self._gzip = zlib.compressobj(wbits=31)  # 31: a gzip header and trailer

    async def discard(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            await file.close()
        await aiofiles.os.wrap(_undo)(
            self.path, self._made_file, self._made_dirs, executor=self._thread
        )
        self._thread.shutdown(wait=True)  # an open that failed leaves no thread behind

    def _compress_sync(self, data: bytes) -> bytes:
        return self._gzip.compress(data) + self._gzip.flush(zlib.Z_SYNC_FLUSH)  # type: ignore[no-any-return]

    async def write(self, data: bytes) -> None:
        if self._gzip is not None:
            # Compression runs in the worker thread too: zlib frees the GIL
            # and a large batch would otherwise stall the event loop.
            data = await self._compress(data, executor=self._thread)
        await _write_all(self._file, data)
        if self.fsync != "never":
            await self._sync(self._file.fileno(), executor=self._thread)

    async def flush(self) -> None:
        if self.fsync == "always":
            await self._sync(self._file.fileno(), executor=self._thread)

    async def aclose(self) -> None:
        file, self._file = self._file, None
        if file is None:
            return
        try:
            if self._gzip is not None:
                await _write_all(file, self._gzip.flush(zlib.Z_FINISH))
        finally:
            await file.close()
            self._thread.shutdown(wait=False)


async def _write_all(file: Any, data: bytes) -> None:
    # An unbuffered write may be short (a signal, a full disk): finish the
    # batch so that no line is torn on purpose.
    view = memoryview(data)
    while view:
        view = view[await file.write(view) :]


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
