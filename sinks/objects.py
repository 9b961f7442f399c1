"""``s3://``, ``gs://``, ``az://``: a run in an object store, in whole objects, through fsspec.

An object store cannot append, so the sink stages what it is given in memory
and uploads each segment whole: when it is full (``rotate_mb``) or old
(``rotate_s``), at ``flush()``, every ``upload_s`` seconds while batches come,
and at the close. A segment uploaded again under the same key is its last
upload plus more: more lines, or for gzip more whole members (each upload
closes one), so a reader may read on from where it stopped.

The tracer counts a batch written only once the upload that holds it is done
(``Sink.stages``), and the first lines of a batch a segment's end cut in two
once they are (``staged_lines``). One ``write()`` or ``flush()`` starts no
more uploads once ``_CALL_SHARE`` of ``timeout_s`` would be spent: a slow
store is not taken for a hung one by the tracer's ``close_timeout``, and what
is left waits for the next call. A call that uploaded something and then
finds the sink must stop returns, so that the upload is counted; the next
call raises. A failed upload is retried with backoff, at the next
batch or flush once the backoff is over; the trouble is logged once per
outage, and what waits is kept staged. Uploads that keep failing for
``retry_s`` seconds, or more staged than ``_MAX_STAGED`` bytes, stop the sink:
the tracer reports it once and counts what it held as lost.

Every one of those times is on ``Sink.deadline_clock`` (the tracer's):
``rotate_s``, ``upload_s``, ``retry_s``, the backoff, each call's
``timeout_s`` and a call's share of it. A call given up at its ``timeout_s``
is given up within ``WAIT_SLICE_S`` of the clock passing it. Two waits stay
in real time: the client's own connect and read timeouts (from
``timeout_s``, a backstop), and a call through a filesystem that is not
asynchronous, which cannot be cut.

The filesystem is fsspec's for the scheme, configured as its users already
configure it: the standard variables (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_PROFILE``, ...) and fsspec's own configuration
(``FSSPEC_S3_*``, its config files).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.util
import logging
import math
import posixpath
import zlib
from collections.abc import Mapping
from typing import Any, ClassVar

from ._base import WAIT_SLICE_S, Sink, SinkOptionError
from .jsonl import _positive, _split, segment_path

__all__ = ["AzureSink", "GcsSink", "ObjectStoreSink", "S3Sink"]

logger = logging.getLogger("rollout_trace")

_MB = 10**6
_DEFAULT_ROTATE_MB = 16.0
_DEFAULT_UPLOAD_S = 60.0
_DEFAULT_RETRY_S = 300.0
# Staged bytes (as they will be uploaded) past which the sink stops rather
# than hold more of a long outage in memory.
_MAX_STAGED = 256 * _MB
_FIRST_BACKOFF_S = 0.5
_MAX_BACKOFF_S = 30.0
# How long close() tries again to upload the last lines it was given.
_CLOSE_S = 2.0
# Beyond timeout_s at open: the client's set-up (credentials, a session).
_OPEN_SLACK_S = 2.0
# Errors that say the store answered and will not take the object: a bucket
# that does not exist, credentials it refuses. At open they stop the tracer
# from opening; later, they stop the sink at once.
_REFUSALS = (FileNotFoundError, PermissionError, NotADirectoryError, IsADirectoryError)
# The same from botocore, by name (it is s3fs's, not imported here): no
# credentials at all is a setup to fix, not an outage to wait out.
_REFUSED_NAMES = frozenset({"NoCredentialsError", "PartialCredentialsError"})
_DEFAULT_TIMEOUT_S = 8.0
# One write() or flush() starts no further upload once this share of
# timeout_s would be spent by its end (the longest upload of the call taken
# as the next one's length): a slow store is then never in one call longer
# than the tracer's close_timeout allows (which gives the sink up as hung);
# what is left stays staged for the next batch, flush or the close.
_CALL_SHARE = 0.5


def _refused(exc: BaseException) -> bool:
    return isinstance(exc, _REFUSALS) or type(exc).__name__ in _REFUSED_NAMES


class _Segment:
    """One object: what was uploaded of it, what is staged, and how big it is."""

    __slots__ = (
        "added",
        "lines_end",
        "members",
        "number",
        "open",
        "raw_end",
        "size",
        "uploaded",
        "uploaded_size",
        "zip",
    )

    def __init__(self, gzip: bool) -> None:
        self.number: int | None = None  # given at its first upload
        self.members: list[bytes] = []  # the object's bytes, in closed pieces
        self.open = bytearray()  # the piece being added to (compressed for gzip)
        self.added = False  # lines went into the open piece
        self.zip: Any = zlib.compressobj(wbits=31) if gzip else None
        self.size = 0  # bytes the object holds with what is staged (compressed so far)
        self.raw_end = 0  # the sink's accepted-bytes offset at its last line
        self.lines_end = 0  # ... and accepted lines
        self.uploaded = -1  # raw_end at its last upload (-1: never uploaded)
        self.uploaded_size = 0  # bytes of the object its last upload stored

    def add(self, data: bytes, raw_end: int, lines_end: int) -> None:
        # gzip: flushed to the byte, so that ``size`` is what the object will
        # hold (a compressor keeps tens of kB back otherwise, and a segment
        # would outgrow rotate_mb by that much).
        piece = data
        if self.zip is not None:
            piece = self.zip.compress(data) + self.zip.flush(zlib.Z_SYNC_FLUSH)
        self.open += piece
        self.added = True
        self.size += len(piece)
        self.raw_end = raw_end
        self.lines_end = lines_end

    @property
    def staged(self) -> bool:
        return self.uploaded != self.raw_end

    def body(self) -> bytes:
        """The whole object: the pieces so far and the open one, closed."""
        if self.added:
            self.added = False
            if self.zip is not None:
                self.open += self.zip.flush(zlib.Z_FINISH)
                self.zip = zlib.compressobj(wbits=31)
            self.members.append(bytes(self.open))
            self.size = sum(map(len, self.members))
            self.open = bytearray()
        return b"".join(self.members)


class ObjectStoreSink(Sink):
    """A run as numbered segment objects, each uploaded whole (``stem.000001.jsonl``, ...).

    The location is ``bucket/prefix/name.jsonl`` (or ``.jsonl.gz``); segments
    are numbered before that suffix, from 000001 or on from the highest one
    already stored. Options: ``rotate_mb`` (default 16: a segment holds at
    most that many megabytes as stored, compressed for gzip), ``rotate_s``
    (a segment that old is ended before the next batch or at ``flush()``),
    ``upload_s`` (default 60: the segment being written is uploaded again
    after that long, at the next batch), ``retry_s`` (default 300: how long
    uploads may fail before the sink stops), ``timeout_s`` (default 8: the
    longest one call to the store may take).
    """

    #: The fsspec protocol, and the package and extra that implement it.
    protocol: ClassVar[str] = ""
    package: ClassVar[str] = ""
    extra: ClassVar[str] = ""

    options = frozenset({"rotate_mb", "rotate_s", "upload_s", "retry_s", "timeout_s"})
    stages = True

    def __init__(self, location: str, options: Mapping[str, str]) -> None:
        super().__init__(location, options)
        scheme = f"{self.protocol}://"
        if not location.endswith((".jsonl", ".jsonl.gz")) or "/" not in location.strip("/"):
            raise SinkOptionError(
                f"{scheme} needs bucket/prefix/name.jsonl (or .jsonl.gz), "
                f"e.g. {scheme}my-bucket/runs/{{run_id}}.jsonl; got {location!r}"
            )
        if importlib.util.find_spec(self.package) is None:
            raise SinkOptionError(
                f"{scheme} needs the {self.package} package: "
                f"pip install 'rollout-trace[{self.extra}]'"
            )
        self.base = location.strip("/")
        self.url_base = scheme + self.base
        self._gzip = self.base.endswith(".gz")
        self._rotate = _positive(options, "rotate_mb", "megabytes", _MB) or _DEFAULT_ROTATE_MB * _MB
        if "rotate_mb" in options and self._rotate > _MAX_STAGED:
            raise SinkOptionError(
                f"rotate_mb={options['rotate_mb']!r} is more than a segment held in memory "
                f"may be: at most {_MAX_STAGED // _MB} megabytes"
            )
        self._timeout_s = _positive(options, "timeout_s", "seconds", 1) or _DEFAULT_TIMEOUT_S
        self._rotate_s = _positive(options, "rotate_s", "seconds", 1)
        self._upload_s = _positive(options, "upload_s", "seconds", 1) or _DEFAULT_UPLOAD_S
        self._retry_s = _positive(options, "retry_s", "seconds", 1) or _DEFAULT_RETRY_S
        self._fs: Any = None
        self._next_number: int | None = None  # None: not listed yet
        self._segments: list[_Segment] = []  # ended ones waiting, then the current one
        self._current: _Segment | None = None
        self._segment_until = math.inf  # when the current segment is due to end (rotate_s)
        self._upload_at = math.inf  # when the current segment is due to be uploaded again
        self._accepted = 0  # bytes write() accepted
        self._delivered = 0  # ... of which an upload holds
        self._accepted_lines = 0  # the same in lines
        self._delivered_lines = 0
        self._failing_since: float | None = None
        self._retry_at = 0.0
        self._backoff = _FIRST_BACKOFF_S
        self._last_error: str | None = None
        # Why the sink must stop, found by a call that had also uploaded
        # something: that call returns, so that the tracer counts what it
        # uploaded, and the next one raises this.
        self._stop: OSError | None = None
        self.uploads = 0  # objects put, for tests and curiosity

    # --- the contract ----------------------------------------------------------

    @classmethod
    def open_within(cls, options: Mapping[str, str]) -> float:
        # The listing at open waits up to timeout_s for the store's answer.
        try:
            timeout_s = _positive(options, "timeout_s", "seconds", 1)
        except SinkOptionError:  # named when the sink is built
            timeout_s = None
        return (timeout_s or _DEFAULT_TIMEOUT_S) + _OPEN_SLACK_S

    def open(self) -> None:
        import fsspec

        # An instance of its own: the client's own retries are made short
        # (the sink retries over minutes itself), and a user's instance, with
        # its cached listings, is left alone. fsspec's configuration applies.
        self._fs = fsspec.filesystem(
            self.protocol, skip_instance_cache=True, **self._client_options(fsspec.config.conf)
        )
        try:
            # The store's answer decides: a refusal fails the open, and only
            # no answer within timeout_s means unreachable (the job starts).
            self._next_number = self._list_next()
        except Exception as exc:
            if _refused(exc):
                raise OSError(f"{self.url_base}: {type(exc).__name__}: {exc}") from exc
            # Unreachable now: the job starts anyway, and the segments are
            # numbered when the store first answers.
            self._note_failure(exc, self.deadline_clock())

    def write(self, data: bytes) -> None:
        self._raise_stop()
        now = self.deadline_clock()
        if self._current is not None and now >= self._segment_until:
            self._end_segment()
        # A write can join batches queued for megabytes: a segment ends as
        # soon as it is full, between two lines.
        while data:
            segment = self._current or self._new_segment(now)
            room = int(self._rotate - segment.size)
            if len(data) <= room:
                piece, data = data, b""
            else:
                cut = data.rfind(b"\n", 0, max(room, 0)) + 1
                if not cut:
                    if segment.size:
                        self._end_segment()
                        continue
                    cut = data.find(b"\n") + 1 or len(data)  # a line longer than a segment
                piece, data = data[:cut], data[cut:]
            self._accepted += len(piece)
            self._accepted_lines += piece.count(b"\n")
            segment.add(piece, self._accepted, self._accepted_lines)
            if segment.size >= self._rotate:
                self._end_segment()
        # A failed upload is tried again at the next batch once its backoff
        # is over, whatever is due.
        due = now >= self._upload_at or self._failing_since is not None
        uploaded = False
        if due or any(s is not self._current for s in self._segments):
            uploaded = self._deliver(now, everything=due, forced=False, budget=self._call_budget)
        self._check_limits(now, uploaded)

    def flush(self) -> None:
        self._raise_stop()
        now = self.deadline_clock()
        if self._current is not None and now >= self._segment_until:
            self._end_segment()
        uploaded = self._deliver(now, everything=True, forced=True, budget=self._call_budget)
        self._check_limits(now, uploaded)

    def close(self) -> None:
        self._raise_stop()
        if self._current is not None:
            self._end_segment()
        # The tracer already tried again until its drain deadline for what it
        # counts; what is left is its last lines (trace_closed): a short try.
        until = self.deadline_clock() + _CLOSE_S
        while True:
            now = self.deadline_clock()
            self._deliver(now, everything=True, forced=True)
            self._raise_stop()
            if not self._segments:
                return
            self._check_limits(now)
            if now + self._backoff > until:
                raise OSError(
                    f"the last upload to {self.url_base} failed at the close: {self._last_error}"
                )
            self.wait_until(now + self._backoff)

    @property
    def _call_budget(self) -> float:
        return self._timeout_s * _CALL_SHARE

    def _raise_stop(self) -> None:
        if self._stop is not None:
            raise self._stop

    def discard(self) -> None:
        # Nothing was uploaded at open; once the tracer stopped the sink, what
        # it still stages was counted lost and is not uploaded after all.
        self._segments.clear()
        self._current = None

    def staged_bytes(self) -> int:
        return self._accepted - self._delivered

    def staged_lines(self) -> int:
        return self._accepted_lines - self._delivered_lines

    def why_staged(self) -> str | None:
        # A stop waiting for the next call (a refusal, a limit) is the reason.
        return str(self._stop) if self._stop is not None else self._last_error

    def _client_options(self, conf: Mapping[str, Any]) -> dict[str, Any]:
        """Options for the filesystem beyond fsspec's configuration (which wins)."""
        return {}

    # --- segments and uploads ----------------------------------------------------

    def _new_segment(self, now: float) -> _Segment:
        segment = _Segment(self._gzip)
        self._segments.append(segment)
        self._current = segment
        self._segment_until = now + self._rotate_s if self._rotate_s else math.inf
        self._upload_at = now + self._upload_s
        return segment

    def _end_segment(self) -> None:
        self._current = None
        self._segment_until = self._upload_at = math.inf

    def _deliver(
        self, now: float, *, everything: bool, forced: bool, budget: float = math.inf
    ) -> bool:
        """Upload the ended segments waiting, in order, and the current one if
        ``everything``; not before the backoff is over unless ``forced``; no
        upload after the first that would end more than ``budget`` seconds
        after the call began. Whether anything was uploaded."""
        if self._failing_since is not None and not forced and now < self._retry_at:
            return False
        began = self.deadline_clock()
        longest = 0.0  # the longest upload so far, to tell when the next one ends
        uploaded = False
        for segment in list(self._segments):
            if segment is self._current and not everything:
                break
            if not segment.staged:
                if segment is not self._current:
                    self._segments.remove(segment)
                continue
            start = self.deadline_clock()
            if uploaded and start + longest - began > budget:
                break  # the rest waits for the next call (still staged)
            try:
                self._upload(segment)
            except Exception as exc:
                if _refused(exc):
                    stop = OSError(f"{self._url(segment)}: {type(exc).__name__}: {exc}")
                    stop.__cause__ = exc
                    if not uploaded:
                        raise stop from exc
                    self._stop = stop
                    return True
                self._note_failure(exc, now)
                return uploaded
            uploaded = True
            longest = max(longest, self.deadline_clock() - start)
            self._delivered = segment.raw_end
            self._delivered_lines = segment.lines_end
            if segment is not self._current:
                self._segments.remove(segment)
            else:
                self._upload_at = self.deadline_clock() + self._upload_s
        if self._failing_since is not None:
            logger.warning(
                "rollout_trace: uploads to %s work again after %.1f s",
                self.url_base,
                self.deadline_clock() - self._failing_since,
            )
        self._failing_since = None
        self._last_error = None
        self._backoff = _FIRST_BACKOFF_S
        return uploaded

    def _upload(self, segment: _Segment) -> None:
        if segment.number is None:
            if self._next_number is None:
                self._next_number = self._list_next()
            segment.number = self._next_number
            self._next_number += 1
        end = segment.raw_end
        self._bounded("pipe_file", self._key(segment), segment.body())
        segment.uploaded = end
        segment.uploaded_size = segment.size
        self.uploads += 1

    def _bounded(self, name: str, *args: Any, limit: float | None = None) -> Any:
        """``fs.<name>(*args)``, given up after ``limit`` (``timeout_s`` by default).

        botocore's timeouts do not cover all of a call (a PUT waits for its
        ``100 Continue`` unbounded), so an async filesystem's call runs on its
        loop under a deadline on ``deadline_clock``, and is cancelled there when it
        passes: a hung upload of older bytes must not land later, over a newer
        one.
        """
        fs = self._fs
        if not getattr(fs, "async_impl", False):
            return getattr(fs, name)(*args)
        limit = self._timeout_s if limit is None else limit
        end = self.deadline_clock() + limit
        future = asyncio.run_coroutine_threadsafe(getattr(fs, "_" + name)(*args), fs.loop)
        while True:
            try:
                # In slices: the deadline is on the clock, which a test moves.
                return future.result(max(min(end - self.deadline_clock(), WAIT_SLICE_S), 0.0))
            except concurrent.futures.TimeoutError:
                if future.done():  # the answer came meanwhile, or the client's own timeout
                    return future.result()
                if self.deadline_clock() < end:
                    continue
            future.cancel()
            within = f"timeout_s={limit:g}" if limit == self._timeout_s else f"{limit:g}"
            raise TimeoutError(f"{name} had no answer within {within} s") from None

    def _note_failure(self, exc: BaseException, now: float) -> None:
        self._last_error = f"{type(exc).__name__}: {exc}"
        if self._failing_since is None:
            self._failing_since = now
            logger.warning(
                "rollout_trace: an upload to %s failed (%s); retrying with backoff for up to "
                "%g s, what waits stays staged and is not counted written until uploaded "
                "(reported once per outage)",
                self.url_base,
                self._last_error,
                self._retry_s,
            )
        self._retry_at = now + self._backoff
        self._backoff = min(self._backoff * 2, _MAX_BACKOFF_S)

    def _check_limits(self, now: float, uploaded: bool = False) -> None:
        """Raise if the sink must stop; if the call ``uploaded`` something, the
        next call does (this one returns, and the tracer counts the upload)."""
        try:
            self._limits(now)
        except OSError as exc:
            if not uploaded:
                raise
            if self._stop is None:  # a refusal this call met first stays the reason
                self._stop = exc

    def _limits(self, now: float) -> None:
        if self._failing_since is not None and now - self._failing_since >= self._retry_s:
            raise OSError(
                f"uploads to {self.url_base} failed for {now - self._failing_since:.0f} s "
                f"(retry_s={self._retry_s:g}): {self._last_error}"
            )
        staged = sum(s.size - s.uploaded_size for s in self._segments if s.staged)
        if staged > _MAX_STAGED:
            why = f": {self._last_error}" if self._last_error else ""
            raise OSError(
                f"{staged / _MB:.0f} MB staged for {self.url_base} could not be uploaded "
                f"(more than {_MAX_STAGED / _MB:.0f} MB are not held){why}"
            )

    def _key(self, segment: _Segment) -> str:
        assert segment.number is not None
        return segment_path(self.base, segment.number)

    def _url(self, segment: _Segment) -> str:
        return f"{self.protocol}://{self._key(segment) if segment.number else self.base}"

    def _list_next(self, limit: float | None = None) -> int:
        """The number after the highest segment of the base already stored (1 for none)."""
        stem, suffix = _split(self.base)
        folder, head = posixpath.split(stem)
        self._fs.invalidate_cache(folder)
        found = []
        for path in self._bounded("glob", f"{stem}.*{suffix}", limit=limit):
            name = posixpath.basename(path)
            number = name[len(head) + 1 : len(name) - len(suffix)]
            if name.endswith(suffix) and 6 <= len(number) <= 7 and number.isdigit():
                found.append(int(number))
        return max(found) + 1 if found else 1


