"""One row per attempt across runs: the table behind ``rollout-trace attempts`` and ``rt.attempts``.

Rows come from the ``Timeline`` model (so from events in any order and file
layout), runs in the cost analysis's order, attempts in seq order within a
run. Written as CSV (the standard library) or Parquet (pyarrow, the optional
``parquet`` extra), so that pandas, Polars or DuckDB open it as it is.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from typing import IO, Any, BinaryIO

import msgspec

from .._errors import RolloutTraceError
from .._timeline.lineage import Lineage
from .._timeline.model import Timeline

__all__ = ["AttemptRow", "COLUMNS", "rows_of", "write_csv", "write_parquet"]


class AttemptRow(msgspec.Struct, kw_only=True):
    """One try of a sibling in one run.

    ``started_at`` is its ``attempt_dispatched`` or ``attempt_resumed`` (None
    when that is in an earlier run: an end the restored run reports);
    ``ended_at`` its end (None: open at the run's last event, outcome
    ``unended``). ``trained_step`` is the first ``step_trained`` that trained
    it (``lineage``: its group's latest seal of its sibling, in its run or a
    run restored from it). ``fate`` is what a stop did
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
    # The first step (in run order, then seq order) that trained each try,
    # in its own run or in a run restored from it.
    lineage = Lineage(tl)
    trained: dict[int, int] = {}
    for run in tl.runs:
        for step in lineage.trained(run):
            for a, _ in step.tries:
                trained.setdefault(id(a), step.step)
    for number, run in enumerate(tl.runs, 1):
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
                trained_step=trained.get(id(a)),
                fate=a.fate,
                stop=a.stop,
            )


# The integer columns: int64 in Parquet unless a value does not fit.
_INT_COLUMNS = (
    "pid",
    "prompt_id",
    "generation_index",
    "attempt",
    "weight_version",
    "resumed_turn",
    "trained_step",
)
_INT64 = range(-(1 << 63), 1 << 63)


def _as_text(values: list[Any]) -> list[str | None]:
    return [None if v is None else msgspec.json.encode(v).decode() for v in values]


def _kinds(rows: list[AttemptRow]) -> dict[str, str]:
    """Per column of ints, how it is written: ``int`` (int64), ``str`` (every
    value a str, as it is) or ``json`` (each value's JSON text: ints past int64,
    or ints and strs in one column, such as the prompt ids 7 and "7", which
    are two siblings and must stay apart)."""
    out = {}
    for name in _INT_COLUMNS:
        values = [getattr(r, name) for r in rows]
        if all(v is None or (type(v) is int and v in _INT64) for v in values):
            out[name] = "int"
        elif all(v is None or type(v) is str for v in values):
            out[name] = "str"
        else:
            out[name] = "json"
    return out


def write_csv(rows: Iterator[AttemptRow], out: IO[str]) -> int:
    """Write a header and the rows (None as an empty cell); the rows written.

    A prompt id column that holds both ints and strs is written as each
    one's JSON text (7 and "7" are two siblings), as in Parquet.
    """
    held = list(rows)
    mixed = _kinds(held)["prompt_id"] == "json"
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for row in held:
        values = msgspec.structs.astuple(row)
        if mixed:
            values = tuple(
                msgspec.json.encode(v).decode() if name == "prompt_id" else v
                for name, v in zip(COLUMNS, values, strict=True)
            )
        writer.writerow(["" if v is None else v for v in values])
    return len(held)


# Rows per Parquet row group, built and written at a time.
_GROUP = 65_536


def write_parquet(rows: Iterator[AttemptRow], out: BinaryIO) -> int:
    """Write the rows as Parquet to the binary file ``out``; the rows written.

    Each column of ints is int64 when every value fits, a string column when
    every value is a str, and else a string column of each value's JSON text
    (``_kinds``). Parquet holds one type a column, so the rows are looked at
    first.
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
    kinds = _kinds(held)
    types = {"run": pa.int32(), "stop": pa.int32()}
    for name in ("started_at", "ended_at", "duration_s"):
        types[name] = pa.float64()
    for name, kind in kinds.items():
        types[name] = pa.int64() if kind == "int" else pa.string()
    schema = pa.schema([(name, types.get(name, pa.string())) for name in COLUMNS])
    with pq.ParquetWriter(out, schema) as writer:
        for i in range(0, max(len(held), 1), _GROUP):
            columns: dict[str, list[Any]] = {name: [] for name in COLUMNS}
            for row in held[i : i + _GROUP]:
                for name, value in zip(COLUMNS, msgspec.structs.astuple(row), strict=True):
                    columns[name].append(value)
            for name, kind in kinds.items():
                if kind == "json":
                    columns[name] = _as_text(columns[name])
            writer.write_table(pa.table(columns, schema=schema))
    return len(held)
