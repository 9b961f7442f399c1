"""One row per attempt across runs: the table behind ``rollout-trace attempts`` and ``rt.attempts``.

Rows come from the ``Timeline`` model (so from events in any order and file
layout), runs in the cost analysis's order, attempts in seq order within a
run. Written as CSV (the standard library) or Parquet (pyarrow, the optional
``parquet`` extra), so that pandas, Polars or DuckDB open it as it is.
"""

from __future__ import annotations

import csv
import itertools
import operator
from collections.abc import Iterable, Iterator
from typing import IO, Any, BinaryIO

import msgspec

from .._errors import RolloutTraceError
from .._model import terms
from .._model.stops import FIGURES
from .._model.traceset import Model, _host_of
from .._timeline.lineage import Lineage
from .._timeline.model import Timeline, event_fields

__all__ = [
    "AttemptRow",
    "COLUMNS",
    "columns_of",
    "events_table",
    "rows_of",
    "runs_table",
    "steps_table",
    "stops_table",
    "tries_table",
    "write_csv",
    "write_parquet",
]


class AttemptRow(msgspec.Struct, kw_only=True):
    """One try of a sibling in one run.

    ``started_at`` is its ``attempt_dispatched`` or ``attempt_resumed`` (None
    when that is in an earlier run: an end the restored run reports);
    ``ended_at`` its end (None: open at the run's last event, outcome
    ``unended``). ``trained_step`` is the first ``step_trained`` that trained
    it (``lineage``: its group's latest seal of its sibling, in its run or a
    run restored from it). ``fate`` is what a stop did to it, named after the
    figure that counts its sibling (``resumed``, ``restarted``, ``redone``),
    ``stop`` that stop's number (1, 2, ...; 0 for none), and ``lost_s`` the
    seconds of its work that stop lost: for a resumed try its part after the
    capture, for the others all of it up to the stop or its seal (None: no
    fate, or not known, as where the capture time is unknown).
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
    lost_s: float | None


COLUMNS: tuple[str, ...] = AttemptRow.__struct_fields__


def columns_of(tl: Timeline) -> dict[str, list[Any]]:
    """The table of tries as columns, ``COLUMNS`` in order, one value per try: what
    ``rows_of``, the CSV and Arrow tables are made from (in C, no object per try)."""
    # The first step (in run order, then seq order) that trained each try,
    # in its own run or in a run restored from it.
    lineage = Lineage(tl)
    trained: dict[tuple[int, int], int] = {}
    for run in tl.runs:
        for step in lineage.trained(run):
            for r, i, _ in step.tries:
                trained.setdefault((id(r), i), step.step)
    cols: dict[str, list[Any]] = {name: [] for name in COLUMNS}
    for number, run in enumerate(tl.runs, 1):
        t = run.tries
        n = len(t)
        ended = t.ended()
        both = list(map(operator.and_, t.started, ended))
        cols["run"] += [number] * n
        cols["run_id"] += [run.run_id] * n
        cols["host"] += [run.host] * n
        cols["pid"] += [run.pid] * n
        cols["group_id"] += t.group_id
        cols["prompt_id"] += t.prompt_id
        cols["generation_index"] += t.generation_index
        cols["attempt"] += t.attempt
        cols["started_at"] += _where(t.started, t.start)
        cols["ended_at"] += _where(ended, t.end)
        cols["duration_s"] += _where(both, map(operator.sub, t.end, t.start))
        cols["outcome"] += t.outcome
        cols["reason"] += t.reason
        cols["weight_version"] += t.weight_version
        cols["resumed_turn"] += t.resumed_turn
        cols["trained_step"] += map(trained.get, zip(itertools.repeat(id(run)), range(n)))
        cols["fate"] += t.fate
        cols["stop"] += t.stop
        cols["lost_s"] += t.lost_s
    return cols


def rows_of(tl: Timeline) -> Iterator[AttemptRow]:
    """One ``AttemptRow`` per try: runs in the run order, each run's tries in seq order."""
    for values in zip(*columns_of(tl).values(), strict=True):
        yield AttemptRow(**dict(zip(COLUMNS, values, strict=True)))


def _where(flags: Iterable[bool], values: Iterable[Any]) -> Iterator[Any]:
    """Each value where its flag holds, else None (``(None, value)[flag]``, in C)."""
    return map(tuple.__getitem__, zip(itertools.repeat(None), values), flags)


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


