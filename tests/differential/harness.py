"""One case of the differential run: a trace set in every layout, every command, both versions.

``run_case`` writes the set in each layout, asks both drivers the same
requests at once (each writes its files in a fresh folder of its own at the
same relative path, so messages name the same paths), works out what the new
version should give from the base's answers (``allowed``), and returns the
differences. A failing case is kept on disk: the set, each layout, both
versions' outputs and what was expected.
"""

from __future__ import annotations

import difflib
import json
import random
import shutil
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from differential import allowed
from differential.allowed import CLOCK, AsRead, Expected, Outcome
from differential.layouts import LAYOUTS
from differential.outputs import canonical_watch
from differential.sets import AnyEvent, encode, has_conflicts, random_trace_set
from differential.versions import Driver

__all__ = ["Difference", "as_read", "case_set", "requests_for", "run_case"]


def case_set(seed: int) -> list[list[AnyEvent]]:
    """The trace set of case ``seed``."""
    return random_trace_set(random.Random(seed))


# (name, argv before the paths, argv after them, files it writes)
_CLI: list[tuple[str, list[str], list[str], list[str]]] = [
    ("cost-json", ["cost", "--json"], [], []),
    ("cost", ["cost"], [], []),
    ("summary-json", ["summary", "--json"], [], []),
    ("summary", ["summary"], [], []),
    ("validate", ["validate"], [], []),
    ("report-json", ["report", "--json", "--stall-after", "1"], [], []),
    ("report", ["report"], [], []),
    ("attempts", ["attempts"], ["-o", "a.csv"], ["a.csv"]),
    ("timeline", ["timeline"], ["-o", "t.json"], ["t.json"]),
    ("watch", ["watch", "--once", "--stall-after", "1"], [], []),
]
_API = ["restore_costs", "health_report", "attempts", "timeline_document"]


def requests_for(layout: str, paths: list[str]) -> list[tuple[str, dict[str, Any], list[str]]]:
    """Every request of a layout: its name, the request (``cwd`` added later), its files."""
    out: list[tuple[str, dict[str, Any], list[str]]] = []
    cli = list(_CLI)
    if layout == "in_order":
        cli.append(("cost-jobs2-json", ["cost", "--jobs", "2", "--json"], [], []))
    for name, head, tail, files in cli:
        req: dict[str, Any] = {"op": "cli", "argv": [*head, *paths, *tail]}
        if name == "watch":
            req["clock"] = CLOCK
        out.append((name, req, files))
    for call in _API:
        req = {"op": "api", "call": call, "paths": paths, "stall_after": 1.0}
        out.append((f"api-{call}", req, []))
    return out


# What the base is asked of the set as ``watch`` has read it (``allowed.D2``).
_AS_READ = ("report-json", "attempts", "summary-json")


def as_read(paths: list[str], folder: Path) -> list[str] | None:
    """The set as ``watch`` has read it, when that is not the set: each file up to its
    last newline (both versions' watch wait for the rest of an unfinished last line),
    a file that was cut written under ``folder``; None when every file ends whole.

    A gzip file is taken whole: its last member must be whole, or damaged (watch
    says damage as it finds it, and waits for nothing); one that is still to be
    written (a member cut short), where watch would wait, is no layout's.
    """
    out: list[str] = []
    cut = False
    for i, path in enumerate(paths):
        data = Path(path).read_bytes()
        if data[:2] == b"\x1f\x8b":
            _last_member_whole_or_damaged(path, data)
            out.append(path)
            continue
        keep = data[: data.rfind(b"\n") + 1]
        if keep == data:
            out.append(path)
            continue
        cut = True
        folder.mkdir(parents=True, exist_ok=True)
        copy = folder / f"{i}-{Path(path).name}"
        copy.write_bytes(keep)
        out.append(str(copy))
    return out if cut else None


def _last_member_whole_or_damaged(path: str, data: bytes) -> None:
    """Fail unless the gzip file's last member (from the last gzip header that reads
    to the end, or fails to) is whole, its text ending in a newline, or damaged."""
    at = len(data)
    while (at := data.rfind(b"\x1f\x8b\x08", 0, at)) >= 0:
        inflate = zlib.decompressobj(31)
        try:
            text = inflate.decompress(data[at:])
        except zlib.error:
            return  # damaged: said, not waited for
        if inflate.eof and not inflate.unused_data:
            if text and not text.endswith(b"\n"):
                raise AssertionError(f"{path}: a gzip file whose last line has no newline")
            return
        if not inflate.eof:
            raise AssertionError(f"{path}: a gzip file whose last member is not whole")
    raise AssertionError(f"{path}: no gzip member at the end of a gzip file")


@dataclass
class Difference:
    layout: str
    request: str
    what: str  # rc, out, err, a file's name, or exc
    diff: str


