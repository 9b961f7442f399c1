"""``jsonl://``: append JSON lines to a file, gzip-compressed for ``.jsonl.gz``."""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import time
import zlib
from collections.abc import Mapping

from ._base import Sink, SinkOptionError

__all__ = ["JsonlSink", "segment_path"]

_FSYNC_MODES = ("never", "batch", "always")
# How long a sink that writes batch after batch goes without looking at its
# path for a file deleted or moved away. A look is a system call, and on the
# writing thread every system call lets the program take the GIL, which the
# thread then waits for (a switch interval, 5 ms, while the program is busy).
# Real time, not ``deadline_clock``: it rate-limits stat() calls (a cost per
# real second); nothing waits on it.
_LOOK_EVERY = 0.25
# More than JSON lines compress to (some 10 to 20 times): the text a gzip
# segment's room is first tried with.
_GZIP_RATIO = 32
logger = logging.getLogger("rollout_trace")


class JsonlSink(Sink):
    """Appends each batch to a file with one write; makes parent folders.

    The file is opened unbuffered, so nothing is held in a Python buffer that
    a forked child could write a second time. In a ``.jsonl.gz`` file each
    write is one whole gzip member (header, deflate data, trailer), so
    writers appending to one path (a forked child, a restored run) never
    interleave inside a member, any gzip reader takes the file, and a member
    cut short by a kill loses only its own lines.

    A file that is deleted, or moved away (log rotation), while the sink
    writes is noticed before the first batch written after a ``flush()`` or
    a quarter of a second after the sink last looked (so within a quarter of
    a second while batches follow each other): the sink reopens its path,
    makes a new file there and says so once per reopen, rather than writing
    into a file nobody can find.

    ``fsync``: ``never`` (default) leaves durability to the OS; ``batch``
    calls ``fdatasync`` after every batch; ``always`` calls ``fsync`` after
    every batch and on ``flush()``, and syncs the folder when the file is made.

    ``rotate_mb`` and/or ``rotate_s`` write the run in segments: the path (it
    must end in ``.jsonl`` or ``.jsonl.gz``) with a six-digit number before
    that suffix (``trace-X.000001.jsonl``, ``trace-X.000002.jsonl``, ...;
    numbered on from the highest segment already there). A segment holds at
    most ``rotate_mb`` megabytes (10**6 bytes as written; a write is split at
    whole lines, a line longer than that takes a segment of its own) and is
    ended as soon as it is full; one ``rotate_s`` seconds old (on
    ``deadline_clock``) is ended before the next batch or at the next
    ``flush()``. A write split over two segments is a member in each. An
    ended segment is a whole file, and a reader takes a run's segments as one
    run, in any order.
    """

    options = frozenset({"fsync", "rotate_mb", "rotate_s"})

    def __init__(self, location: str, options: Mapping[str, str]) -> None:
        super().__init__(location, options)
        if not location:
            raise SinkOptionError("a jsonl sink needs a file path, e.g. jsonl:///runs/x.jsonl")
        self.fsync = options.get("fsync", "never")
        if self.fsync not in _FSYNC_MODES:
            raise SinkOptionError(f"fsync={self.fsync!r} is not one of {', '.join(_FSYNC_MODES)}")
        self.base = os.path.abspath(location)
        self.path = self.base
        self._rotate_bytes = _positive(options, "rotate_mb", "megabytes", 10**6)
        self._rotate_s = _positive(options, "rotate_s", "seconds", 1)
        if self.rotating and not self.base.endswith((".jsonl", ".jsonl.gz")):
            raise SinkOptionError(
                f"rotation needs a path ending in .jsonl or .jsonl.gz (its segments are "
                f"numbered before that suffix), not {location!r}"
            )
        self.segment = -1  # the current segment's number; -1: not rotating
        self._segment_bytes = 0
        self._segment_until = math.inf  # deadline_clock() when the segment is due to end (rotate_s)
        self.reopened = 0
        # The write under way (None: none is): file descriptor -> bytes put
        # there, and the files it ended, closed once it is done.
        self._batch: dict[int, int] | None = None
        self._ended: list[tuple[int, str]] = []
        self._fd = -1
        self._identity: tuple[int, int] = (0, 0)
        self._look_at = 0.0  # time.monotonic() from which a write looks at the path
        self._gzip = self.base.endswith(".gz")
        self._made_dirs: list[str] = []
        self._made_file = False

    @property
    def rotating(self) -> bool:
        """Whether the run is written in segments (``rotate_mb`` or ``rotate_s``)."""
        return self._rotate_bytes is not None or self._rotate_s is not None

    def open(self) -> None:
        if self.rotating:
            self.segment = _next_segment(self.base)
            self.path = segment_path(self.base, self.segment)
        # What this open makes, so that discard() can take it back.
        self._made_dirs, self._made_file = _plan(self.path)
        try:
            self._open_file()
        except BaseException:
            self.discard()
            raise

    def _open_file(self) -> None:
        parent = os.path.dirname(self.path)
        try:
            os.makedirs(parent, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            # makedirs says "File exists" of a file in the way, or names a
            # folder it could not make under it: name the file itself.
            blocker = _file_above(parent)
            if blocker is None:
                raise
            raise NotADirectoryError(
                errno.ENOTDIR,
                f"Not a directory: {blocker!r} is a file, so {self.path!r} cannot be made under it",
            ) from None
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
        self._fd = fd
        st = os.fstat(fd)
        self._identity = (st.st_dev, st.st_ino)
        if self.fsync == "always":
            _fsync_dir(parent)
        self._segment_bytes = 0
        if self._rotate_s is not None:
            self._segment_until = self.deadline_clock() + self._rotate_s

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

    def _next(self) -> None:
        """Begin the next segment (the current one is ended already)."""
        self.segment += 1
        self.path = segment_path(self.base, self.segment)
        self._open_file()

    def write(self, data: bytes) -> None:
        # All or nothing: a write that fails part way (a full disk) takes back
        # what it put in its files, so that no line of a batch counted as lost
        # is there (nor a torn one).
        self._batch = {}
        try:
            self._write_batch(data)
        except BaseException:
            self._take_back()
            raise
        finally:
            self._batch = None
            ended, self._ended = self._ended, []
            for fd, _ in ended:
                os.close(fd)

    def _take_back(self) -> None:
        """Cut each file this write put bytes in back to where they began.

        Through the write's own descriptors, so a file moved away or replaced
        at its path is still the one cut; and only where the file still ends
        with this write's bytes (another writer that appended since keeps its
        lines, and this write's stay, with a warning). A file left empty that
        this sink made is removed. A gzip file is cut back to the end of a
        whole member: no state carries over from one write to the next.
        """
        paths = {fd: path for fd, path in self._ended}
        if self._fd >= 0:
            paths[self._fd] = self.path
        for fd, n in (self._batch or {}).items():
            try:
                end = os.lseek(fd, 0, os.SEEK_CUR)  # O_APPEND: after this write's last bytes
                st = os.fstat(fd)
                if st.st_size != end:
                    logger.warning(
                        "rollout_trace: %s was written by another writer after a failed write; "
                        "its partial batch is left in place",
                        paths.get(fd, self.path),
                    )
                    continue
                os.ftruncate(fd, max(0, end - n))
                path = paths.get(fd)
                if end - n <= 0 and path is not None:
                    with contextlib.suppress(OSError):
                        here = os.stat(path)
                        if (here.st_dev, here.st_ino) == (st.st_dev, st.st_ino):
                            os.unlink(path)  # made by this sink, and left empty
            except OSError:
                continue

    def _put(self, fd: int, data: bytes) -> None:
        """Write all of ``data`` (a write may be short: a signal, a full disk), counting
        what went in for ``_take_back``."""
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            if self._batch is not None:
                self._batch[fd] = self._batch.get(fd, 0) + n
            view = view[n:]

    def _write_batch(self, data: bytes) -> None:
        now = time.monotonic()  # for the look at the path (_LOOK_EVERY); no system call (vDSO)
        if self._segment_bytes and self._old():
            self._close_file()  # old enough: ended before this batch
        limit = self._rotate_bytes
        if limit is None:
            self._write(_gzip_member(data) if self._gzip else data, now)
            return
        # A segment ends once full, in the middle of a batch if need be: a
        # write can join batches queued for megabytes. Each piece is whole
        # lines, and for gzip one member.
        while data:
            if self._fd >= 0 and self._segment_bytes >= limit:
                self._close_file()
            room = int(limit - self._segment_bytes) if self._fd >= 0 else int(limit)
            cut, out = self._fit(data, room)
            if not cut:  # not a whole line fits what is left
                if self._fd >= 0 and self._segment_bytes:
                    self._close_file()
                    continue
                cut = data.find(b"\n") + 1 or len(data)  # a line longer than a segment
                out = _gzip_member(data[:cut]) if self._gzip else data[:cut]
            data = data[cut:]
            self._write(out, now)
            if data:
                self._close_file()  # the rest does not fit: as full as this write makes it
        if self._segment_bytes >= limit:
            self._close_file()  # full: whole now, not when the next batch comes

    def _fit(self, data: bytes, room: int) -> tuple[int, bytes]:
        """How many bytes of ``data`` are the most whole lines that fit in ``room``
        bytes as written, and those bytes as written; (0, b"") when no line fits."""
        if not self._gzip:
            cut = len(data) if len(data) <= room else data.rfind(b"\n", 0, room) + 1
            return cut, data[:cut]
        # A member's size is known once it is made: tried on a guess, made again
        # on one scaled by how far it missed. Guesses only shrink, so the first
        # is more text than the room can hold compressed.
        size = min(len(data), _GZIP_RATIO * room)
        while True:
            cut = len(data) if size >= len(data) else data.rfind(b"\n", 0, size) + 1
            if not cut:
                return 0, b""
            member = _gzip_member(data[:cut])
            if len(member) <= room:
                return cut, member
            size = cut * room // len(member)

    def _write(self, data: bytes, now: float) -> None:
        """Put ``data``, as written (a gzip member already), in the file or segment;
        ``now`` is ``time.monotonic()``, for the look at the path."""
        if self._fd < 0 and self.rotating:  # the last segment was ended
            self._next()
            self._look_at = now + _LOOK_EVERY  # just made
        elif now >= self._look_at:
            self._look_at = now + _LOOK_EVERY
            if not self._still_there():
                self._reopen()
        self._put(self._fd, data)
        self._segment_bytes += len(data)
        if self.fsync == "batch":
            os.fdatasync(self._fd)
        elif self.fsync == "always":
            os.fsync(self._fd)

    def _old(self) -> bool:
        """Whether a segment is open and ``rotate_s`` old, on ``deadline_clock``."""
        if self._fd < 0 or self._rotate_s is None:
            return False
        return self.deadline_clock() >= self._segment_until

    def flush(self) -> None:
        self._look_at = 0.0  # the next write looks at the path
        if self._segment_bytes and self._old():
            self._close_file()  # old enough: whole now
        elif self.fsync == "always" and self._fd >= 0:
            os.fsync(self._fd)

    def _close_file(self) -> None:
        fd, self._fd = self._fd, -1
        if fd < 0:
            return
        if self._batch is not None:
            self._ended.append((fd, self.path))  # closed when the write is done
        else:
            os.close(fd)

    def close(self) -> None:
        self._close_file()

    def discard(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)
        _undo(self.path, self._made_file, self._made_dirs)


def _gzip_member(text: bytes) -> bytes:
    """``text`` as one whole gzip member: header, deflate data and trailer."""
    deflate = zlib.compressobj(wbits=31)  # 31: with gzip's header and trailer
    return deflate.compress(text) + deflate.flush(zlib.Z_FINISH)


def _positive(options: Mapping[str, str], name: str, unit: str, scale: int) -> float | None:
    """Option ``name`` as a number above 0 (times ``scale``), None when not given."""
    text = options.get(name)
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise SinkOptionError(
            f"{name}={text!r} is not a number of {unit} above 0 (e.g. {name}=100)"
        )
    return value * scale


def _split(base: str) -> tuple[str, str]:
    """``base`` as the part before its ``.jsonl`` or ``.jsonl.gz``, and that suffix."""
    for suffix in (".jsonl.gz", ".jsonl"):
        if base.endswith(suffix):
            return base[: -len(suffix)], suffix
    return base, ""


def segment_path(base: str, n: int) -> str:
    """Segment ``n`` of ``base``: its number before the ``.jsonl`` (or at the end)."""
    stem, suffix = _split(base)
    return f"{stem}.{n:06d}{suffix}"


def _next_segment(base: str) -> int:
    """The number after the highest segment of ``base`` already there (1 for none)."""
    stem, tail = _split(base)
    head = os.path.basename(stem) + "."
    try:
        names = os.listdir(os.path.dirname(base))
    except OSError:
        return 1  # no folder yet: open makes it
    found = []
    for name in names:
        number = name[len(head) : len(name) - len(tail)]
        # Six digits, seven past a million: a dated name (eight) is not a segment.
        if (
            name.startswith(head)
            and name.endswith(tail)
            and 6 <= len(number) <= 7
            and number.isdigit()
        ):
            found.append(int(number))
    return max(found) + 1 if found else 1


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


def _file_above(folder: str) -> str | None:
    """The nearest of ``folder`` and the folders above it that exists and is no folder."""
    while True:
        if os.path.lexists(folder):
            return None if os.path.isdir(folder) else folder
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent


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
