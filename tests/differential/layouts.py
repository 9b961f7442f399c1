"""The ways one trace set is laid out in files: each writes into a folder, returns the paths.

Every layout holds the same trace set, so each command must answer the same
in all of them (but for the bad line of ``torn``, the copies of
``read_twice`` and the lines ``gzip_damaged`` loses); the differential test
runs each version on each.
"""

from __future__ import annotations

import gzip
import random
from collections.abc import Callable
from pathlib import Path

from differential.sets import AnyEvent, encode

__all__ = ["LAYOUTS", "Layout"]

Layout = Callable[[list[list[AnyEvent]], random.Random, Path], list[str]]


def _lines(run: list[AnyEvent]) -> list[bytes]:
    return [encode(ev) + b"\n" for ev in run]


def _write(path: Path, lines: list[bytes]) -> str:
    path.write_bytes(b"".join(lines))
    return str(path)


def in_order(runs: list[list[AnyEvent]], rng: random.Random, folder: Path) -> list[str]:
    """One file per run, as one file sink per process writes them."""
    return [_write(folder / f"run-{i}.jsonl", _lines(r)) for i, r in enumerate(runs)]


def interleaved(runs: list[list[AnyEvent]], rng: random.Random, folder: Path) -> list[str]:
    """Every run in one file, merged at random, each run's own lines in order."""
    queues = [_lines(r) for r in runs if r]
    out: list[bytes] = []
    while queues:
        q = rng.choice(queues)
        out.append(q.pop(0))
        if not q:
            queues.remove(q)
    return [_write(folder / "all.jsonl", out)]


def reversed_runs(runs: list[list[AnyEvent]], rng: random.Random, folder: Path) -> list[str]:
    """Each run's lines backwards, the files given last first."""
    paths = [_write(folder / f"run-{i}.jsonl", _lines(r)[::-1]) for i, r in enumerate(runs)]
    return paths[::-1]


def shuffled(runs: list[list[AnyEvent]], rng: random.Random, folder: Path) -> list[str]:
    """Every line of the set shuffled and dealt into three files."""
    every = [line for r in runs for line in _lines(r)]
    rng.shuffle(every)
    return [_write(folder / f"part-{i}.jsonl", every[i::3]) for i in range(3)]


def split(runs: list[list[AnyEvent]], rng: random.Random, folder: Path) -> list[str]:
    """Each run cut into 2 to 4 consecutive parts, a file each (rotated files), in any order."""
    paths = []
    for i, run in enumerate(runs):
        lines = _lines(run)
        parts = min(rng.randint(2, 4), max(len(lines), 1))
        cuts = sorted(rng.sample(range(1, len(lines)), parts - 1)) if len(lines) > 1 else []
        bounds = [0, *cuts, len(lines)]
        for k in range(len(bounds) - 1):
            part = lines[bounds[k] : bounds[k + 1]]
            paths.append(_write(folder / f"run-{i}.{k}.jsonl", part))
    rng.shuffle(paths)
    return paths


def _members(run: list[AnyEvent], rng: random.Random) -> list[bytes]:
    """A run's lines as several whole gzip members, as the gzip sink flushes them."""
    lines = _lines(run)
    members = []
    at = 0
    while at < len(lines):
        n = rng.randint(1, max(1, len(lines) // 2))
        members.append(gzip.compress(b"".join(lines[at : at + n]), mtime=0))
        at += n
    return members


def gzip_members(runs: list[list[AnyEvent]], rng: random.Random, folder: Path) -> list[str]:
    """A .jsonl.gz per run made of several whole gzip members, as the gzip sink flushes."""
    paths = []
    for i, run in enumerate(runs):
        path = folder / f"run-{i}.jsonl.gz"
        path.write_bytes(b"".join(_members(run, rng)))
        paths.append(str(path))
    return paths


# gzip.compress writes a 10-byte header (no name, no extra field): then the deflate data.
_DEFLATE_AT = 10


def gzip_damaged(runs: list[list[AnyEvent]], rng: random.Random, folder: Path) -> list[str]:
    """As ``gzip``, with one member of one file damaged (a disk, a bad copy): its deflate
    data begins with a block of the reserved type, which no reader can inflate. Its
    lines are lost; readers go on at the next member, or the file ends there (the
    damage at the end of a file that ``watch`` said nothing of, issue #26)."""
    members = [_members(run, rng) for run in runs]
    i = rng.randrange(len(members))
    k = rng.randrange(len(members[i]))
    damaged = bytearray(members[i][k])
    damaged[_DEFLATE_AT] = 0xFF  # BFINAL 1, BTYPE 11: reserved, an error
    members[i][k] = bytes(damaged)
    paths = []
    for n, parts in enumerate(members):
        path = folder / f"run-{n}.jsonl.gz"
        path.write_bytes(b"".join(parts))
        paths.append(str(path))
    return paths


def read_twice(runs: list[list[AnyEvent]], rng: random.Random, folder: Path) -> list[str]:
    """One file per run, and a copy of one of them (two sinks, or a copied file)."""
    paths = in_order(runs, rng, folder)
    i = rng.randrange(len(paths))
    copy = folder / f"copy-of-run-{i}.jsonl"
    copy.write_bytes(Path(paths[i]).read_bytes())
    paths.insert(rng.randrange(len(paths) + 1), str(copy))
    return paths


def torn(runs: list[list[AnyEvent]], rng: random.Random, folder: Path) -> list[str]:
    """One file per run, one of them cut inside its last line (a process killed mid-write)."""
    paths = in_order(runs, rng, folder)
    path = Path(rng.choice(paths))
    data = path.read_bytes()
    start = data.rfind(b"\n", 0, len(data) - 1) + 1
    # At least a byte of the line stays and at least its newline goes.
    path.write_bytes(data[: start + rng.randint(1, len(data) - start - 1)])
    return paths


LAYOUTS: dict[str, Layout] = {
    "in_order": in_order,
    "interleaved": interleaved,
    "reversed": reversed_runs,
    "shuffled": shuffled,
    "split": split,
    "gzip": gzip_members,
    "read_twice": read_twice,
    "torn": torn,
    "gzip_damaged": gzip_damaged,
}
