"""Which files a trace set is: paths, globs and folders, expanded in the order given."""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable

from .._errors import TraceReadError

__all__ = ["expand_paths"]


def expand_paths(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> list[str]:
    """Files named by paths, globs and folders, in the order given, each once.

    A folder stands for its ``*.jsonl`` and ``*.jsonl.gz`` files. A glob that
    matches nothing, or a path that does not exist, raises ``TraceReadError``.
    """
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not items:
        raise TraceReadError("no trace files given: pass at least one path or glob")
    files: dict[str, None] = {}
    for item in items:
        if not isinstance(item, (str, os.PathLike)):
            raise TraceReadError(
                f"trace path {item!r} is a {type(item).__name__}; expected a str or a path"
            )
        text = os.fspath(item)
        # A real file or folder first: its name may hold glob characters.
        if os.path.isfile(text):
            matched = [text]
        elif not os.path.isdir(text) and glob.has_magic(text):
            matched = sorted(p for p in glob.glob(text, recursive=True) if os.path.isfile(p))
            if not matched:
                raise TraceReadError(f"no trace file matches {text!r}")
        elif os.path.isdir(text):
            matched = sorted(
                os.path.join(text, name)
                for name in os.listdir(text)
                if name.endswith((".jsonl", ".jsonl.gz"))
            )
            if not matched:
                raise TraceReadError(f"folder {text!r} holds no .jsonl or .jsonl.gz file")
        else:
            raise TraceReadError(f"no such trace file: {text!r}")
        files.update(dict.fromkeys(matched))
    return list(files)