def _int_column(pa: Any, cols: dict[str, list[Any]], name: str) -> Any:
    """The Arrow type of a column of ints (``_kind``): int64, or a string column,
    of each value's JSON text (put in ``cols``) where the ints are not all int64
    nor all strs."""
    kind = _kind(cols[name])
    if kind == "json":
        cols[name] = _as_text(cols[name])
    return pa.int64() if kind == "int" else pa.string()


def _kind(values: list[Any]) -> str:
    """How a column of ints is written: ``int`` (int64), ``str`` (every value a
    str, as it is) or ``json`` (each value's JSON text: ints past int64, or ints
    and strs in one column, such as the prompt ids 7 and "7", which are two
    siblings and must stay apart)."""
    if all(v is None or (type(v) is int and v in _INT64) for v in values):
        return "int"
    if all(v is None or type(v) is str for v in values):
        return "str"
    return "json"


def write_csv(columns: dict[str, list[Any]], out: IO[str]) -> int:
    """Write a header and the table's rows (``columns_of``; None as an empty cell);
    the rows written.

    A prompt id column that holds both ints and strs is written as each
    one's JSON text (7 and "7" are two siblings), as in Parquet.
    """
    cols = dict(columns)
    if _kind(cols["prompt_id"]) == "json":
        # Every value's JSON text, a missing one's too ("null").
        cols["prompt_id"] = [msgspec.json.encode(v).decode() for v in cols["prompt_id"]]
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    n = len(cols["run"])
    # A block of rows at a time: the cells of a whole table would be a list a column.
    for start in range(0, n, _ROWS_AT_ONCE):
        block = (c[start : start + _ROWS_AT_ONCE] for c in cols.values())
        writer.writerows(zip(*map(_cells, block), strict=True))
    return n


_ROWS_AT_ONCE = 16_384


def _cells(values: list[Any]) -> list[Any]:
    """A column's CSV cells: None as "", any other value as it is (in C where
    every value can be looked up)."""
    try:
        return list(map(_EMPTY.get, values, values))
    except TypeError:  # a value that cannot be hashed, from events built in Python
        return ["" if v is None else v for v in values]


_EMPTY: dict[Any, Any] = {None: ""}


def _pyarrow() -> Any:
    try:
        import pyarrow as pa
    except ImportError as exc:
        raise RolloutTraceError(
            "Arrow tables and Parquet need pyarrow: pip install 'rollout-trace[parquet]' "
            "(attempts can be written as .csv, which needs nothing more)"
        ) from exc
    return pa


def tries_table(columns: dict[str, list[Any]], open_: list[bool] | None = None) -> Any:
    """The table's columns (``columns_of``) as a ``pyarrow.Table`` of the ``COLUMNS``
    (and ``open``, one flag a row, when given: the try is open at its run's last
    event).

    Each column of ints is int64 when every value fits, a string column when
    every value is a str, and else a string column of each value's JSON text
    (``_kind``): Arrow holds one type a column, so the values are looked at first.
    """
    pa = _pyarrow()
    cols = dict(columns)
    types = {"run": pa.int32(), "stop": pa.int32()}
    for name in ("started_at", "ended_at", "duration_s", "lost_s"):
        types[name] = pa.float64()
    for name in _INT_COLUMNS:
        types[name] = _int_column(pa, cols, name)
    schema = pa.schema([(name, types.get(name, pa.string())) for name in COLUMNS])
    if open_ is not None:
        schema = schema.append(pa.field("open", pa.bool_()))
        cols["open"] = open_
    return pa.table(cols, schema=schema)


def write_parquet(columns: dict[str, list[Any]], out: BinaryIO) -> int:
    """Write the table (``tries_table``) as Parquet to the binary file ``out``; the rows written."""
    table = tries_table(columns)
    import pyarrow.parquet as pq

    pq.write_table(table, out)
    return int(table.num_rows)


# --- the model's other tables, for the user's own questions (``rollout-trace sql``) ------


