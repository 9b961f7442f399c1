"""The intended differences between the base and the new version (issues #26, #27), one flag each.

Expected output is the base's own, byte for byte, but where a flag below is
on: then the part of it that the change is meant to alter is computed from
the base's own outputs by the rule written beside the flag (and printed by
the base's own code, ``driver``'s ``render``), never loosened by hand. Turn
a flag on in the change that makes that difference, and only then: with
every flag off, the base against itself must be byte-identical.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from differential.capture import Masks, masks_for, note_line
from differential.outputs import gzip_damaged_files, superseded

__all__ = [
    "D1",
    "D2",
    "D3",
    "D4",
    "D5",
    "D6",
    "CLOCK",
    "AsRead",
    "Expected",
    "Outcome",
    "expectations",
    "masked",
]

# D1 (report stalls): a superseded try (its attempt started again with no end
# between: in the base's attempts CSV an `unended` row with no ended_at and a
# later started row of the same run, prompt_id, generation_index and
# attempt) is no longer open, so it is not a stall. Expected report: the
# base's stalls but those; exit status 1 iff a stall is left.
D1 = True
# D2 (watch): watch agrees with report and summary on what it has read. Both
# versions' watch waits for the rest of a file's unfinished last line (no
# newline: the file may still be written), so what it has read is the set
# "as read" (``harness``: each file up to its last newline; the set itself
# when every file ends in one), and on that set: its stalls and its --once
# exit status are the new report's (with D1, if on: the superseded tries of
# the as-read set's attempts CSV); its count of bad lines is the summary's;
# and each run's last event (its column, idle_s and the sealed/s window,
# which end there) is the report's last_time, the time of its highest seq,
# which the stall ages are measured to. The base's watch measured them, and
# showed its last event, at the latest time of the run's events, which
# differs when its clock stepped back. Its count of gzip files with damaged
# bytes is that of the files the base's validate names gzip damage in (the
# base's watch missed damage at the end of a file), said with no run read as
# it is beside runs (the base said nothing of damage then: the case).
D2 = True
# D3 (order): summary and watch list runs in the report's run order.
D3 = True
# D4 (conflicting copies): every version of a seq whose lines differ is
# counted by one rule in every command; a set with such lines may then
# differ anywhere, and is only checked to run and to exit alike (and noted):
# with the exit status D1 and D2 give, if on.
D4 = True
# D5 (issue #27: the restore cost judged against the capture): a sibling of a
# stopped run is judged by its last try there against the time C the restored
# state was captured, so the class figures (resumed, resumed_s, redone,
# redone_s, lost_s), a try's fate where it may be resumed or redone, the notes
# that follow the classes, and the staleness of runs that trained before any
# weights_synced differ by definition; where a restored run starts a sibling
# whose seal the restored state holds, so do report's tries and the
# timeline's flows. Those parts are left out of both outputs before they are
# compared (``capture``, which also says how each trigger is read off the
# base's own outputs); the rest is compared as before. validate's warning of a
# captured_at after its own line's time, which the base did not give, is left
# out of its output, and its count of warnings lowered to match.
D5 = True
# D6 (issue #30: validate gives a file that is no trace one verdict): a file
# none of whose lines is an event gets one finding, the base's "not a trace"
# one with the first of the base's findings of its lines appended ("; line N:
# reason"), in place of those findings; the verdict counts the findings left,
# and a set with no event at all says so in #30's words ("no line of the M
# file(s) is an event (N line(s))").
D6 = True

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
    ``loose`` (only that it ran and exited alike). ``why`` names the differences applied;
    ``d5`` what D5 leaves out of both outputs (``masked``)."""

    outcome: Outcome
    mode: str = "exact"
    why: list[str] = field(default_factory=list)
    d5: Masks | None = None


Render = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass
class AsRead:
    """The set as ``watch`` has read it (D2), when that is not the set: its paths and
    the base's outcomes of ``report-json``, ``attempts`` and ``summary-json`` on it."""

    paths: list[str]
    base: dict[str, Outcome]


