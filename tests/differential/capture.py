"""D5 (issue #27): what judging a restore against its capture changes, left out of comparisons.

The new version judges each sibling of a stopped run by its last try there,
against the time C the restored state was captured: a sibling resumed from
the captured turns is ``resumed`` (with a new figure, ``resumed_s``) even if
the stopped run sealed it after C, where the base counted it ``redone``;
``lost_s`` adds ``resumed_s``. So these differ by definition, and are taken
out of both outputs before they are compared (everything else stays byte for
byte, or field for field where a layout of columns depends on them):

- the figures ``resumed``, ``resumed_s``, ``redone``, ``redone_s``, ``lost_s``
  and their reasons, the meaning column of the cost table for them and for
  ``restarted`` (reworded), the notes ``resumed_not_in_flight`` and
  ``prompt_id_types`` (their sets of siblings follow the classes), and the
  notes of a capture later than the stop or than the line that published it
  (``captured_after_stop``, ``captured_after_published``: new with C). The
  figures that keep their definition (``in_flight``, ``restarted``,
  ``thrown_away_s``, ``captured_at``, the times and steps) are compared;
- a try's ``fate`` and ``stop`` where either version may mark it ``resumed``
  or ``redone`` (a ``restarted`` try is compared: its class did not change),
  the new ``lost_s`` column, and the timeline's words for a resumed or
  redone try;
- the exit status of ``cost`` when every reason the base gave is on a figure
  above (a seal with no dispatch made the base's ``redone_s`` n/a; the new
  version counts such a sibling nowhere);
- ``watch``'s last-stop line but for its downtime, restore, in flight and
  restarted;
- the lag of a step with no ``weights_synced`` before it (the base's report
  shows that step's ``weight_version`` null): the new version measures it
  from the highest version dispatched before it (in a restored run, at
  least that of the state it restored). So that step's entry and the run's
  staleness figures in the report, its policy-lag counters in the timeline,
  and the set's staleness; the run's other steps are compared;
- where a stop's restored run (or a later one) starts a sibling whose last
  try the stopped run had sealed at or before C, a new use of it begins
  there: ``report``'s tries (every run's and the set's) and the timeline's
  flows (and so its trained slices) may differ; so may the flows where that
  run only ends a try of such a sibling (an abandon whose start it does not
  hold).

The triggers of the last two are read off the base's own outputs (its report
JSON, attempts CSV and cost JSON), never the new version's.
"""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CHANGED", "Masks", "masks_for", "note_line"]

# The figures whose definition changed (resumed_s is new).
CHANGED = frozenset({"resumed", "resumed_s", "redone", "redone_s", "lost_s"})
_REWORDED = CHANGED | {"restarted"}
_NOTE_KINDS = frozenset(
    {"resumed_not_in_flight", "prompt_id_types", "captured_after_stop", "captured_after_published"}
)
# The same notes as text (stderr, report's notes), in either version's words.
_NOTE_TEXT = re.compile(
    r"(^|: )run \S+ resumed \d+ sibling\(s\) that |sibling\(s\) differ only in the JSON type of"
    r"|'s \S+ says was captured at \S+, \S+ s after the (stop|line that published it) "
)
_MASKED = "<D5>"


def note_line(line: str) -> bool:
    """Whether a line of text is one of the notes D5 leaves out (see the module)."""
    return bool(_NOTE_TEXT.search(line))


