"""Trace files in object stores (``s3://``, ``gs://``, ``az://``), listed and opened through fsspec.

A path is a URL when it begins with the scheme of an object store fsspec
reads (``STORES``) and ``://``; every other path is a local one. The store's
filesystem is fsspec's (``s3fs``, ``gcsfs``, ``adlfs``, installed by the
extras ``rollout-trace[s3]``, ``[gcs]``, ``[azure]``), configured as its users
already configure it: endpoint and credentials from the standard variables
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...) and fsspec's own
configuration (its environment variables and config files). fsspec is imported only
when a URL is given: reading local files never imports it.

Every exception fsspec and the store's client raise is translated here, in
one line naming the URL and what is wrong: no such bucket or object, access
denied, no credentials, the store cannot be reached, the package for the
scheme is not installed. Each is a ``TraceReadError`` where it is met before
a byte is read (listing, opening), as a missing file is; a store that fails
once a read is under way is a ``StoreReadError``, an ``OSError``, as a
failing disk's read is.

A store that stops answering is given up on in bounded time: the readers'
S3 client waits at most ``_S3_CONFIG``'s timeouts, with few retries (where
botocore's defaults and s3fs's own retries held a command for many
minutes); what fsspec's configuration sets wins. A listing's sizes and
etags are kept (``_KNOWN``), so that what it listed is opened and sized
with no request more: a command costs one listing, and the reads.
"""

from __future__ import annotations

import contextlib
import fnmatch
import glob
import re
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from .._errors import TraceReadError

__all__ = [
    "STORES",
    "SUFFIXES",
    "NothingThere",
    "StoreFile",
    "StoreReadError",
    "is_url",
    "foreign_scheme",
    "name_matches",
    "url_key",
    "expand_url",
    "known",
    "remember",
    "open_url",
    "url_size",
]

# The object stores read, by scheme: the extra that installs each one's
# filesystem, and that filesystem's package. Other schemes fsspec knows
# (memory://, http://, ftp://, file://, ...) are no object store of a trace set.
STORES: dict[str, tuple[str, str]] = {
    "s3": ("s3", "s3fs"),
    "s3a": ("s3", "s3fs"),
    "gs": ("gcs", "gcsfs"),
    "gcs": ("gcs", "gcsfs"),
    "az": ("azure", "adlfs"),
    "abfs": ("azure", "adlfs"),
    "abfss": ("azure", "adlfs"),
}
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
# The names of the trace files a folder (or a prefix) stands for.
SUFFIXES = (".jsonl", ".jsonl.gz")
# Bytes an object is read ahead by, a request each: a few of the reader's chunks.
_BLOCK = 8 << 20
# The S3 client's bounds. botocore's defaults wait 60 s for each read and retry
# it, and s3fs retries each call again (``_S3_RETRIES``; its default is 5), a
# range read twice over (the request, and the read of its body): a store that
# hung held a command for many minutes. With these, a hung listing is given up
# in about 40 s (2 x 2 attempts of 10 s), a hung read in under 90 s; 10 s with no
# byte is long for a store, whose reads stream. fsspec's configuration
# (``config_kwargs``) wins over each of these.
_S3_CONFIG: dict[str, Any] = {
    "retries": {"total_max_attempts": 2, "mode": "standard"},
    "connect_timeout": 3,
    "read_timeout": 10,
}
_S3_RETRIES = 2
# What the listings found of the objects they listed, by ``url_key``: the most
# recent listing's, as many as a long ``watch`` over a churning prefix needs.
_KNOWN: dict[str, dict[str, Any]] = {}
_KNOWN_MAX = 1 << 16
_KNOWN_LOCK = threading.Lock()  # readers in threads of one program


class NothingThere(TraceReadError):
    """A URL names nothing (yet): no object matches it, none is under it, or it is no object.

    ``prefix`` is true where the URL names a prefix or a bucket (as a folder)
    that holds no trace object. A ``watch`` of a glob or a prefix waits for
    its objects; other errors (no bucket, access denied, the store down) are
    errors at the first look.
    """

    def __init__(self, message: str, *, prefix: bool = False) -> None:
        super().__init__(message)
        self.prefix = prefix