def expectations(
    base: dict[str, Outcome],
    paths: list[str],
    conflicts: bool,
    render: Render,
    as_read: AsRead | None = None,
) -> dict[str, Expected]:
    """The expected outcome of every request, from the base's outcomes.

    ``render`` asks the base's driver to print an answer of its own with a
    change applied; ``conflicts`` says the set holds lines of one seq that differ;
    ``as_read`` is the set as ``watch`` has read it, if it is not the set.
    """
    exp = {name: Expected(_copy(o)) for name, o in base.items()}
    report_json = base["report-json"].out
    drop, mixed = _superseded(base)
    if drop:
        for name, via, as_json, stall_after in (
            ("report-json", "cli", True, 1.0),
            ("report", "cli", False, 600.0),
            ("api-health_report", "api", False, 1.0),
        ):
            if name not in exp:
                continue
            got = _report(render, paths, stall_after, mixed, drop, via, as_json)
            e = exp[name]
            e.outcome.out = got["out"]
            if via == "cli":
                e.outcome.rc = got["rc"]
            e.why.append("D1")
            if name == "report-json":
                report_json = got["out"]
    order = None
    if D3:
        order = [r["run_id"] for r in _runs_of(base["report-json"].out)]
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
        # What watch has read: the set, or the set as read (its report, D1 applied).
        seen, seen_report, seen_summary = base, report_json, base["summary-json"].out
        if as_read is not None:
            seen, seen_summary = as_read.base, as_read.base["summary-json"].out
            seen_report = seen["report-json"].out
            drop, mixed = _superseded(seen)
            if drop:
                seen_report = _report(render, as_read.paths, 1.0, mixed, drop, "cli", True)["out"]
        request: dict[str, Any] = {
            "op": "render",
            "what": "watch",
            "paths": paths,
            "stall_after": 1.0,
            "clock": CLOCK,
            "order": order,
        }
        e = exp["watch"]
        if D3 and D2:
            request["order"] = [r["run_id"] for r in _runs_of(seen_report)]
        if D2:
            # Oldest first, as watch lists them; equal ages in any order (mode "watch").
            request["stalls"] = sorted(_stalls_of(seen_report), key=lambda s: -s[5])
            request["bad_lines"] = json.loads(seen_summary)["bad_lines"]
            request["damaged"] = gzip_damaged_files(base["validate"].out)
            request["last_times"] = {r["run_id"]: r["last_time"] for r in _runs_of(seen_report)}
            e.mode = "watch"
            e.why.append("D2")
        if D3:
            e.why.append("D3")
        got = render(request)
        _check(got)
        if D2:
            got["out"] = _damage_with_no_run(got["out"], request["bad_lines"], request["damaged"])
        e.outcome.out = got["out"]
        e.outcome.rc = got["rc"]
    if D5:
        attempts = base["attempts"].files.get("a.csv", b"") if "attempts" in base else b""
        masks = masks_for(
            _doc(base["cost-json"].out) if "cost-json" in base else None,
            _doc(base["report-json"].out),
            attempts.decode(errors="replace"),
        )
        for name, e in exp.items():
            e.d5 = masks
            if name in _D5_OUT or name in _D5_FILES or name == "watch":
                e.why.append("D5")
    if D6 and "validate" in exp:
        e = exp["validate"]
        out = _one_verdict_per_file(e.outcome.out)
        if out != e.outcome.out:
            e.outcome.out = out
            e.why.append("D6")
    if D4 and conflicts:
        # Exit statuses stay as D1 and D2 have them; the rest may differ.
        for e in exp.values():
            e.mode = "loose"
            e.why.append("D4")
    return exp


# A line of validate's: "FILE[:LINE]: SEVERITY: REASON".
_FINDING = re.compile(r"^(.+?)(?::(\d+))?: (error|warning|note): (.*)$")
_COUNTS = re.compile(r"\d+ error\(s\), \d+ warning\(s\)(, \d+ note\(s\))?$")


def _one_verdict_per_file(out: str) -> str:
    """D6: the base's validate output with each file that is no trace judged once."""
    *findings, verdict = out.rstrip("\n").split("\n")
    parsed = [_FINDING.match(f) for f in findings]
    no_trace = {
        m.group(1)
        for m in parsed
        if m and m.group(2) is None and m.group(4).startswith("not a trace: none of its ")
    }
    if not no_trace:
        return out
    first: dict[str, tuple[str, str]] = {}
    kept: list[tuple[str, str]] = []  # (severity, line)
    for f, m in zip(findings, parsed, strict=True):
        if m is None:
            kept.append(("", f))
        elif m.group(1) in no_trace and m.group(2) is not None:
            first.setdefault(m.group(1), (m.group(2), m.group(4)))
        elif m.group(1) in no_trace and m.group(2) is None and m.group(1) in first:
            line, reason = first[m.group(1)]
            kept.append((m.group(3), f"{f}; line {line}: {reason}"))
        else:
            kept.append((m.group(3), f))
    severities = [sev for sev, _ in kept]
    counts = f"{severities.count('error')} error(s), {severities.count('warning')} warning(s)"
    if severities.count("note"):
        counts += f", {severities.count('note')} note(s)"
    verdict = _COUNTS.sub(counts, verdict)
    verdict = _NO_EVENT_VERDICT.sub(
        r"not a trace: no line of the \2 file(s) is an event (\1 line(s))", verdict
    )
    return "\n".join([*(f for _, f in kept), verdict]) + "\n"


# The base's verdict on a set none of whose lines is an event.
_NO_EVENT_VERDICT = re.compile(
    r"not a trace: not one of the ([\d,]+) lines in ([\d,]+) file\(s\) is an event"
)
_NO_RUN = "no trace event yet"