def _normalized(text: str, version: str) -> str:
    # The timeline names the version that wrote it; a version bump is no difference.
    return text.replace(f"rollout_trace {version}", "rollout_trace <version>")


def _outcome(answer: dict[str, Any], folder: Path, files: list[str], version: str) -> Outcome:
    written = {}
    for name in files:
        path = folder / name
        if path.exists():
            mark = f"rollout_trace {version}".encode()
            written[name] = path.read_bytes().replace(mark, b"rollout_trace <version>")
    return Outcome(
        rc=answer.get("rc"),
        out=_normalized(answer.get("out", ""), version),
        err=_normalized(answer.get("err", ""), version),
        files=written,
        exc=answer.get("exc"),
    )


def _readable(text: str) -> str:
    """A document on one line (the public calls' JSON) laid out a field a line, to diff."""
    if "\n" in text.strip():
        return text
    try:
        return json.dumps(json.loads(text), indent=1)
    except ValueError:
        return text


def _diff(a: str, b: str, what: str, limit: int = 40, width: int = 200) -> str:
    a, b = _readable(a), _readable(b)
    lines = list(
        difflib.unified_diff(
            a.splitlines(), b.splitlines(), f"expected {what}", f"new {what}", n=2, lineterm=""
        )
    )
    if len(lines) > limit:
        lines = [*lines[:limit], f"... ({len(lines) - limit} more diff lines)"]
    lines = [line if len(line) <= width else line[:width] + " ..." for line in lines]
    return "\n".join(lines)


def _last_line(exc: str | None) -> str | None:
    return exc.strip().splitlines()[-1] if exc else None


def compare(layout: str, name: str, exp: Expected, new: Outcome) -> list[Difference]:
    """How ``new`` differs from what was expected of it."""
    want = exp.outcome
    found: list[Difference] = []

    def differ(what: str, a: str, b: str) -> None:
        found.append(Difference(layout, name, what, _diff(a, b, what)))

    if (want.exc is None) != (new.exc is None) or _last_line(want.exc) != _last_line(new.exc):
        differ("exc", want.exc or "(no exception)", new.exc or "(no exception)")
        return found

    def left(what: str, value: Any) -> Any:
        # What an intended difference leaves out (``allowed.masked``), on both sides.
        return allowed.masked(exp, name, what, value)

    if left("rc", want.rc) != left("rc", new.rc):
        differ("rc", f"exit status {want.rc}", f"exit status {new.rc}")
    if exp.mode == "loose":
        return found
    want_out, new_out = left("out", want.out), left("out", new.out)
    if exp.mode == "watch":
        a = json.dumps(canonical_watch(want_out), indent=1)
        b = json.dumps(canonical_watch(new_out), indent=1)
        if a != b:
            differ("out (stalls of equal age in any order)", a, b)
    elif want_out != new_out:
        differ("out", want_out, new_out)
    if left("err", want.err) != left("err", new.err):
        differ("err", left("err", want.err), left("err", new.err))
    for file in sorted(set(want.files) | set(new.files)):
        a_bytes, b_bytes = want.files.get(file), new.files.get(file)
        if a_bytes is not None and b_bytes is not None:
            a_bytes, b_bytes = left(file, a_bytes), left(file, b_bytes)
        if a_bytes != b_bytes:
            a = "(not written)" if a_bytes is None else a_bytes.decode(errors="replace")
            b = "(not written)" if b_bytes is None else b_bytes.decode(errors="replace")
            differ(file, a, b)
    return found


