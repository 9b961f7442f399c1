"""One verdict per line, whatever decodes it and whatever lines sit next to it.

A line in a block of good lines is decoded by the block decoder; next to a
bad line, or alone, by ``decode_one``. Both must read a line or skip it alike,
with the same envelope (README: Reference > Wire format).
"""

from __future__ import annotations

import gzip
import tempfile
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from samples import ROLLOUT_SAMPLES
from scenario import lines, make_run

import rollout_trace as rt
from rollout_trace._reading.reader import _Block, _unsplit, iter_blocks
from rollout_trace._schema.decoding import decode_one, decoders
from rollout_trace._schema.events import SinkTally

RUN_ID = "a" * 32
# Good lines around the one under test: enough that its block is decoded whole.
AROUND = 40
_RUN = make_run(
    9, 1_700_000_000.0, [(1_700_000_001.0 + i, ROLLOUT_SAMPLES[i % 16]) for i in range(2 * AROUND)]
)
BEFORE = lines(_RUN[:AROUND])
AFTER = lines(_RUN[AROUND:])

SAMPLES: list[rt.Event] = [
    *ROLLOUT_SAMPLES,
    rt.TraceOpened(sdk_version="1.0", pid=7, host="h", meta={"a": [1, 2]}),
    rt.TraceClosed(
        emitted=3, written=2, dropped=1, invalid=0, sinks=[SinkTally(uri="x", written=2)]
    ),
]


def _fields(i: int) -> dict[str, Any]:
    ev = msgspec.structs.replace(SAMPLES[i], time=1_700_000_000.5, run_id=RUN_ID, seq=7)
    fields: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(ev))
    return fields


Verdict = tuple[str, float, str, int] | None


def _tag(ev: object) -> str:
    if isinstance(ev, rt.UnknownEvent):
        return ev.event
    tag = type(ev).__struct_config__.tag  # type: ignore[attr-defined]
    assert isinstance(tag, str)
    return tag


def _verdict(ev: Any) -> Verdict:
    return None if ev is None else (_tag(ev), ev.time, ev.run_id, ev.seq)


def _verdicts(folder: Path, raw: bytes) -> dict[str, Verdict]:
    """What each decoder makes of ``raw``: its tag and envelope, or None if skipped."""
    path = folder / "t.jsonl"
    path.write_bytes(BEFORE + raw + b"\n" + AFTER)
    out: dict[str, Verdict] = {"decode_one": _verdict(decode_one(raw)[0])}
    found: Verdict = None
    for _, events, numbers in iter_blocks(path, []):
        for number, ev in zip(numbers, events, strict=True):
            if number == AROUND + 1:
                found = _verdict(ev)
    out["block"] = found
    return out


def _line(fields: dict[str, Any]) -> bytes:
    return msgspec.json.encode(fields)


def _edit(i: int, **changes: Any) -> bytes:
    fields = _fields(i)
    for key, value in changes.items():
        if value is _DROP:
            del fields[key]
        else:
            fields[key] = value
    return _line(fields)


_DROP = object()
ABANDONED = next(i for i, e in enumerate(SAMPLES) if isinstance(e, rt.AttemptAbandoned))
OPENED = next(i for i, e in enumerate(SAMPLES) if isinstance(e, rt.TraceOpened))
CLOSED = next(i for i, e in enumerate(SAMPLES) if isinstance(e, rt.TraceClosed))
RESERVED = next(i for i, e in enumerate(SAMPLES) if isinstance(e, rt.GroupReserved))
STEP = next(i for i, e in enumerate(SAMPLES) if isinstance(e, rt.StepTrained))


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        # An abandon reason that is not one of the five.
        (_edit(ABANDONED, reason="oops"), "Invalid enum value 'oops'"),
        # A required field left out.
        (_edit(ABANDONED, group_id=_DROP), "missing required field `group_id`"),
        # A negative seq: the block refused it and decode_one took it.
        (_edit(ABANDONED, seq=-5), "seq -5 is negative"),
        # A time that is not after 1970.
        (_edit(ABANDONED, time=0), "time 0.0 is not a positive"),
        (_edit(ABANDONED, time=-1.5), "time -1.5 is not a positive"),
        # An empty run id, and none at all.
        (_edit(ABANDONED, run_id=""), "run_id is empty"),
        (_edit(ABANDONED, run_id=_DROP), "missing required field `run_id`"),
        # An unknown event is kept, but not with a bad envelope.
        (_line({"event": "mine", "time": 1.0, "run_id": RUN_ID, "seq": -1}), "seq -1"),
        # A lifecycle event without a field; a field of the wrong type.
        (_edit(OPENED, sdk_version=_DROP), "missing required field `sdk_version`"),
        (_edit(RESERVED, target_step="x"), "Expected `int | null`, got `str`"),
        (_edit(STEP, group_ids=[1]), "Expected `str`, got `int`"),
        (_edit(CLOSED, sinks=[{"uri": 1, "written": 0}]), "Expected `str`, got `int`"),
    ],
)
def test_a_bad_line_is_skipped_by_every_decoder(tmp_path: Path, raw: bytes, reason: str) -> None:
    assert _verdicts(tmp_path, raw) == {"decode_one": None, "block": None}
    why = decode_one(raw)[1]
    assert why is not None and reason in why


