"""``rollout-trace demo``: run a controller, SIGKILL it, restore it, show what the stop cost.

Two controller processes (``child``) write one trace file each. The first
stops at a moment the seed decides, flushes, and is killed for real; the
second starts a simulated outage later, restores the latest snapshot the
first published, and runs to the end. Then ``rollout-trace cost`` and
``rollout-trace timeline`` run over the files written, as a user would run
them, and their output is the demo's.
"""

from __future__ import annotations

import importlib
import json
import os
import queue
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import rollout_trace as rt

from .sim import Scenario

__all__ = ["DemoError", "DemoUsageError", "run_demo"]

# A controller that says nothing for this long (real seconds) is stuck.
SILENCE_S = 120.0
# The files a demo writes in its folder, replaced by the next demo there.
_OWN = (
    "trace-*.jsonl",
    "snapshots/snapshot-t*.json",
    "snapshots/latest.json",
    "snapshots/*.tmp",
    "checkpoints/step-*.json",
    "checkpoints/*.tmp",
    "timeline.html",
    "timeline.json",
)


class DemoError(Exception):
    """The demo could not run to the end (exit status 1)."""


class DemoUsageError(DemoError):
    """A bad option or folder (exit status 2)."""


def say(msg: str) -> None:
    print(f"demo: {msg}", file=sys.stderr, flush=True)


