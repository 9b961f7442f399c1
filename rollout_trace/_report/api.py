"""``rt.health_report`` and ``rt.attempts``: the ``report`` and ``attempts`` commands in Python."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable
from typing import Any, Union

from .._reading.reader import ReadProblem, read
from .._schema.decoding import AnyEvent
from .._timeline.fold import build_timeline
from .health import DEFAULT_STALL_AFTER, HealthReport, report_of
from .table import AttemptRow, rows_of

__all__ = ["attempts", "health_report"]

Source = Union[str, "os.PathLike[str]", Iterable[Any]]


def _events(source: Source, problems: list[ReadProblem]) -> Iterable[AnyEvent]:
    """Events from paths (files, globs, folders; bad lines go to ``problems``)
    or from events themselves."""
    if isinstance(source, (str, os.PathLike)):
        return read(source, problems)
    it = iter(source)
    first = next(it, None)
    if first is None:
        return ()
    if isinstance(first, (str, os.PathLike)):
        return read([first, *it], problems)
    return itertools.chain([first], it)


def health_report(source: Source, *, stall_after: float = DEFAULT_STALL_AFTER) -> HealthReport:
    """What ``rollout-trace report`` reports, for trace files (paths, globs,
    folders) or events: per run and for the set, attempts by outcome, tries per
    sibling, durations, stalls, staleness, intervals and sealed attempts per
    second; the lines that are no event are counted in ``bad_lines``, and what
    the reading noted is in ``notes``. Any order of files and lines gives the
    same report."""
    problems: list[ReadProblem] = []
    tl = build_timeline(_events(source, problems))
    return report_of(tl, stall_after, len(problems))


def attempts(source: Source) -> list[AttemptRow]:
    """One ``AttemptRow`` per attempt across runs (``rollout-trace attempts``), for
    trace files (paths, globs, folders) or events; for pandas,
    ``pd.DataFrame(msgspec.structs.asdict(r) for r in rows)``."""
    return list(rows_of(build_timeline(_events(source, []))))
