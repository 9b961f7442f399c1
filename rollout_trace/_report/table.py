"""One row per attempt across runs: the table behind ``rollout-trace attempts`` and ``rt.attempts``.

Rows come from the ``Timeline`` model (so from events in any order and file
layout), runs in the cost analysis's order, attempts in seq order within a
run. Written as CSV (the standard library) or Parquet (pyarrow, the optional
``parquet`` extra), so that pandas, Polars or DuckDB open it as it is.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from typing import IO, Any

import msgspec

from .._errors import RolloutTraceError
from .._timeline.marks import STEP
from .._timeline.model import RunLine, Timeline

__all__ = ["AttemptRow", "COLUMNS", "rows_of", "write_csv", "write_parquet"]


class AttemptRow(msgspec.Struct, kw_only=True):
    """One try of a sibling in one run.

    ``started_at`` is its ``attempt_dispatched`` or ``attempt_resumed`` (None
    when that is in an earlier run: an end the restored run reports);
    ``ended_at`` its end (None: open at the run's last event, outcome
    ``unended``). ``trained_step`` is the first ``step_trained`` of the run
    that names its group (sealed attempts only). ``fate`` is what a stop did
    to it (``resumed``, ``restarted``: its work was thrown away, ``redone``),
    ``stop`` that stop's number (1, 2, ...; 0 for none).
    """

    run: int
    run_id: str
    host: str | None
    pid: int | None
    group_id: str
    prompt_id: int | str
    generation_index: int
    attempt: int
    started_at: float | None
    ended_at: float | None
    duration_s: float | None
    outcome: str
    reason: str | None
    weight_version: int | None
    resumed_turn: int | None
    trained_step: int | None
    fate: str | None
    stop: int


COLUMNS: tuple[str, ...] = AttemptRow.__struct_fields__


def rows_of(tl: Timeline) -> Iterator[AttemptRow]:
    for number, run in enumerate(tl.runs, 1):
        trained = _trained_steps(run)
        for a in run.attempts:
            ended = a.end_seq >= 0
            started = a.started
            yield AttemptRow(
                run=number,
                run_id=run.run_id,
                host=run.host,
                pid=run.pid,
                group_id=a.group_id,
                prompt_id=a.prompt_id,
                generation_index=a.generation_index,
                attempt=a.attempt,
                started_at=a.start if started else None,
                ended_at=a.end if ended else None,
                duration_s=a.end - a.start if started and ended else None,
                outcome=a.outcome,
                reason=a.reason,
                weight_version=a.weight_version,
                resumed_turn=a.resumed_turn,
                trained_step=trained.get(a.group_id) if a.outcome == "sealed" else None,
                fate=a.fate,
                stop=a.stop,
            )


def _trained_steps(run: RunLine) -> dict[str, int]:
    """Group id -> the first step (by seq) of the run that trained it."""
    out: dict[str, int] = {}
    m = run.marks
    for i, code in enumerate(m.codes):
        if code == STEP:
            for gid in m.b[i] or ():
                out.setdefault(gid, m.a[i])
    return out


def write_csv(rows: Iterator[AttemptRow], out: IO[str]) -> int:
    """Write a header and the rows (None as an empty cell); the rows written."""
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    n = 0
    for row in rows:
        writer.writerow(["" if v is None else v for v in msgspec.structs.astuple(row)])
        n += 1
    return n


# Rows per Parquet row group, built and written at a time.
_GROUP = 65_536


def write_parquet(rows: Iterator[AttemptRow], path: str) -> int:
    """Write the rows to a Parquet file; the rows written.

    ``prompt_id`` is an int64 column when every prompt id is an int, a string
    column when every one is a str, and else (both: two siblings apart in
    JSON, 7 and "7") a string column of each one's JSON text, so that they
    stay apart. Parquet holds one type a column, so the rows are looked at first.
    """
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise RolloutTraceError(
            "writing Parquet needs pyarrow: pip install 'rollout-trace[parquet]' "
            "(or write .csv, which needs nothing more)"
        ) from exc
    held = list(rows)
    ints = all(type(r.prompt_id) is int for r in held)
    strs = not ints and all(type(r.prompt_id) is str for r in held)
    schema = pa.schema(
        [
            ("run", pa.int32()),
            ("run_id", pa.string()),
            ("host", pa.string()),
            ("pid", pa.int64()),
            ("group_id", pa.string()),
            ("prompt_id", pa.int64() if ints else pa.string()),
            ("generation_index", pa.int64()),
            ("attempt", pa.int64()),
            ("started_at", pa.float64()),
            ("ended_at", pa.float64()),
            ("duration_s", pa.float64()),
            ("outcome", pa.string()),
            ("reason", pa.string()),
            ("weight_version", pa.int64()),
            ("resumed_turn", pa.int64()),
            ("trained_step", pa.int64()),
            ("fate", pa.string()),
            ("stop", pa.int32()),
        ]
    )
    with pq.ParquetWriter(path, schema) as writer:
        for i in range(0, max(len(held), 1), _GROUP):
            part = held[i : i + _GROUP]
            columns: dict[str, list[Any]] = {name: [] for name in COLUMNS}
            for row in part:
                for name, value in zip(COLUMNS, msgspec.structs.astuple(row), strict=True):
                    columns[name].append(value)
            if not ints and not strs:
                columns["prompt_id"] = [
                    msgspec.json.encode(p).decode() for p in columns["prompt_id"]
                ]
            writer.write_table(pa.table(columns, schema=schema))
    return len(held)