class StoreReadError(OSError):
    """The store failed a read under way (it stopped answering, or answered with an
    error): an ``OSError``, as a failing disk's read is, in one line naming the URL."""


def _scheme(text: str) -> str | None:
    m = _SCHEME.match(text)
    return m.group(1).lower() if m else None


def is_url(path: str) -> bool:
    """Whether ``path`` is an object store URL (its scheme is one of ``STORES``)."""
    return _scheme(path) in STORES


def foreign_scheme(path: str) -> str | None:
    """The scheme of ``path`` if it looks like a URL of no object store read here."""
    scheme = _scheme(path)
    return scheme if scheme is not None and scheme not in STORES else None


def url_key(url: str) -> str:
    """What names the object ``url`` names, whichever of its store's schemes it is
    given with (``s3://`` and ``s3a://``, in any case): one key an object."""
    scheme = _scheme(url) or ""
    return STORES[scheme][1] + url[len(scheme) :]


def _options(package: str, conf: Mapping[str, Any]) -> dict[str, Any]:
    """The filesystem's options beyond fsspec's configuration ``conf``, which wins."""
    if package != "s3fs":
        return {}
    theirs: dict[str, Any] = {}
    for protocol in ("s3", "s3a"):  # s3fs's, in the order fsspec applies them
        given = conf.get(protocol, {}).get("config_kwargs", {})
        if not isinstance(given, Mapping):
            return {}  # not ours to fix: passed on as given
        theirs.update(given)
    return {"config_kwargs": {**_S3_CONFIG, **theirs}}


def _filesystem(url: str) -> tuple[Any, str]:
    """fsspec's filesystem for ``url``, and the path in it."""
    scheme = _scheme(url) or ""
    extra, package = STORES[scheme]
    hint = f"pip install 'rollout-trace[{extra}]' (or {package})"
    try:
        import fsspec.core
    except ImportError:
        raise TraceReadError(
            f"cannot read {url!r}: reading {scheme}:// needs fsspec and {package}: {hint}"
        ) from None
    try:
        # The scheme as fsspec knows it: `S3://` is `s3://`.
        options = _options(package, fsspec.config.conf)
        fs, path = fsspec.core.url_to_fs(scheme + url[len(scheme) :], **options)
    except ImportError:
        raise TraceReadError(
            f"cannot read {url!r}: {package} (fsspec's filesystem for {scheme}://) is not "
            f"installed: {hint}"
        ) from None
    except Exception as exc:  # a malformed URL or bad fsspec configuration
        raise TraceReadError(_why(url, exc)) from exc
    if package == "s3fs":
        fs.retries = _S3_RETRIES  # an attribute: its constructor takes no such option
    return fs, path


def _why(url: str, exc: BaseException) -> str:
    """What went wrong with ``url``, in one line, from what fsspec or its client raised."""
    name = type(exc).__name__
    text = _one_line(exc) or name
    if "Invalid bucket name" in text:  # botocore's, with the regexes a name must match
        bucket = url.split("://", 1)[-1].split("/", 1)[0]
        return f"cannot read {url!r}: {bucket!r} is no valid bucket name"
    if isinstance(exc, PermissionError) or "AccessDenied" in text or "Forbidden" in text:
        return f"cannot read {url!r}: access denied ({text})"
    if "Credentials" in name:
        return (
            f"cannot read {url!r}: no credentials for the store ({text}); set them as its "
            "client reads them (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile, ...)"
        )
    if (
        isinstance(exc, (ConnectionError, TimeoutError))
        or name.endswith(("ConnectionError", "TimeoutError", "ConnectorError"))
        or "connect" in text.lower()
    ):
        return f"cannot read {url!r}: the object store cannot be reached ({name}: {text})"
    return f"cannot read {url!r}: {name}: {text}"


def _one_line(exc: BaseException) -> str:
    """What ``exc`` says, its lines joined (a client's message may take several)."""
    return " ".join(line.strip() for line in str(exc).splitlines() if line.strip())