@pytest.mark.parametrize("i", range(len(SAMPLES)))
def test_every_sample_is_read_by_every_decoder(tmp_path: Path, i: int) -> None:
    raw = _line(_fields(i))
    expected = (_tag(SAMPLES[i]), 1_700_000_000.5, RUN_ID, 7)
    assert set(_verdicts(tmp_path, raw).values()) == {expected}


_VALUES = st.sampled_from(
    [None, True, -5, -1, 0, 1, 2**70, 0.0, -0.5, 1.5, "", "oops", "dropped", [], ["g"], [1], {}]
)
_KEYS = st.sampled_from(
    [
        "event",
        "time",
        "run_id",
        "seq",
        "group_id",
        "prompt_id",
        "generation_index",
        "attempt",
        "reason",
        "turn",
        "step",
        "group_ids",
        "path",
        "captured_at",
        "weight_version",
        "size",
        "target_step",
        "unfinished_groups",
        "sdk_version",
        "pid",
        "host",
        "meta",
        "schema",
        "emitted",
        "sinks",
        "extra",
    ]
)
_TAGS = st.sampled_from([*rt.event_types(), "mine", ""])
_EDIT = st.one_of(
    st.tuples(st.just("drop"), _KEYS, st.none()),
    st.tuples(st.just("set"), _KEYS, _VALUES),
    st.tuples(st.just("set"), st.just("event"), _TAGS),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(i=st.integers(0, len(SAMPLES) - 1), edits=st.lists(_EDIT, max_size=3))
def test_any_line_gets_one_verdict(i: int, edits: list[tuple[str, str, Any]]) -> None:
    fields = _fields(i)
    for what, key, value in edits:
        if what == "drop":
            fields.pop(key, None)
        else:
            fields[key] = value
    with tempfile.TemporaryDirectory() as folder:
        verdicts = _verdicts(Path(folder), _line(fields))
    assert len(set(verdicts.values())) == 1, verdicts


# `{A},{B` and its rest on the next line: neither is JSON, but a block decoder
# that takes the line ends for separators reads two whole objects, as many as
# the lines. Joined by commas (the review's case) or by the newline alone.
_B = _line(_fields(STEP))
_CUT = _B.index(b',"g2"')


def _split(glue: bytes, comma_joins: bool) -> list[bytes]:
    return [_line(_fields(RESERVED)) + glue + _B[:_CUT], _B[_CUT + comma_joins :]]


SPLIT = _split(b",", comma_joins=True)
SIDE = _split(b" ", comma_joins=False)
TWO_SINKS = _edit(CLOSED, sinks=[{"uri": "a", "written": 1}, {"uri": "b", "written": 2}])
DISCARDED = next(i for i, e in enumerate(SAMPLES) if isinstance(e, rt.GroupDiscarded))
BRACES = _edit(DISCARDED, reason="a},{b} {c}{d")


def _file(*parts: bytes | list[bytes]) -> bytes:
    return b"".join(p if isinstance(p, bytes) else b"".join(x + b"\n" for x in p) for p in parts)


@pytest.mark.parametrize(
    ("data", "skipped"),
    [
        # Among good lines only: the block decoder took the two for two events.
        (_file(BEFORE, SPLIT, AFTER), [AROUND + 1, AROUND + 2]),
        # The same with JSON whitespace around the comma inside the line.
        (_file(BEFORE, _split(b" ,\t", comma_joins=True), AFTER), [AROUND + 1, AROUND + 2]),
        # Objects side by side, the newline between the two lines their comma.
        (_file(BEFORE, SIDE, AFTER), [AROUND + 1, AROUND + 2]),
        (_file(BEFORE, _split(b"", comma_joins=False), AFTER), [AROUND + 1, AROUND + 2]),
        # A bad line far off in the same block: the half holding the two is
        # still longer than a block is split down to.
        (_file(BEFORE, SPLIT, AFTER, [b"garbage"]), [AROUND + 1, AROUND + 2, len(_RUN) + 3]),
        (_file(BEFORE, SIDE, AFTER, [b"garbage"]), [AROUND + 1, AROUND + 2, len(_RUN) + 3]),
        # A bad line right after them.
        (_file(BEFORE, SPLIT, [b"garbage"], AFTER), [AROUND + 1, AROUND + 2, AROUND + 3]),
        # A bad line before them, in the half that does not hold them.
        (_file([b"garbage"], BEFORE, SPLIT, AFTER), [1, AROUND + 2, AROUND + 3]),
        # Two objects on one line, alone and as the file's first line.
        (_file(BEFORE, [_line(_fields(RESERVED)) + b"," + _B], AFTER), [AROUND + 1]),
        (_file(BEFORE, [_line(_fields(RESERVED)) + b" " + _B], AFTER), [AROUND + 1]),
        (_file([_line(_fields(RESERVED)) + b"," + _B], BEFORE, AFTER), [1]),
        # Not every `},{` or `}{` splits a line: in a list or a string, it is read.
        (_file(BEFORE, [TWO_SINKS, BRACES], AFTER), []),
        (_file(BEFORE, [TWO_SINKS, BRACES + b"\r"], AFTER), []),
    ],
)
@pytest.mark.parametrize("gz", [False, True], ids=["jsonl", "gzip"])
def test_a_line_that_is_not_one_object_is_skipped_whatever_its_neighbours(
    tmp_path: Path, data: bytes, skipped: list[int], gz: bool
) -> None:
    path = tmp_path / ("t.jsonl.gz" if gz else "t.jsonl")
    path.write_bytes(gzip.compress(data) if gz else data)
    problems: list[rt.ReadProblem] = []
    read = [n for _, _, numbers in iter_blocks(path, problems) for n in numbers]
    assert [p.line for p in problems] == skipped
    assert read == [n for n in range(1, data.count(b"\n") + 1) if n not in skipped]


def _tag_last(line: bytes) -> bytes:
    """``line`` with its tag moved to the end, as a writer other than the tracer may put it."""
    fields = msgspec.json.decode(line)
    tag = fields.pop("event")
    return _line({**fields, "event": tag})


_FIRST = [_line(_fields(i)) for i in range(len(SAMPLES))]
_LAST = [_tag_last(x) for x in _FIRST]


@pytest.mark.parametrize(
    ("block", "whole"),
    [
        # Lines as the tracer writes them: `_NEXT_EVENT` at every newline.
        (_FIRST, True),
        # Their tag last: `_NEXT_EVENT` at no newline, `}\n{` at every one.
        (_LAST, True),
        # Some of each: `_NEXT_EVENT` at some newlines, `}\n{` at every one.
        (_FIRST + _LAST + _FIRST, True),
        # A line that begins with a space: neither at its newline, and no
        # `}{` in any line (`_SEPARATOR`).
        ([*_FIRST, b" " + _FIRST[0], *_FIRST], True),
        # `}{` in a string: not at a newline, and the line alone is one value.
        ([*_FIRST, BRACES, *_FIRST], True),
        ([*_LAST, _tag_last(BRACES), *_LAST], True),
        # Two lines that decode as two events but are not (`{A} {B`, then the
        # rest of B), among lines with their tag first and last.
        ([*_FIRST, *SIDE, *_FIRST], False),
        ([*_LAST, *SIDE, *_LAST], False),
        # The same, glued with no space between: `}{`.
        ([*_FIRST, *_split(b"", comma_joins=False), *_FIRST], False),
        ([*_LAST, *_split(b"", comma_joins=False), *_LAST], False),
    ],
)
def test_a_block_is_read_whole_only_when_each_line_is_one_event(
    block: list[bytes], whole: bool
) -> None:
    # What follows the block's last newline (a line under way) is not looked at.
    text = b"\n".join(block) + b"\n" + b"}{ not yet a line"
    end = text.rfind(b"\n")
    # `_unsplit` is asked of a block that gave as many events as lines.
    assert len(decoders()[0].decode_lines(text[:end])) == len(block)
    assert _unsplit(text, end, len(block)) == whole


def _alone(raw: bytes) -> bool:
    """Whether ``raw`` is read as a line on its own (a file of just that line)."""
    block = _Block("t.jsonl", None, (decoders()[0], True))
    block.line(raw, 1, torn=False)
    return bool(block.events)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    picks=st.lists(st.integers(0, len(SAMPLES) - 1), min_size=AROUND, max_size=2 * AROUND),
    glued=st.integers(0, 2 * AROUND),
    glue=st.sampled_from([b",", b" ", b"", b" , ", b"\t"]),
    split=st.integers(0, 2 * AROUND),
    at=st.integers(0, 1 << 16),
    drop_comma=st.booleans(),
)
def test_two_objects_on_a_line_and_one_over_two_lines_get_their_own_verdicts(
    picks: list[int],
    glued: int,
    glue: bytes,
    split: int,
    at: int,
    drop_comma: bool,
) -> None:
    # One line holding two events and, anywhere in the block, an event broken
    # over two lines at a place JSON allows whitespace: as many events as lines.
    events = [_line(_fields(i)) for i in picks]
    glued %= len(events) - 1
    events[glued : glued + 2] = [events[glued] + glue + events[glued + 1]]
    split %= len(events)
    line = events[split]
    places = [i for i in range(1, len(line) - 1) if line[i] in b",:[{"]
    cut = places[at % len(places)]
    if drop_comma and line[cut] == ord(","):
        events[split] = line[:cut] + b"\n" + line[cut + 1 :]
    else:
        events[split] = line[: cut + 1] + b"\n" + line[cut + 1 :]
    text = b"\n".join(events) + b"\n"
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "t.jsonl"
        path.write_bytes(text)
        read = {n for _, _, numbers in iter_blocks(path, []) for n in numbers}
    alone = {n for n, raw in enumerate(text.split(b"\n")[:-1], 1) if _alone(raw)}
    assert read == alone
