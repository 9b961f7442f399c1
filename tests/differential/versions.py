"""The two versions compared, each in a driver process (``driver.py``) of its own.

BASE is the package as of ``BASE_COMMIT``, the commit before the switch to one
model of a trace set (issue #26): ``ROLLOUT_TRACE_BASE`` names a folder that
holds its ``rollout_trace/``, or it is taken out of the repository's history
with ``git archive`` (nothing in the repository changes). NEW is the work
tree's package, or the one under ``ROLLOUT_TRACE_NEW``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

__all__ = ["BASE_COMMIT", "REPO", "Driver", "base_root", "new_root"]

BASE_COMMIT = "91ba414"
REPO = Path(__file__).resolve().parents[2]
_DRIVER = Path(__file__).with_name("driver.py")


def base_root(scratch: Path) -> Path | str:
    """The folder holding the base's ``rollout_trace``, or why there is none."""
    given = os.environ.get("ROLLOUT_TRACE_BASE")
    if given:
        if not (Path(given) / "rollout_trace" / "__init__.py").is_file():
            return f"ROLLOUT_TRACE_BASE={given} holds no rollout_trace/ package"
        return Path(given).resolve()
    try:
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", BASE_COMMIT],
            capture_output=True,
            check=False,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot run git to take out the base commit {BASE_COMMIT}: {exc}"
    if archive.returncode != 0:
        why = archive.stderr.decode(errors="replace").strip()
        return f"git archive {BASE_COMMIT} failed (no history here?): {why}"
    scratch.mkdir(parents=True, exist_ok=True)
    untar = subprocess.run(
        ["tar", "-x", "-C", str(scratch)], input=archive.stdout, capture_output=True, check=False
    )
    if untar.returncode != 0 or not (scratch / "rollout_trace" / "__init__.py").is_file():
        return f"cannot unpack git archive {BASE_COMMIT}: {untar.stderr.decode(errors='replace')}"
    return scratch


def new_root() -> Path | str:
    given = os.environ.get("ROLLOUT_TRACE_NEW")
    root = Path(given).resolve() if given else REPO
    if not (root / "rollout_trace" / "__init__.py").is_file():
        return f"ROLLOUT_TRACE_NEW={given} holds no rollout_trace/ package"
    return root


class DriverDied(RuntimeError):
    pass


class Driver:
    """A driver process running one version; ``send`` and ``receive`` one request at a time
    (send to both versions, then receive from both: they work at once)."""

    def __init__(self, name: str, root: Path, log: Path) -> None:
        self.name = name
        self.root = root
        self.log_path = log
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [env.get("PYTHONPATH", "")])])
        env["PYTHONHASHSEED"] = "0"
        self._log: IO[bytes] = open(log, "ab")  # noqa: SIM115 - held for the process's life
        self.proc = subprocess.Popen(
            [sys.executable, str(_DRIVER), str(root)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=env,
            cwd=str(root),
        )
        hello = self._read()
        if "error" in hello:
            self.close()
            raise DriverDied(f"{name}: {hello['error']}")
        self.hello = hello
        self.version: str = hello["version"]

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=30)
            tail = self.log_path.read_text(errors="replace")[-4000:]
            raise DriverDied(
                f"the {self.name} driver ended (status {self.proc.returncode}); "
                f"its log {self.log_path} ends:\n{tail}"
            )
        answer: dict[str, Any] = json.loads(line)
        return answer

    def send(self, request: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request).encode() + b"\n")
        self.proc.stdin.flush()

    def receive(self) -> dict[str, Any]:
        return self._read()

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        self.send(request)
        return self.receive()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()