@contextlib.contextmanager
def _translated(url: str, *, reading: bool = False) -> Iterator[None]:
    """Every exception but ours, raised inside, as a ``TraceReadError`` naming ``url``;
    or, ``reading`` (a read under way), as a ``StoreReadError`` where the store failed
    (an object gone or access denied is still a ``TraceReadError``, as when met at
    the open)."""
    try:
        yield
    except (TraceReadError, StoreReadError):
        raise
    except FileNotFoundError as exc:
        raise TraceReadError(f"no such trace object: {url!r} ({_one_line(exc)})") from exc
    except Exception as exc:
        said = _why(url, exc)
        if reading and not said.startswith(f"cannot read {url!r}: access denied"):
            raise StoreReadError(said) from exc
        raise TraceReadError(said) from exc


def remember(found: Mapping[str, Mapping[str, Any]]) -> None:
    """Keep what a listing found of objects, by URL (``known``)."""
    with _KNOWN_LOCK:
        for url, info in found.items():
            key = url_key(url)
            _KNOWN.pop(key, None)  # the newest last, the oldest let go first
            _KNOWN[key] = dict(info)
        while len(_KNOWN) > _KNOWN_MAX:
            del _KNOWN[next(iter(_KNOWN))]


def known(urls: Iterable[str]) -> dict[str, dict[str, Any]]:
    """What the latest listings found of the objects ``urls``, those they found: for a
    process that opens them without listing them again (a worker)."""
    out: dict[str, dict[str, Any]] = {}
    for url in urls:
        if is_url(url) and (info := _KNOWN.get(url_key(url))) is not None:
            out[url] = info
    return out


def _info(url: str) -> dict[str, Any] | None:
    """What the latest listing found of the object ``url``, if it found it."""
    info = _KNOWN.get(url_key(url))
    return info if info is not None and "size" in info else None


def _bucket_missing(fs: Any, path: str, url: str) -> None:
    """Raise if the bucket (or container) of ``path`` is not there."""
    bucket = path.split("/", 1)[0]
    try:
        fs.info(bucket)
    except FileNotFoundError:
        raise TraceReadError(f"no such bucket {bucket!r} (from {url!r})") from None


def _globbed(key: str, pattern: str) -> bool:
    """Whether ``key`` matches ``pattern`` as a file's path matches it locally
    (``glob.glob(pattern, recursive=True)``, ``paths``): ``*``, ``?``, ``[...]``
    and ``**`` match no name that begins with a dot unless the pattern's part
    does, and ``**`` (any number of folders; a last one, everything under)
    walks into no such folder. fsspec's glob matches those names too: the
    same glob named other objects in a store than files on a disk.
    """
    parts = [p for p in pattern.split("/") if p]
    if parts and parts[-1] == "**":
        parts.append("*")  # a last `**`: the files under it, at any depth
    names = [n for n in key.split("/") if n]
    failed: set[tuple[int, int]] = set()

    def match(i: int, j: int) -> bool:
        if (i, j) in failed:
            return False
        if i == len(parts):
            ok = j == len(names)
        elif parts[i] == "**":  # no folder, or one more that is not hidden
            ok = match(i + 1, j) or (
                j < len(names) and not names[j].startswith(".") and match(i, j + 1)
            )
        elif j == len(names):
            ok = False
        elif glob.has_magic(parts[i]):
            ok = name_matches(names[j], parts[i]) and match(i + 1, j + 1)
        else:
            ok = names[j] == parts[i] and match(i + 1, j + 1)
        if not ok:
            failed.add((i, j))
        return ok

    return match(0, 0)


def name_matches(name: str, part: str) -> bool:
    """Whether ``name`` matches the glob ``part`` as ``glob`` has it: a name that
    begins with a dot only where ``part`` does."""
    return (part.startswith(".") or not name.startswith(".")) and fnmatch.fnmatchcase(name, part)


