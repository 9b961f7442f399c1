"""Which files a trace set is: paths, globs and folders, expanded in the order given.

Everything that would stop a read part way is found here, before a byte is
read: a path that does not exist, a folder that cannot be listed, a symbolic
link to nothing or to itself, a file that cannot be read. An object store URL
(``s3://bucket/prefix/*.jsonl``) is listed through fsspec (``stores``).
"""

from __future__ import annotations

import errno
import glob
import os
import stat
from collections.abc import Iterable, Iterator

from .._errors import TraceReadError
from .stores import STORES, SUFFIXES, expand_url, foreign_scheme, is_url, name_matches, url_key

__all__ = ["expand_paths"]


def expand_paths(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> list[str]:
    """Files named by paths, globs and folders, in the order given, each once.

    A folder stands for its ``*.jsonl`` and ``*.jsonl.gz`` files; a glob's
    matches come sorted, ``**`` standing for any number of folders. A file
    named twice (as ``x`` and ``./x``, or through a symbolic link) is read
    once, under the first name given. A glob that matches nothing, a path that
    does not exist, a folder that cannot be listed, a symbolic link that leads
    nowhere or in a circle, and a file that cannot be read raise
    ``TraceReadError``.

    A URL of an object store (``s3://``, ``gs://``, ``az://``: ``stores``)
    names an object, a glob of them, or a prefix standing for its ``*.jsonl``
    and ``*.jsonl.gz`` objects, as a folder does; an object is read once,
    under its first URL (``s3://`` and ``s3a://`` name the same objects).
    """
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not items:
        raise TraceReadError("no trace files given: pass at least one path or glob")
    files: dict[tuple[int, int] | str, str] = {}
    for item in items:
        if not isinstance(item, (str, os.PathLike)):
            raise TraceReadError(
                f"trace path {item!r} is a {type(item).__name__}; expected a str or a path"
            )
        text = os.fspath(item)
        if is_url(text):
            for url in expand_url(text):
                files.setdefault(url_key(url), url)
            continue
        scheme = foreign_scheme(text)
        if scheme is not None and not os.path.lexists(text):
            stores = ", ".join(f"{s}://" for s in STORES)
            raise TraceReadError(
                f"trace path {text!r}: {scheme}:// is no object store read here; give a local "
                f"path, or a URL of one of {stores}"
            )
        for path, st in _expand(text):
            if not os.access(path, os.R_OK):
                raise TraceReadError(f"trace file {path!r} cannot be read: permission denied")
            files.setdefault((st.st_dev, st.st_ino), path)
    return list(files.values())


def _expand(text: str) -> Iterator[tuple[str, os.stat_result]]:
    """The files ``text`` names, with what they are."""
    # A real file first: its name may hold glob characters.
    if glob.has_magic(text) and not os.path.lexists(text):
        matched = sorted(_glob(text))
        if not matched:
            raise TraceReadError(f"no trace file matches {text!r}")
        for path in matched:
            # A glob names a file by matching it; folders it matches are passed over.
            found = _stat(path, text)
            if found is not None and stat.S_ISREG(found.st_mode):
                yield path, found
        return
    st = _stat(text, text)
    if st is None:
        raise TraceReadError(f"no such trace file: {text!r}")
    if stat.S_ISDIR(st.st_mode):
        yield from _folder(text)
    else:
        yield text, st


def _stat(path: str, given: str) -> os.stat_result | None:
    """What ``path`` leads to; None if nothing is there (not even a link)."""
    try:
        return os.stat(path)
    except OSError as exc:
        broken = os.path.islink(path)
        if exc.errno == errno.ENOENT and not broken:
            return None
        raise TraceReadError(_why(path, given, exc, broken)) from None


def _why(path: str, given: str, exc: OSError, link: bool) -> str:
    where = repr(path) if path == given else f"{path!r} (from {given!r})"
    if exc.errno == errno.ELOOP:
        return f"trace path {where} is a symbolic link that leads back to itself"
    if link and exc.errno == errno.ENOENT:
        return (
            f"trace path {where} is a symbolic link to {os.readlink(path)!r}, which does not exist"
        )
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"trace path {where} cannot be reached: permission denied"
    return f"trace path {where} cannot be used: {exc.strerror or exc}"


def _folder(folder: str) -> Iterator[tuple[str, os.stat_result]]:
    names = sorted(name for name in _listdir(folder, folder) if name.endswith(SUFFIXES))
    found = False
    for name in names:
        path = os.path.join(folder, name)
        st = _stat(path, folder)
        if st is not None and stat.S_ISREG(st.st_mode):
            found = True
            yield path, st
    if not found:
        raise TraceReadError(f"folder {folder!r} holds no .jsonl or .jsonl.gz file")


def _listdir(folder: str, given: str) -> list[str]:
    try:
        return os.listdir(folder)
    except OSError as exc:
        where = repr(folder) if folder == given else f"{folder!r} (met by {given!r})"
        if exc.errno in (errno.EACCES, errno.EPERM):
            raise TraceReadError(f"folder {where} cannot be listed: permission denied") from None
        raise TraceReadError(f"folder {where} cannot be listed: {exc.strerror or exc}") from None


def _glob(pattern: str) -> Iterator[str]:
    """What ``glob.glob(pattern, recursive=True)`` matches, each folder of a ``**`` walked once.

    ``glob`` follows a symbolic link back to a folder above it round and
    round (until the path is too long for the system), matching the same
    files again on every round; with two such links, the rounds multiply.
    """
    drive, rest = os.path.splitdrive(pattern)
    root = drive + (os.sep if rest.startswith(os.sep) else "")
    yield from _match(root, [p for p in rest.split(os.sep) if p], pattern)


def _match(base: str, parts: list[str], given: str) -> Iterator[str]:
    if not parts:
        yield base
        return
    part, rest = parts[0], parts[1:]
    folder = base or os.curdir
    if part == "**":
        for sub in _folders_under(base, given, set()):
            # A last `**` matches everything under it; only the files count.
            yield from _match(sub, rest or ["*"], given)
    elif glob.has_magic(part):
        for name in sorted(_listdir(folder, given)):
            if not name_matches(name, part):
                continue
            path = os.path.join(base, name)
            if rest and not os.path.isdir(path):
                continue
            yield from _match(path, rest, given)
    else:
        path = os.path.join(base, part)
        if rest and not os.path.isdir(path):
            return
        if not rest and not os.path.lexists(path):
            return
        yield from _match(path, rest, given)


def _folders_under(base: str, given: str, walked: set[tuple[int, int]]) -> Iterator[str]:
    """``base`` and every folder under it (hidden ones left out, as ``glob`` does),
    each folder once however many links lead to it."""
    folder = base or os.curdir
    try:
        st = os.stat(folder)
    except OSError:
        return
    if (st.st_dev, st.st_ino) in walked:
        return
    walked.add((st.st_dev, st.st_ino))
    yield base
    for name in sorted(_listdir(folder, given)):
        path = os.path.join(base, name)
        if not name.startswith(".") and os.path.isdir(path):
            yield from _folders_under(path, given, walked)