def run_case(
    seed: int,
    folder: Path,
    base: Driver,
    new: Driver,
    runs: list[list[AnyEvent]] | None = None,
) -> list[Difference]:
    """Every layout of case ``seed`` (or of ``runs``, laid out as that case would be) under
    ``folder``; the differences (none: the folder is removed)."""
    if runs is None:
        runs = case_set(seed)
    conflicts = has_conflicts(runs)
    rng = random.Random(f"layouts-{seed}")
    plans: list[tuple[str, list[str], str, dict[str, Any], list[str]]] = []
    requests: list[dict[str, Any]] = []
    # Asked of the base only: some requests on the set as watch has read it.
    read_plans: list[tuple[str, list[str], str, list[str]]] = []
    read_requests: list[dict[str, Any]] = []
    for layout, write in LAYOUTS.items():
        where = folder / layout
        (where / "trace").mkdir(parents=True)
        paths = write(runs, rng, where / "trace")
        for name, req, files in requests_for(layout, paths):
            plans.append((layout, paths, name, req, files))
            for side in ("base", "new"):
                (where / side / name).mkdir(parents=True)
            # The same relative folder for both versions: the driver adds its side.
            requests.append(req | {"cwd": str(where / "{side}" / name)})
        seen = as_read(paths, where / "as_read")
        if seen is not None:
            for name, req, files in requests_for(layout, seen):
                if name in _AS_READ:
                    (where / "base-as-read" / name).mkdir(parents=True)
                    read_plans.append((layout, seen, name, files))
                    read_requests.append(req | {"cwd": str(where / "base-as-read" / name)})
    base_answers, new_answers, read_answers = _ask_sides(base, new, requests, read_requests)
    seen_by_layout: dict[str, AsRead] = {}
    for (layout, seen, name, files), b in zip(read_plans, read_answers, strict=True):
        got = seen_by_layout.setdefault(layout, AsRead(seen, {}))
        cwd = folder / layout / "base-as-read" / name
        got.base[name] = _outcome(b, cwd, files, base.version)
    differences: list[Difference] = []
    expected_all: dict[str, dict[str, Expected]] = {}
    by_layout: dict[str, dict[str, tuple[Outcome, Outcome]]] = {}
    for (layout, _, name, _, files), b, n in zip(plans, base_answers, new_answers, strict=True):
        cwd_b = folder / layout / "base" / name
        cwd_n = folder / layout / "new" / name
        by_layout.setdefault(layout, {})[name] = (
            _outcome(b, cwd_b, files, base.version),
            _outcome(n, cwd_n, files, new.version),
        )
    for layout, outcomes in by_layout.items():
        paths = next(p for lay, p, *_ in plans if lay == layout)
        base_out = {name: pair[0] for name, pair in outcomes.items()}
        exp = allowed.expectations(base_out, paths, conflicts, base.ask, seen_by_layout.get(layout))
        expected_all[layout] = exp
        for name, (_, new_out) in outcomes.items():
            differences += compare(layout, name, exp[name], new_out)
    if not differences:
        shutil.rmtree(folder)
        return []
    _keep(folder, runs, by_layout, expected_all, differences)
    return differences


Answers = list[dict[str, Any]]


def _ask_sides(
    base: Driver,
    new: Driver,
    requests: list[dict[str, Any]],
    base_only: list[dict[str, Any]],
) -> tuple[Answers, Answers, Answers]:
    """The requests with ``{side}`` in their folder made each driver's own, asked of
    both at once (each driver works while the other does), and ``base_only`` of the
    base: the base's answers, the new version's, and the base's to ``base_only``."""

    def side(name: str) -> list[dict[str, Any]]:
        return [r | {"cwd": r["cwd"].replace("{side}", name)} for r in requests]

    n = len(requests)
    if base is new:
        # One driver (a test of the harness): a second request sent before the first
        # answer is read can fill both pipes and hang.
        first = base.ask({"op": "batch", "requests": side("base") + base_only})["results"]
        second = base.ask({"op": "batch", "requests": side("new")})["results"]
        return first[:n], second, first[n:]
    base.send({"op": "batch", "requests": side("base") + base_only})
    new.send({"op": "batch", "requests": side("new")})
    first = base.receive()["results"]
    return first[:n], new.receive()["results"], first[n:]


def _keep(
    folder: Path,
    runs: list[list[AnyEvent]],
    by_layout: dict[str, dict[str, tuple[Outcome, Outcome]]],
    expected: dict[str, dict[str, Expected]],
    differences: list[Difference],
) -> None:
    """Write what a failing case needs to be looked at: the set, the outputs, the diffs."""
    with open(folder / "set.jsonl", "wb") as f:
        for run in runs:
            for ev in run:
                f.write(encode(ev) + b"\n")
    for layout, outcomes in by_layout.items():
        for name, (b, n) in outcomes.items():
            for side, o in (("base", b), ("new", n), ("expected", expected[layout][name].outcome)):
                where = folder / layout / side / name
                where.mkdir(parents=True, exist_ok=True)
                (where / "stdout.txt").write_text(o.out)
                (where / "stderr.txt").write_text(o.err)
                (where / "status.txt").write_text(f"{o.rc}\n{o.exc or ''}")
                if side == "expected":
                    for file, data in o.files.items():
                        (where / file).write_bytes(data)
    with open(folder / "differences.txt", "w") as f:
        for d in differences:
            f.write(f"== {d.layout} / {d.request} / {d.what}\n{d.diff}\n\n")


def describe(seed: int, folder: Path, differences: list[Difference], shown: int = 3) -> str:
    """The assertion message of a failing case: where it is kept, and the first diffs."""
    which = sorted({(d.layout, d.request) for d in differences})
    head = (
        f"case {seed}: {len(differences)} difference(s) in {len(which)} request(s): "
        + ", ".join(f"{lay}/{req}" for lay, req in which[:12])
        + (" ..." if len(which) > 12 else "")
        + f"\nkept in {folder} (set.jsonl, each layout's trace/, base/, new/, expected/; "
        "differences.txt)"
    )
    body = [f"-- {d.layout} / {d.request} / {d.what}\n{d.diff}" for d in differences[:shown]]
    return "\n".join([head, *body])