def _damage_with_no_run(out: str, bad_lines: int, damaged: int) -> str:
    """D2: a watch frame that read no run, saying its damaged gzip files in the
    words the frame uses beside runs (the base's said only its bad lines)."""
    lines = out.rstrip("\n").split("\n")
    if not damaged or _NO_RUN not in lines:
        return out
    said = (
        f"lines that are no trace event: {bad_lines:,}; gzip files with damaged bytes "
        f"(skipped to the next member): {damaged:,}"
    )
    lines[lines.index(_NO_RUN) + 1 :] = [said]
    return "\n".join(lines) + "\n"


# The warning #27 added: a snapshot's captured_at after its own line's time.
_CAPTURE_AFTER = re.compile(r": warning: captured_at \S+ is [\d.]+ s after the event's time ")
_WARNINGS = re.compile(r"(\d+) warning\(s\)")


def _without_capture_warnings(out: str) -> str:
    """D5: validate's output without the warnings of a captured_at after its own
    line (which the base did not check), its count of warnings lowered to match."""
    lines = out.split("\n")
    kept = [line for line in lines if not _CAPTURE_AFTER.search(line)]
    dropped = len(lines) - len(kept)
    if not dropped:
        return out
    verdict = max(i for i, line in enumerate(kept) if _COUNTS.search(line))
    kept[verdict] = _WARNINGS.sub(
        lambda m: f"{int(m.group(1)) - dropped} warning(s)", kept[verdict], count=1
    )
    return "\n".join(kept)


def _doc(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


# Which of D5's masks each request's standard output, and its files, take.
_D5_OUT: dict[str, Callable[[Masks, str], str]] = {
    "cost-json": Masks.cost_json,
    "cost-jobs2-json": Masks.cost_json,
    "cost": Masks.cost_text,
    "api-restore_costs": Masks.stop_costs,
    "api-attempts": Masks.attempts_json,
    "api-timeline_document": Masks.document,
    "report-json": Masks.report_json,
    "api-health_report": Masks.report_json,
    "report": Masks.report_text,
    "watch": Masks.watch,
    "validate": lambda _, out: _without_capture_warnings(out),
}
_D5_FILES: dict[str, Callable[[Masks, bytes], bytes]] = {
    "a.csv": Masks.attempts_csv,
    "t.json": lambda m, data: Masks.document(m, data.decode()).encode(),
}
_D5_COST = ("cost-json", "cost-jobs2-json", "cost")


def masked(exp: Expected, name: str, what: str, value: Any) -> Any:
    """``value`` (a request's ``out``, ``err``, or the bytes of its file ``what``) with
    what D5 leaves out of it taken out; as it is where D5 is off. ``what`` is ``rc``
    for the exit status: None where D5 frees it."""
    m = exp.d5
    if m is None:
        return value
    if what == "rc":
        return None if name in _D5_COST and m.free_rc else value
    if what == "out":
        mask = _D5_OUT.get(name)
        return value if mask is None else mask(m, value)
    if what == "err":
        kept = "\n".join(line for line in value.split("\n") if not note_line(line))
        # The document's size follows its words for what the stops did; the document
        # itself is compared, masked.
        return re.sub(r", [\d,]+ bytes\)", ", <D5> bytes)", kept) if name == "timeline" else kept
    fmask = _D5_FILES.get(what)
    return value if fmask is None else fmask(m, value)


def _superseded(base: dict[str, Outcome]) -> tuple[list[list[Any]], bool]:
    """D1: the stall keys of the superseded tries in the base's attempts CSV, a key
    once per try; and whether its prompt ids are written as JSON text."""
    if not D1 or "attempts" not in base or "a.csv" not in base["attempts"].files:
        return [], False
    found, mixed = superseded(base["attempts"].files["a.csv"].decode())
    return [list(k) for k, n in found.items() for _ in range(n)], mixed


def _report(
    render: Render,
    paths: list[str],
    stall_after: float,
    mixed: bool,
    drop: list[list[Any]],
    via: str,
    as_json: bool,
) -> dict[str, Any]:
    """The base's report (or ``rt.health_report``) with the stalls ``drop`` names left out."""
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
    return got


def _copy(o: Outcome) -> Outcome:
    return Outcome(o.rc, o.out, o.err, dict(o.files), o.exc)


def _check(got: dict[str, Any]) -> None:
    if got.get("exc"):
        raise AssertionError(f"the base could not render an expected output:\n{got['exc']}")


def _runs_of(report_json: str) -> list[dict[str, Any]]:
    """The runs of a ``report --json`` (none when it printed no report: no event read)."""
    try:
        runs: list[dict[str, Any]] = json.loads(report_json)["runs"]
    except (ValueError, KeyError, TypeError):
        return []
    return runs


def _stalls_of(report_json: str) -> list[list[Any]]:
    """The stalls of a ``report --json``, as ``render`` lists them."""
    return [
        [r["run_id"], s["kind"], s["prompt_id"], s["generation_index"], s["attempt"], s["open_s"]]
        for r in _runs_of(report_json)
        for s in r["stalls"]
    ]