def _python_env() -> dict[str, str]:
    """The environment of a child Python that imports this very rollout_trace."""
    env = dict(os.environ)
    root = str(Path(rt.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    return env


def _run_rollout_trace(*args: str) -> int:
    """Run ``rollout-trace ARGS`` in a child process; pass its output on; its exit status."""
    proc = subprocess.run(
        [sys.executable, "-m", "rollout_trace", *args],
        capture_output=True,
        text=True,
        env=_python_env(),
    )
    sys.stdout.write(proc.stdout)
    sys.stdout.flush()
    sys.stderr.write(proc.stderr)
    sys.stderr.flush()
    return proc.returncode if proc.returncode >= 0 else 128 - proc.returncode


class _ControllerProcess:
    """A controller process; its JSON-line messages come through a reader thread."""

    def __init__(self, name: str, out: Path, args: list[str]) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rollout_trace._demo.child", *args],
            stdout=subprocess.PIPE,
            text=True,
            env=_python_env(),
        )
        self.pid = self.proc.pid
        # The child's trace sink is `trace-{pid}.jsonl` in the folder.
        self.trace = out / f"trace-{self.pid}.jsonl"
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, name=f"demo {name}", daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def messages(self) -> Iterator[dict[str, Any]]:
        while True:
            try:
                line = self._lines.get(timeout=SILENCE_S)
            except queue.Empty:
                raise DemoError(f"{self.name} said nothing for {SILENCE_S:.0f} s") from None
            if line is None:
                return
            try:
                msg = json.loads(line)
            except ValueError:
                sys.stderr.write(line)  # not ours (a library printing): pass it on
                continue
            if isinstance(msg, dict) and "kind" in msg:
                yield msg

    def until(self, kind: str) -> dict[str, Any]:
        """Show progress until the message ``kind``; return it."""
        for msg in self.messages():
            if msg["kind"] == kind:
                return msg
            if msg["kind"] == "progress":
                say(
                    f"{self.name}: sim +{msg['sim']:.0f}s, step {msg['step']}, "
                    f"{msg['events']} events"
                )
        status = self.proc.wait()
        raise DemoError(f"{self.name} ended (exit status {status}) before it said {kind!r}")

    def __enter__(self) -> _ControllerProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        assert self.proc.stdout is not None
        self.proc.stdout.close()


def _check_out(out: Path) -> None:
    if any(c in str(out) for c in "?{}"):
        raise DemoUsageError(
            f"--out {str(out)!r}: give a folder whose path holds no '?', '{{' or '}}'"
        )
    if out.exists() and not out.is_dir():
        raise DemoUsageError(f"--out {str(out)!r} is a file, not a folder")
    traces = list(out.glob("trace-*.jsonl"))
    for trace in traces:
        if not _is_demo_trace(trace):
            raise DemoUsageError(
                f"--out {str(out)!r} holds {trace.name}, which no demo wrote; "
                "pick an empty folder or one an earlier demo used"
            )
    # Only a folder an earlier demo used is cleaned: elsewhere a file with a
    # demo file's name is the user's, and the demo will not overwrite it.
    if not traces:
        clash = [p for pattern in _OWN for p in out.glob(pattern)]
        if clash:
            raise DemoUsageError(
                f"--out {str(out)!r} holds {clash[0].relative_to(out)}, which the demo "
                "would overwrite; pick an empty folder or one an earlier demo used"
            )


def _clean_out(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DemoUsageError(f"--out {str(out)!r}: {exc.strerror}") from exc
    old = [p for pattern in _OWN for p in out.glob(pattern)]
    for p in old:
        p.unlink()
    if old:
        say(f"replacing the {len(old)} files of an earlier demo in {out}")


def _is_demo_trace(path: Path) -> bool:
    try:
        with path.open(encoding="utf-8") as f:
            first = json.loads(f.readline())
    except (OSError, ValueError):
        return False
    meta = first.get("meta") if isinstance(first, dict) else None
    return isinstance(meta, dict) and meta.get("demo") is True


def _start_ray() -> Any:
    try:
        ray: Any = importlib.import_module("ray")
    except ImportError:
        raise DemoUsageError(
            "--ray runs the workers as Ray actors, but Ray is not installed; "
            "install it with: pip install 'rollout-trace[ray]'"
        ) from None
    say("starting a local Ray cluster (takes a few seconds)")
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    except Exception as exc:
        raise DemoError(f"Ray could not start a local cluster: {exc}") from exc
    return ray


def run_demo(out: Path, seed: int, use_ray: bool) -> int:
    """Run the demo into ``out``; return the exit status of its cost report."""
    out = out.resolve()
    _check_out(out)
    ray = _start_ray() if use_ray else None
    try:
        _clean_out(out)
        workers = "Ray actors" if ray else "asyncio tasks"
        say(f"seed {seed}, workers as {workers}, files in {out}")
        common = ["--out", str(out), "--seed", str(seed)]
        if ray is not None:
            common += ["--ray-address", ray.get_runtime_context().gcs_address]
        traces = _run_both(out, common, Scenario.from_seed(seed))
    finally:
        if ray is not None:
            ray.shutdown()
    return _report(out, traces)


def _run_both(out: Path, common: list[str], scenario: Scenario) -> list[Path]:
    with _ControllerProcess("run 1", out, [*common, "--run", "1", "--kill"]) as first:
        say(f"run 1 (pid {first.pid}): controller started")
        stop = first.until("stop")
        say(
            f"run 1: at sim +{stop['sim']:.1f}s, step {stop['step']}, "
            f"{stop['events']} events flushed: sending SIGKILL"
        )
        os.kill(first.pid, signal.SIGKILL)
        status = first.proc.wait()
        if status != -signal.SIGKILL:
            raise DemoError(f"run 1 ended with status {status}, not by the SIGKILL")
        say("run 1: killed")
    start = stop["at"] + scenario.downtime_s
    args = [*common, "--run", "2", "--restore", "--start", repr(start)]
    with _ControllerProcess("run 2", out, args) as second:
        say(f"run 2 (pid {second.pid}): restarted {scenario.downtime_s:.1f}s later (simulated)")
        done = second.until("done")
        status = second.proc.wait()
        if status != 0:
            raise DemoError(f"run 2 ended with status {status}")
        say(f"run 2: done at sim +{done['sim']:.1f}s, step {done['step']}, {done['events']} events")
    return [first.trace, second.trace]


def _report(out: Path, traces: list[Path]) -> int:
    # A reused pid would put both runs in one file: read it once.
    paths = list(dict.fromkeys(str(p) for p in traces))
    print(flush=True)
    status = _run_rollout_trace("cost", *paths)
    pages: list[Path] = []
    for suffix in (".html", ".json"):
        page = out / f"timeline{suffix}"
        if _run_rollout_trace("timeline", *paths, "-o", str(page)) == 0:
            pages.append(page)
        else:
            status = 1
    glob = shlex.quote(str(out)) + "/trace-*.jsonl"
    files = [
        (traces[0].name, "run 1, killed with SIGKILL (no trace_closed)"),
        (traces[1].name, "run 2, restored from the latest snapshot, ran to the end"),
        ("snapshots/", "rollout snapshots (latest.json names the newest)"),
        ("checkpoints/", "trainer checkpoints"),
    ]
    if pages:
        files.append(("timeline.html", "the timeline; timeline.json opens in Perfetto"))
    width = max(len(name) for name, _ in files)
    lines = ["", f"files in {out}:"]
    lines += [f"  {name.ljust(width)}  {what}" for name, what in files]
    lines += [
        "",
        "next:",
        f"  rollout-trace report {glob}      # stalls, staleness, tries, durations",
        f"  rollout-trace attempts {glob} -o attempts.csv   # a row per attempt",
        f"  rollout-trace watch {shlex.quote(str(out))}/     # follows a live run (Ctrl-C)",
        f"  rollout-trace cost {glob} --json",
        f"  rollout-trace summary {glob}",
        f"  rollout-trace validate {glob}",
    ]
    if pages:
        lines.append(f"  open {shlex.quote(str(pages[0]))} in a browser")
    print("\n".join(lines))
    return status