@dataclass
class Masks:
    """What D5 leaves out of one set's outputs (see the module)."""

    # Run id -> (step, time) of its steps with no version in the base; and by the
    # run's pid in the timeline, those steps' times.
    stale_runs: dict[str, set[tuple[Any, float]]] = field(default_factory=dict)
    stale_pids: dict[int, list[float]] = field(default_factory=dict)
    uses: bool = False  # a new use may begin after a stop: tries and flows differ
    free_rc: bool = False  # cost's exit status may differ

    # --- cost ---------------------------------------------------------------------

    def cost_json(self, text: str) -> str:
        doc = _json(text)
        if not isinstance(doc, dict):
            return text
        doc["stops"] = [_figures(s) for s in doc.get("stops", [])]
        doc["reasons"] = [r for r in doc.get("reasons", []) if r.get("figure") not in CHANGED]
        doc["notes"] = [n for n in doc.get("notes", []) if n.get("kind") not in _NOTE_KINDS]
        return json.dumps(doc, indent=1, sort_keys=True)

    def stop_costs(self, text: str) -> str:
        doc = _json(text)
        if not isinstance(doc, list):
            return text
        return json.dumps([_figures(s) for s in doc], indent=1, sort_keys=True)

    def cost_text(self, text: str) -> str:
        """The cost tables as cells (their widths follow the reworded meanings)."""
        out = []
        for line in text.splitlines():
            if line.strip() and set(line.strip()) <= {"-", " "}:
                continue  # a table's rule: as wide as its columns
            if line.startswith("  ") and line.strip():
                cells = re.split(r"\s{2,}", line.strip())
                if cells[0] in CHANGED:
                    continue
                if cells[0] in _REWORDED:
                    cells = cells[:3]
                line = " | ".join(cells)
            out.append(line)
        return "\n".join(out)

    # --- tries --------------------------------------------------------------------

    def attempts_csv(self, data: bytes) -> bytes:
        rows = list(csv.DictReader(io.StringIO(data.decode())))
        out = io.StringIO()
        for r in rows:
            _fate(r, "")
            r.pop("lost_s", None)
        if rows:
            writer = csv.DictWriter(out, list(rows[0]), lineterminator="\n")
            writer.writeheader()
            writer.writerows(rows)
        return out.getvalue().encode()

    def attempts_json(self, text: str) -> str:
        doc = _json(text)
        if not isinstance(doc, list):
            return text
        for r in doc:
            _fate(r, None)
            r.pop("lost_s", None)
        return json.dumps(doc, indent=1)

    # --- timeline -----------------------------------------------------------------

    def document(self, text: str) -> str:
        doc = _json(text)
        if not isinstance(doc, dict):
            return text
        trained: set[tuple[Any, Any]] = set()
        if self.uses:
            trained = {
                (e.get("pid"), e.get("tid"))
                for e in doc.get("traceEvents", [])
                if e.get("ph") == "M"
                and e.get("name") == "thread_name"
                and str(e.get("args", {}).get("name", "")).startswith("trained")
            }
        events = []
        for e in doc.get("traceEvents", []):
            if self.uses and (e.get("cat") == "trained" or (e.get("pid"), e.get("tid")) in trained):
                continue
            if (
                e.get("ph") == "C"
                and str(e.get("name", "")).startswith("policy lag")
                and any(abs(e["ts"] - t * 1e6) <= 1.0 for t in self.stale_pids.get(e["pid"], []))
            ):
                continue
            if self.uses:
                for key in ("bind_id", "flow_in", "flow_out"):
                    e.pop(key, None)
            args = e.get("args")
            if isinstance(args, dict):
                if e.get("cat") == "attempt":
                    args.pop("redone", None)
                    args.pop("lost_s", None)
                    if str(args.get("after_stop", "")).startswith("resumed"):
                        del args["after_stop"]
                elif e.get("cat") == "stop" and e.get("ph") == "i":
                    e["args"] = _figures(args)
            events.append(e)
        doc["traceEvents"] = events
        other = doc.get("otherData")
        if isinstance(other, dict) and isinstance(other.get("notes"), list):
            other["notes"] = [n for n in other["notes"] if n.get("kind") not in _NOTE_KINDS]
        return json.dumps(doc, indent=0, sort_keys=True)

    # --- report -------------------------------------------------------------------

    def report_json(self, text: str) -> str:
        doc = _json(text)
        if not isinstance(doc, dict):
            return text
        for r in doc.get("runs", []):
            stale = self.stale_runs.get(r.get("run_id"))
            staleness = r.get("staleness")
            if stale and isinstance(staleness, dict):
                steps = [
                    _MASKED if (s.get("step"), s.get("time")) in stale else s
                    for s in staleness.get("steps", [])
                ]
                r["staleness"] = {"steps": steps, "figures": _MASKED}
            if self.uses:
                r["tries"] = _MASKED
        if self.stale_runs:
            doc["staleness"] = _MASKED
        if self.uses:
            doc["tries"] = _MASKED
        doc["notes"] = [n for n in doc.get("notes", []) if not note_line(str(n))]
        return json.dumps(doc, indent=1)

    def report_text(self, text: str) -> str:
        out = []
        block: str | None = None
        for line in text.splitlines():
            head = re.match(r"^run \d+\s+(\S+)", line)
            if head:
                block = head.group(1)
            elif line.startswith("whole set"):
                block = "set"
            stale = block in self.stale_runs or (block == "set" and bool(self.stale_runs))
            if stale and line.startswith("  staleness "):
                line = f"  staleness {_MASKED}"
            if self.uses and line.startswith("  tries "):
                line = f"  tries {_MASKED}"
            out.append(line)
        return "\n".join(out)

    # --- watch --------------------------------------------------------------------

    def watch(self, text: str) -> str:
        """The last-stop line with what keeps its definition: downtime, restore, in
        flight and restarted, in either version's words."""
        out = []
        for line in text.split("\n"):
            m = re.match(
                r"^(last stop: .*in flight (\S+))"
                r"( \(resumed \S+, restarted (\S+)\), lost \S+ s"
                r"|; resumed \S+, restarted (\S+), redone \S+; lost \S+ s)$",
                line,
            )
            if m:
                line = f"{m.group(1)}, restarted {m.group(4) or m.group(5)} {_MASKED}"
            out.append(line)
        return "\n".join(out)


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _figures(stop: dict[str, Any]) -> dict[str, Any]:
    """A stop's figures (a dict) without the changed ones or their reasons."""
    out = {k: v for k, v in stop.items() if k not in CHANGED}
    reasons = out.pop("reasons", None)
    if isinstance(reasons, dict):
        kept = {k: v for k, v in reasons.items() if k not in CHANGED}
        if kept:
            out["reasons"] = kept
    return out