def expand_url(url: str) -> list[str]:
    """The objects ``url`` names, as URLs: the one object, a prefix's ``*.jsonl`` and
    ``*.jsonl.gz`` objects (not those under a further ``/``) sorted, or a glob's
    matches sorted, the names a local glob matches (``_globbed``: a name that
    begins with a dot only where the pattern's part does). A key with glob
    characters that is there is that object (or prefix), as a file is.

    What is listed is listed afresh, never from an earlier listing's cache; what
    the listing found of each object is kept for its read (``known``).
    """
    fs, path = _filesystem(url)
    scheme = _scheme(url)

    def named(p: str) -> str:
        return f"{scheme}://{p}"

    with _translated(url):
        fs.invalidate_cache()
        try:
            info = fs.info(path)
        except FileNotFoundError:
            info = None
        except PermissionError:
            if not glob.has_magic(path):
                raise
            info = None  # a key that may not be there: the glob's listing says
        if info is None and glob.has_magic(path):
            found = fs.glob(path, detail=True)
            matched = {
                p: i
                for p, i in sorted(found.items())
                if i.get("type") == "file" and _globbed(p, path)
            }
            if not matched:
                _bucket_missing(fs, path, url)
                raise NothingThere(f"no trace object matches {url!r}")
        elif info is None:
            _bucket_missing(fs, path, url)
            raise NothingThere(f"no such trace object: {url!r}")
        elif info.get("type") != "directory":
            matched = {path: info}
        else:
            listed = fs.ls(path.rstrip("/"), detail=True)
            matched = {
                i["name"]: i
                for i in sorted(listed, key=lambda i: str(i["name"]))
                if i.get("type") == "file" and str(i["name"]).endswith(SUFFIXES)
            }
            if not matched:
                raise NothingThere(f"{url!r} holds no .jsonl or .jsonl.gz object", prefix=True)
    out = {named(p): i for p, i in matched.items()}
    remember(out)
    return list(out)


class StoreFile:
    """An object opened for reading, whose reads fail as ``_translated`` says.

    What a reader uses of a binary file: ``read``, ``seek``, ``tell``, ``close``;
    and ``size`` and ``etag`` as its listing (or else the open) found them.
    """

    def __init__(self, url: str, f: Any) -> None:
        self.url = url
        self._f = f

    @property
    def size(self) -> int:
        return int(self._f.size)

    @property
    def etag(self) -> str | None:
        details = getattr(self._f, "details", None) or {}
        tag = details.get("ETag") or details.get("etag")
        return None if tag is None else str(tag)

    def read(self, n: int = -1) -> bytes:
        with _translated(self.url, reading=True):
            return bytes(self._f.read(n))

    def seek(self, offset: int, whence: int = 0) -> int:
        with _translated(self.url, reading=True):
            return int(self._f.seek(offset, whence))

    def tell(self) -> int:
        return int(self._f.tell())

    def close(self) -> None:
        with contextlib.suppress(Exception):  # a read-only object: nothing to lose
            self._f.close()

    def __enter__(self) -> StoreFile:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def open_url(url: str, *, ahead: bool = True) -> StoreFile:
    """The object ``url`` opened for reading, streamed: read ahead ``_BLOCK`` bytes at
    a time, or with ``ahead=False`` a request for each read (a read of a few bytes
    then costs only those).

    An object a listing found is opened with no request: its size and etag are
    the listing's, and its first ``size`` bytes are read (an object the sink
    uploaded again since holds them, and more). A failure to open is a
    ``TraceReadError``; the store's failure in a read, a ``StoreReadError``.
    """
    fs, path = _filesystem(url)
    info = _info(url)
    options: dict[str, Any] = (
        {"block_size": _BLOCK, "cache_type": "readahead"} if ahead else {"cache_type": "none"}
    )
    if info is not None:
        options["size"] = int(info["size"])
    with _translated(url):
        f = fs.open(path, "rb", **options)
        if info is not None:
            with contextlib.suppress(AttributeError):
                f.details = dict(info)  # what s3fs would look up again at the first read
    return StoreFile(url, f)


def url_size(url: str) -> int:
    """The size of the object ``url``: as its listing found it, or asked."""
    info = _info(url)
    if info is not None:
        return int(info["size"])
    fs, path = _filesystem(url)
    with _translated(url):
        return int(fs.info(path)["size"])