def events_table(ts: Model) -> Any:
    """Every event of the set, run by run in the run order, each run's in seq order:
    the envelope, the event's name, the fields most queries look at (null where an
    event has none) and ``fields``, the JSON text of all of its fields."""
    pa = _pyarrow()
    names = ("run", "run_id", "seq", "time", "event")
    common = ("group_id", "prompt_id", "generation_index", "attempt", "weight_version", "step")
    text = ("path", "reason")
    cols: dict[str, list[Any]] = {n: [] for n in (*names, *common, *text, "fields")}
    for run in ts.runs:
        ev = run.events
        for i, e in enumerate(ev.events):
            name, keys, values = event_fields(e)
            fields = dict(zip(keys, values, strict=True))
            cols["run"].append(run.index + 1)
            cols["run_id"].append(run.run_id)
            cols["seq"].append(ev.seq[i])
            cols["time"].append(ev.time[i])
            cols["event"].append(name)
            for n in (*common, *text):
                cols[n].append(fields.get(n))
            cols["fields"].append(msgspec.json.encode(fields).decode())
    types: dict[str, Any] = {"run": pa.int32(), "seq": pa.int64(), "time": pa.float64()}
    for n in common:
        types[n] = _int_column(pa, cols, n)
    for n in text:
        cols[n] = [v if v is None or type(v) is str else str(v) for v in cols[n]]
    return pa.table(cols, schema=pa.schema([(n, types.get(n, pa.string())) for n in cols]))


def stops_table(ts: Model) -> Any:
    """One row per stop (``stop``: its number), its runs, path and figures (docs:
    Reference > Restore-cost figures); ``reasons`` the JSON text of why a figure is null."""
    pa = _pyarrow()
    rows = []
    for number, cost in enumerate(ts.stops, 1):
        row: dict[str, Any] = {"stop": number, **cost.to_dict()}
        row["restore_path"] = cost.restore_path
        row["captured_from"] = cost.captured_from
        row["reasons"] = msgspec.json.encode(cost.reasons).decode()
        rows.append(row)
    ints = {"stop", "restored_step", "in_flight", "resumed", "restarted", "redone", "lost_steps"}
    strs = {"stopped_run", "restored_run", "restore_path", "captured_from", "reasons"}
    names = ["stop", "stopped_run", "restored_run", *FIGURES, "restore_path", "captured_from"]
    names.append("reasons")
    schema = pa.schema(
        [
            (n, pa.int64() if n in ints else pa.string() if n in strs else pa.float64())
            for n in names
        ]
    )
    return pa.Table.from_pylist(rows, schema=schema)


def steps_table(ts: Model) -> Any:
    """One row per ``step_trained``: its run, seq, time, step and groups, and
    ``weight_version``, the version it is judged against, as ``report``'s
    staleness judges it (``_model.stops.step_versions``; null: not known)."""
    pa = _pyarrow()
    rows = []
    versions = ts.step_versions
    for run in ts.runs:
        ev = run.events
        judged = versions[run.index]
        for i in ev.where(terms.STEP):
            e = ev.events[i]
            rows.append(
                {
                    "run": run.index + 1,
                    "run_id": run.run_id,
                    "seq": ev.seq[i],
                    "time": ev.time[i],
                    "step": e.step,
                    "groups": [str(g) for g in e.group_ids],
                    "weight_version": judged.get(ev.seq[i]),
                }
            )
    schema = pa.schema(
        [
            ("run", pa.int32()),
            ("run_id", pa.string()),
            ("seq", pa.int64()),
            ("time", pa.float64()),
            ("step", pa.int64()),
            ("groups", pa.list_(pa.string())),
            ("weight_version", pa.int64()),
        ]
    )
    return pa.Table.from_pylist(rows, schema=schema)


def runs_table(ts: Model) -> Any:
    """One row per run, in the run order: its host and pid, first and last event
    times, events, whether it closed cleanly and whether a later run restored from it."""
    pa = _pyarrow()
    stopped = {s.stopped_run for s in ts.stops if s.stopped_run is not None}
    rows = []
    for run in ts.runs:
        ev = run.events
        host, pid = _host_of(run)
        rows.append(
            {
                "run": run.index + 1,
                "run_id": run.run_id,
                "host": host,
                "pid": pid,
                "first_time": ev.min_time,
                "last_time": ev.last_time,
                "events": len(ev),
                "closed": ev.first_of(terms.CLOSED) is not None,
                "stopped": run.run_id in stopped,
                "files": msgspec.json.encode(run.files).decode(),
            }
        )
    schema = pa.schema(
        [
            ("run", pa.int32()),
            ("run_id", pa.string()),
            ("host", pa.string()),
            ("pid", pa.int64()),
            ("first_time", pa.float64()),
            ("last_time", pa.float64()),
            ("events", pa.int64()),
            ("closed", pa.bool_()),
            ("stopped", pa.bool_()),
            ("files", pa.string()),
        ]
    )
    return pa.Table.from_pylist(rows, schema=schema)
