"""``rt.analyze`` and its ``TraceSet``, with ``rt.health_report`` and ``rt.attempts``:
the commands in Python, each a function of the one model."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .._model import traceset
from .._model.traceset import Source
from .._reading.reader import Problems, ReadProblem
from .._timeline.document import document_of
from .._timeline.merge import load_foreign
from .._timeline.model import Timeline, timeline_of
from .._timeline.page import html_of
from . import table
from .health import DEFAULT_STALL_AFTER, HealthReport, report_of
from .table import AttemptRow, rows_of

__all__ = ["TraceSet", "analyze", "attempts", "health_report"]


class TraceSet(traceset.Model):
    """One trace set after analysis, and what every command shows of it.

    ``runs`` are in the run order; ``stops`` their stops with their figures;
    ``notes`` what bears on the figures; ``problems`` the lines the reader
    skipped; ``tries`` one row per try. The methods below are what the
    commands print, computed from this one model.
    """

    def timeline(self) -> Timeline:
        """The runs, tries and marks the timeline commands draw."""
        return timeline_of(self)

    def health(self, stall_after: float = DEFAULT_STALL_AFTER) -> HealthReport:
        """What ``rollout-trace report --stall-after STALL_AFTER`` reports."""
        return report_of(self.timeline(), stall_after, len(self.problems))

    def attempts(self) -> list[AttemptRow]:
        """One row per try, as ``rollout-trace attempts`` writes them."""
        return list(rows_of(self.timeline()))

    def timeline_document(self, merge: Iterable[str] = ()) -> dict[str, Any]:
        """The Chrome trace-event document ``rollout-trace timeline -o x.json`` writes;
        ``merge``: paths of other trace-event documents (``ray timeline``'s) drawn in."""
        return document_of(self.timeline(), [load_foreign(p) for p in merge])

    def timeline_html(self, title: str = "rollout_trace timeline") -> str:
        """The self-contained HTML page ``rollout-trace timeline`` writes."""
        return html_of(self.timeline(), title=title)

    def to_arrow(self, name: str) -> Any:
        """One of the model's tables as a ``pyarrow.Table`` (pandas, Polars and DuckDB
        read it without a copy): ``events``, ``tries``, ``stops``, ``steps`` or ``runs``
        (the views of ``rollout-trace sql``). Needs pyarrow (the ``parquet`` extra)."""
        if name == "tries":
            tl = self.timeline()
            flags: list[bool] = []
            for r in tl.runs:
                run_flags = [False] * len(r.tries)
                for i in r.tries.open_indices():
                    run_flags[i] = True
                flags += run_flags
            return table.tries_table(table.columns_of(tl), flags)
        makers = {
            "events": table.events_table,
            "stops": table.stops_table,
            "steps": table.steps_table,
            "runs": table.runs_table,
        }
        if name not in makers:
            raise ValueError(
                f"no table {name!r}: the tables are events, tries, stops, steps and runs"
            )
        return makers[name](self)


def analyze(source: traceset.Source, problems: Problems = None) -> TraceSet:
    """The model of a trace set: trace files (paths, globs, folders) or events.

    Events may come in any order of runs and lines; lines read twice count
    once, and lines of one seq that differ are all kept and noted.
    ``problems`` takes the lines the reader skips (default: a list kept on
    the set).
    """
    return traceset.analyze(source, problems, TraceSet)


def health_report(source: Source, *, stall_after: float = DEFAULT_STALL_AFTER) -> HealthReport:
    """What ``rollout-trace report`` reports, for trace files (paths, globs,
    folders) or events: per run and for the set, attempts by outcome, tries per
    sibling, durations, stalls, staleness, intervals and sealed attempts per
    second; the lines that are no event are counted in ``bad_lines``, and what
    the reading noted is in ``notes``. Any order of files and lines gives the
    same report."""
    problems: list[ReadProblem] = []
    tl = _timeline(source, problems)
    return report_of(tl, stall_after, len(problems))


def attempts(source: Source) -> list[AttemptRow]:
    """One ``AttemptRow`` per attempt across runs (``rollout-trace attempts``), for
    trace files (paths, globs, folders) or events; for pandas,
    ``pd.DataFrame(msgspec.structs.asdict(r) for r in rows)``."""
    return list(rows_of(_timeline(source, [])))


def _timeline(source: Source, problems: list[ReadProblem]) -> Timeline:
    # Read as the commands read it: a note names the files it is about.
    return timeline_of(traceset.analyze(source, problems))