class S3Sink(ObjectStoreSink):
    """``s3://bucket/prefix/name.jsonl``: Amazon S3 and S3-compatible stores (s3fs)."""

    protocol = "s3"
    package = "s3fs"
    extra = "s3"

    def _client_options(self, conf: Mapping[str, Any]) -> dict[str, Any]:
        # Short attempts, so that a call fails within timeout_s rather than
        # being cut there: botocore's default retries of a refused connection
        # take 7 s. Its read timeout is timeout_s: a refusal that comes late,
        # but within it, still decides the open. fsspec's configuration wins.
        mine: dict[str, Any] = {
            "retries": {"total_max_attempts": 2, "mode": "standard"},
            "connect_timeout": min(3.0, self._timeout_s),
            "read_timeout": self._timeout_s,
        }
        theirs = dict(conf.get(self.protocol, {}).get("config_kwargs", {}))
        return {"config_kwargs": {**mine, **theirs}}

    def open(self) -> None:
        super().open()
        # s3fs retries a failed call itself too, five times by default (an
        # attribute: its constructor takes no such option).
        self._fs.retries = 2


class GcsSink(ObjectStoreSink):
    """``gs://bucket/prefix/name.jsonl``: Google Cloud Storage (gcsfs)."""

    protocol = "gs"
    package = "gcsfs"
    extra = "gcs"


class AzureSink(ObjectStoreSink):
    """``az://container/prefix/name.jsonl``: Azure Blob Storage (adlfs)."""

    protocol = "az"
    package = "adlfs"
    extra = "azure"
