"""Reading the commands' outputs back: the attempts CSV and a ``watch --once`` frame.

The intended differences (``allowed``) and the agreement checks
(``analysis/test_agreement``) are computed from what the commands print, so
that they hold for any version that prints the same.
"""

from __future__ import annotations

import csv
import io
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "StallKey",
    "WatchFrame",
    "attempt_rows",
    "canonical_watch",
    "gzip_damaged_files",
    "is_mixed",
    "open_rows",
    "parse_table",
    "parse_watch",
    "superseded",
    "superseded_rows",
]

# (run_id, prompt_id as the CSV writes it, generation_index, attempt, started_at)
StallKey = tuple[str, str, int, int, float]


def attempt_rows(text: str) -> list[dict[str, str]]:
    """The rows of an attempts CSV, each by column name."""
    return list(csv.DictReader(io.StringIO(text)))


def is_mixed(rows: list[dict[str, str]]) -> bool:
    """Whether the prompt_id column holds ints and strs, each then written as its JSON text."""
    return any(r["prompt_id"].startswith('"') for r in rows)


def _sibling_try(r: dict[str, str]) -> tuple[str, str, str, str]:
    return (r["run_id"], r["prompt_id"], r["generation_index"], r["attempt"])


def superseded_rows(rows: list[dict[str, str]]) -> list[int]:
    """The rows of superseded tries: started, ``unended`` with no ``ended_at``, and
    followed by a later started row of the same run and attempt of the sibling.

    Rows are in seq order within a run (the command's documented order), so a
    later row is a later start whatever the clock read; its start time may be
    earlier when the clock stepped back.
    """
    out = []
    started_later: set[tuple[str, str, str, str]] = set()
    for i in range(len(rows) - 1, -1, -1):
        r = rows[i]
        key = _sibling_try(r)
        if r["started_at"] == "":
            continue
        if r["outcome"] == "unended" and r["ended_at"] == "" and key in started_later:
            out.append(i)
        started_later.add(key)
    return out[::-1]


def superseded(text: str) -> tuple[Counter[StallKey], bool]:
    """The superseded tries of an attempts CSV, by stall key; and whether its prompt ids
    are written as JSON text."""
    rows = attempt_rows(text)
    found: Counter[StallKey] = Counter()
    for i in superseded_rows(rows):
        r = rows[i]
        g, a, started = int(r["generation_index"]), int(r["attempt"]), float(r["started_at"])
        found[r["run_id"], r["prompt_id"], g, a, started] += 1
    return found, is_mixed(rows)


def open_rows(rows: list[dict[str, str]]) -> list[int]:
    """The rows of tries open at their run's last event: started, not ended, not superseded.

    A table with an ``end`` column says so itself (``open``).
    """
    if rows and "end" in rows[0]:
        return [i for i, r in enumerate(rows) if r["end"] == "open"]
    gone = set(superseded_rows(rows))
    return [
        i
        for i, r in enumerate(rows)
        if r["outcome"] == "unended" and r["ended_at"] == "" and r["started_at"] != ""
        if i not in gone
    ]


# Gzip damage as ``validate`` says it (the reader's words for bytes it cannot inflate
# and skips): a bad line, not torn.
_GZIP_DAMAGE = re.compile(
    r"^(?P<file>.*):\d+: error: (corrupt gzip data in bytes |bytes [\d,]+-[\d,]+ are not gzip data)"
)


def gzip_damaged_files(validate_out: str) -> int:
    """How many files a ``validate`` output names gzip damage in."""
    found = {m["file"] for line in validate_out.splitlines() if (m := _GZIP_DAMAGE.match(line))}
    return len(found)


# --- text tables -------------------------------------------------------------------

_RULE = re.compile(r"^ *-+( +-+)*$")


def parse_table(lines: list[str], at: int) -> tuple[list[dict[str, str]], int]:
    """The rows of the table whose rule line is ``lines[at]`` (its header the line before),
    each by header; and the index of the first line after it.

    Columns are where the rule's dashes are, so a cell may hold single spaces.
    """
    spans = [m.span() for m in re.finditer(r"-+", lines[at])]
    header = lines[at - 1]
    names = [header[a:b].strip() for a, b in spans]
    rows = []
    i = at + 1
    while i < len(lines) and lines[i].strip() and not lines[i].strip().startswith("..."):
        line = lines[i]
        if len(line) - len(line.lstrip()) < spans[0][0]:
            break  # less indented: not a row of this table
        rows.append({n: line[a:b].strip() for n, (a, b) in zip(names, spans, strict=True)})
        i += 1
    return rows, i


@dataclass
class WatchFrame:
    """A ``watch --once`` frame, read back."""

    header: str
    runs: list[dict[str, str]] = field(default_factory=list)
    stall_count: int = 0
    stall_line: str = ""
    stalls: list[dict[str, str]] = field(default_factory=list)
    rest: list[str] = field(default_factory=list)  # the lines after the stalls

    def run_ids(self) -> dict[str, str]:
        """Run number (as shown) -> the run id's first 8 characters."""
        return {r["run"]: r["run_id"] for r in self.runs}


def parse_watch(text: str) -> WatchFrame:
    lines = text.rstrip("\n").split("\n")
    frame = WatchFrame(header=lines[0] if lines else "")
    rules = [i for i, line in enumerate(lines) if _RULE.match(line) and i > 0]
    if not rules:
        frame.rest = lines[1:]
        return frame
    frame.runs, i = parse_table(lines, rules[0])
    while i < len(lines) and not lines[i].startswith("stalls:"):
        i += 1
    if i == len(lines):
        return frame
    frame.stall_line = lines[i]
    m = re.match(r"stalls: ([\d,]+)", lines[i])
    frame.stall_count = int(m.group(1).replace(",", "")) if m else 0
    i += 1
    if frame.stall_count:
        frame.stalls, i = parse_table(lines, i + 1)
        if i < len(lines) and lines[i].strip().startswith("..."):
            i += 1
    frame.rest = lines[i:]
    return frame


def _open_s(row: dict[str, str]) -> float:
    return float(row["open_s"].replace(",", ""))


def canonical_watch(text: str) -> dict[str, Any]:
    """A frame with what an order of equal things may change taken out: the stalls sorted,
    and of those with the least age shown, only how many (the list shows the oldest ten,
    and which of equally old ones make the cut is not fixed)."""
    frame = parse_watch(text)
    rows = sorted(
        (tuple(sorted(r.items())) for r in frame.stalls),
        key=lambda r: (-_open_s(dict(r)), r),
    )
    shown: list[Any] = list(rows)
    if rows and frame.stall_count > len(rows):
        least = _open_s(dict(rows[-1]))
        shown = [r for r in rows if _open_s(dict(r)) > least]
        shown.append(("tied at", least, len(rows) - len(shown)))
    return {
        "header": frame.header,
        "runs": frame.runs,
        "stall_line": frame.stall_line,
        "stalls": shown,
        "rest": frame.rest,
    }