def _fate(row: dict[str, Any], none: Any) -> None:
    """Mask a try's fate and stop where either version may mark it resumed or redone."""
    if row.get("fate") in ("resumed", "redone", none):
        row["fate"] = _MASKED
        row["stop"] = _MASKED


def masks_for(cost_doc: Any, report_doc: Any, attempts: str) -> Masks:
    """The masks of one set, from the base's outputs: ``cost_doc`` its ``cost --json``,
    ``report_doc`` its ``report --json`` and ``attempts`` its attempts CSV (text)."""
    m = Masks()
    if isinstance(report_doc, dict):
        for i, r in enumerate(report_doc.get("runs", [])):
            steps = r.get("staleness", {}).get("steps", [])
            stale = {(s["step"], s["time"]) for s in steps if s.get("weight_version") is None}
            if stale:
                m.stale_runs[r["run_id"]] = stale
                m.stale_pids[i + 1] = [t for _, t in stale]
    stops = cost_doc.get("stops", []) if isinstance(cost_doc, dict) else []
    reasons = {r.get("figure") for r in cost_doc.get("reasons", [])} if stops else set()
    m.free_rc = bool(reasons) and reasons <= CHANGED
    m.uses = _new_use(stops, attempts)
    return m


def _new_use(stops: list[dict[str, Any]], attempts: str) -> bool:
    """Whether a run after a stop has a try of a sibling whose last try the stopped
    run had sealed at or before the capture (rows are in run order, each run's in
    seq order: a run's last started row of a sibling is its last try). A try with
    no start counts too: the timeline's flow goes to a sibling's first try in a
    run, whatever it is."""
    rows = list(csv.DictReader(io.StringIO(attempts))) if attempts else []
    by_run: dict[str, list[dict[str, str]]] = {}
    place: dict[str, int] = {}
    for r in rows:
        by_run.setdefault(r["run_id"], []).append(r)
        place.setdefault(r["run_id"], int(r["run"]))
    for stop in stops:
        a, c = stop.get("stopped_run"), stop.get("captured_at")
        if a is None or c is None or a not in by_run:
            continue
        last: dict[tuple[str, str], dict[str, str]] = {}
        for r in by_run[a]:
            if r["started_at"]:
                last[(r["prompt_id"], r["generation_index"])] = r
        kept = {
            k
            for k, r in last.items()
            if r["outcome"] == "sealed" and r["ended_at"] and float(r["ended_at"]) <= c
        }
        for run_id, mine in by_run.items():
            if place[run_id] <= place[a]:
                continue
            for r in mine:
                if (r["prompt_id"], r["generation_index"]) in kept:
                    return True
    return False
