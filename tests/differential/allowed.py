"""The intended differences between the base and the new version (issue #26), one flag each.

Expected output is the base's own, byte for byte, but where a flag below is
on: then the part of it that the change is meant to alter is computed from
the base's own outputs by the rule written beside the flag (and printed by
the base's own code, ``driver``'s ``render``), never loosened by hand. Turn
a flag on in the change that makes that difference, and only then: with
every flag off, the base against itself must be byte-identical.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from differential.outputs import superseded

__all__ = ["D1", "D2", "D3", "D4", "CLOCK", "Expected", "Outcome", "expectations"]

# D1 (report stalls): a superseded try (its attempt started again with no end
# between: in the base's attempts CSV an `unended` row with no ended_at and a
# later started row of the same run, prompt_id, generation_index and
# attempt) is no longer open, so it is not a stall. Expected report: the
# base's stalls but those; exit status 1 iff a stall is left.
D1 = False
# D2 (watch): watch's stalls and its --once exit status are the new
# report's (with D1, if on); its count of bad lines is the summary's.
D2 = False
# D3 (order): summary and watch list runs in the report's run order.
D3 = False
# D4 (conflicting copies): every version of a seq whose lines differ is
# counted by one rule in every command; a set with such lines may then
# differ anywhere, and is only checked to run and to exit alike (and noted).
D4 = False

# The wall clock watch is run with, in both versions.
CLOCK = 2_000_000_000.0


@dataclass
class Outcome:
    """What one request gave: exit status, standard output and error, files written;
    ``exc`` if the version raised instead."""

    rc: int | None
    out: str
    err: str
    files: dict[str, bytes] = field(default_factory=dict)
    exc: str | None = None


@dataclass
class Expected:
    """What the new version should give for one request, and how it is compared:
    ``exact``; ``watch`` (stalls of equal age in any order, ``outputs.canonical_watch``);
    ``loose`` (only that it ran and exited alike). ``why`` names the differences applied."""

    outcome: Outcome
    mode: str = "exact"
    why: list[str] = field(default_factory=list)


Render = Callable[[dict[str, Any]], dict[str, Any]]


def expectations(
    base: dict[str, Outcome], paths: list[str], conflicts: bool, render: Render
) -> dict[str, Expected]:
    """The expected outcome of every request, from the base's outcomes.

    ``render`` asks the base's driver to print an answer of its own with a
    change applied; ``conflicts`` says the set holds lines of one seq that differ.
    """
    exp = {name: Expected(_copy(o)) for name, o in base.items()}
    if D4 and conflicts:
        for e in exp.values():
            e.mode = "loose"
            e.why.append("D4")
        return exp
    drop: list[list[Any]] = []
    mixed = False
    if D1 and "attempts" in base:
        found, mixed = superseded(base["attempts"].files["a.csv"].decode())
        drop = [list(k) for k, n in found.items() for _ in range(n)]
    report_stalls = _stalls_of(base["report-json"].out)
    if drop:
        for name, via, as_json, stall_after in (
            ("report-json", "cli", True, 1.0),
            ("report", "cli", False, 600.0),
            ("api-health_report", "api", False, 1.0),
        ):
            if name not in exp:
                continue
            got = render(
                {
                    "op": "render",
                    "what": "report",
                    "paths": paths,
                    "stall_after": stall_after,
                    "mixed": mixed,
                    "drop": drop,
                    "via": via,
                    "json": as_json,
                }
            )
            _check(got)
            e = exp[name]
            e.outcome.out = got["out"]
            if via == "cli":
                e.outcome.rc = got["rc"]
            e.why.append("D1")
            if name == "report-json":
                report_stalls = got["stalls"]
    order = None
    if D3:
        order = [r["run_id"] for r in json.loads(base["report-json"].out)["runs"]]
        for name, as_json in (("summary-json", True), ("summary", False)):
            if name in exp:
                got = render(
                    {"op": "render", "what": "summary", "paths": paths, "order": order}
                    | {"json": as_json}
                )
                _check(got)
                exp[name].outcome.out = got["out"]
                exp[name].why.append("D3")
    if (D2 or D3) and "watch" in exp:
        request: dict[str, Any] = {
            "op": "render",
            "what": "watch",
            "paths": paths,
            "stall_after": 1.0,
            "clock": CLOCK,
            "order": order,
        }
        e = exp["watch"]
        if D2:
            # Oldest first, as watch lists them; equal ages in any order (mode "watch").
            request["stalls"] = sorted(report_stalls, key=lambda s: -s[5])
            request["bad_lines"] = json.loads(base["summary-json"].out)["bad_lines"]
            e.mode = "watch"
            e.why.append("D2")
        if D3:
            e.why.append("D3")
        got = render(request)
        _check(got)
        e.outcome.out = got["out"]
        e.outcome.rc = got["rc"]
    return exp


def _copy(o: Outcome) -> Outcome:
    return Outcome(o.rc, o.out, o.err, dict(o.files), o.exc)


def _check(got: dict[str, Any]) -> None:
    if got.get("exc"):
        raise AssertionError(f"the base could not render an expected output:\n{got['exc']}")


def _stalls_of(report_json: str) -> list[list[Any]]:
    """The stalls of a ``report --json``, as ``render`` lists them."""
    try:
        doc = json.loads(report_json)
    except ValueError:
        return []
    return [
        [r["run_id"], s["kind"], s["prompt_id"], s["generation_index"], s["attempt"], s["open_s"]]
        for r in doc.get("runs", [])
        for s in r["stalls"]
    ]
