"""Trace sets read from an object store (``s3://``) through fsspec, against a real
S3-compatible server (moto's, in a process of its own: ``s3server``).

README: Command line (PATHS), and Reference > CLI commands. A set read from
the store gives what the same set read from local files gives, byte for byte
(file names aside, where a command names a file), whatever its layout: whole
or cut in segments, gzip or not, given in any order or as a glob.
"""

from __future__ import annotations

import collections
import gzip
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from s3server import BUCKET, S3Server
from scenario import disp, lines, make_run, run_id, seal

import rollout_trace as rt
from rollout_trace._cli.main import main
from rollout_trace._errors import TraceReadError
from rollout_trace._reading import paths, pieces, reader, stores
from rollout_trace._reading.paths import expand_paths
from rollout_trace._reading.reader import is_text, iter_blocks
from rollout_trace._report.live import Follower

ROOT = Path(__file__).resolve().parents[2]
URL = f"s3://{BUCKET}"
RUN = lines(make_run(1, 100.0, [(101.0, disp(1, 0)), (102.0, seal(1, 0))]))


def _env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, **extra}


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rollout_trace", *args],
        capture_output=True,
        text=True,
        env=env if env is not None else _env(),
        timeout=120,
        check=False,
    )


def _put(server: S3Server, objects: dict[str, bytes]) -> None:
    client = server.client()
    for key, body in objects.items():
        client.put_object(Bucket=BUCKET, Key=key, Body=body)


def _run_of(n: int) -> bytes:
    """The lines of a run of its own, numbered ``n``."""
    return lines(make_run(n, 100.0 * n, [(100.0 * n + 1, disp(1, 0)), (100.0 * n + 2, seal(1, 0))]))


def _requests(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[str]:
    """The requests s3fs makes from now on, by kind (``head_object``, ``get_object``,
    ...; a listing's pages are not counted), and each range read under ``Range``."""
    import s3fs

    calls: collections.Counter[str] = collections.Counter()
    real = s3fs.S3FileSystem._call_s3

    async def counted(self: Any, method: str, *args: Any, **kwargs: Any) -> Any:
        calls[method] += 1
        if "Range" in kwargs:
            start, end = kwargs["Range"].removeprefix("bytes=").split("-")
            calls["Range"] += int(end) - int(start) + 1
        return await real(self, method, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", counted)
    return calls


# --- which objects a URL names ----------------------------------------------------------

# What the bucket holds for the listing tests.
_TREE = {
    "set/a.jsonl": RUN,
    "set/b.jsonl.gz": gzip.compress(RUN),
    "set/notes.txt": b"not a trace",
    "set/deeper/c.jsonl": RUN,
    "other/d.jsonl": RUN,
}


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        # A glob: its matches, sorted.
        ([f"{URL}/set/*.jsonl*"], ["set/a.jsonl", "set/b.jsonl.gz"]),
        # `**` stands for any number of levels.
        ([f"{URL}/**/*.jsonl"], ["other/d.jsonl", "set/a.jsonl", "set/deeper/c.jsonl"]),
        # A prefix stands for its trace objects, as a folder does: not notes.txt, not deeper.
        ([f"{URL}/set/"], ["set/a.jsonl", "set/b.jsonl.gz"]),
        # The same without its closing slash.
        ([f"{URL}/set"], ["set/a.jsonl", "set/b.jsonl.gz"]),
        # One object by its key, whatever its name.
        ([f"{URL}/set/notes.txt"], ["set/notes.txt"]),
        # An object named twice is read once, where it was first named.
        ([f"{URL}/set/b.jsonl.gz", f"{URL}/set/"], ["set/b.jsonl.gz", "set/a.jsonl"]),
        # The order given is kept.
        ([f"{URL}/other/d.jsonl", f"{URL}/set/a.jsonl"], ["other/d.jsonl", "set/a.jsonl"]),
        # s3a:// is s3:// to fsspec; the URL keeps the scheme it was given.
        ([f"s3a://{BUCKET}/other/*"], ["s3a://traces/other/d.jsonl"]),
        # ... and an object named by both is read once, under the first.
        ([f"{URL}/set/a.jsonl", f"s3a://{BUCKET}/set/a.jsonl"], ["set/a.jsonl"]),
        (
            [f"s3a://{BUCKET}/set/*.jsonl", f"{URL}/set/"],
            ["s3a://traces/set/a.jsonl", "set/b.jsonl.gz"],
        ),
        # A scheme in capitals is the scheme (as a URL's is), and named as fsspec knows it.
        ([f"S3://{BUCKET}/set/a.jsonl"], ["set/a.jsonl"]),
        ([f"S3A://{BUCKET}/other/"], ["s3a://traces/other/d.jsonl"]),
    ],
)
def test_a_url_names_objects_as_a_path_names_files(
    s3: S3Server, given: list[str], expected: list[str]
) -> None:
    _put(s3, _TREE)
    want = [e if "://" in e else f"{URL}/{e}" for e in expected]
    assert expand_paths(given) == want


def test_local_files_and_urls_mix_in_one_call(s3: S3Server, tmp_path: Path) -> None:
    _put(s3, _TREE)
    local = tmp_path / "x.jsonl"
    local.write_bytes(RUN)
    given = [str(local), f"{URL}/set/a.jsonl", str(local), f"{URL}/set/a.jsonl"]
    assert expand_paths(given) == [str(local), f"{URL}/set/a.jsonl"]
    # Each read, in the order given: the local one's events, then the object's.
    events = list(rt.read(given))
    assert len(events) == 2 * len(list(rt.read(str(local))))


def test_a_listing_is_fresh_each_time(s3: S3Server) -> None:
    # fsspec caches listings; a second read of a prefix sees what came since.
    _put(s3, {"set/a.jsonl": RUN})
    assert expand_paths(f"{URL}/set/") == [f"{URL}/set/a.jsonl"]
    _put(s3, {"set/b.jsonl": RUN})
    assert expand_paths(f"{URL}/set/") == [f"{URL}/set/a.jsonl", f"{URL}/set/b.jsonl"]


# --- a glob names the same objects as files -----------------------------------------------

# Names that begin with a dot, as files and as a folder, beside others: what
# Python's glob leaves out locally, and fsspec's glob matched in a store.
_DOTTED = {
    "a.jsonl": _run_of(1),
    ".hidden.jsonl": _run_of(2),
    "notes.txt": b"not a trace",
    "sub/b.jsonl": _run_of(3),
    "sub/deep/c.jsonl.gz": gzip.compress(_run_of(4)),
    "sub/.h/d.jsonl": _run_of(5),
    ".dot/e.jsonl": _run_of(6),
}


def _both(s3: S3Server, tmp_path: Path, tree: dict[str, bytes]) -> tuple[str, str]:
    """``tree`` written under a local folder and under a prefix: the two roots."""
    _put(s3, {f"dots/{key}": body for key, body in tree.items()})
    for key, body in tree.items():
        (tmp_path / key).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / key).write_bytes(body)
    return str(tmp_path), f"{URL}/dots"


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        # `*` matches no name that begins with a dot.
        ("*", ["a.jsonl", "notes.txt"]),
        ("*.jsonl", ["a.jsonl"]),
        # Nor does a class or `?` (no dot in the pattern's first place).
        ("[.a]*.jsonl", ["a.jsonl"]),
        ("?*.jsonl", ["a.jsonl"]),
        # `**` walks into no dot-folder, and its last part matches no dot-name.
        ("**/*.jsonl", ["a.jsonl", "sub/b.jsonl"]),
        ("**/*.jsonl*", ["a.jsonl", "sub/b.jsonl", "sub/deep/c.jsonl.gz"]),
        # A last `**`: every file under it but those and those under dot-folders.
        ("**", ["a.jsonl", "notes.txt", "sub/b.jsonl", "sub/deep/c.jsonl.gz"]),
        ("sub/**", ["sub/b.jsonl", "sub/deep/c.jsonl.gz"]),
        # A folder matched by `*` is not a dot-folder.
        ("*/*.jsonl", ["sub/b.jsonl"]),
        # A pattern's part that begins with a dot matches names that do.
        (".*", [".hidden.jsonl"]),
        (".*/*.jsonl", [".dot/e.jsonl"]),
        ("**/.*", [".hidden.jsonl"]),
        # A dot-folder named as it is, then a glob under it.
        ("sub/.h/*.jsonl", ["sub/.h/d.jsonl"]),
        ("**/.h/*", ["sub/.h/d.jsonl"]),
        (".dot/**", [".dot/e.jsonl"]),
        # No glob: a folder (a prefix) stands for all its trace files, dot-names too.
        ("", [".hidden.jsonl", "a.jsonl"]),
    ],
)
def test_a_glob_names_the_same_objects_as_files(
    s3: S3Server, tmp_path: Path, pattern: str, expected: list[str]
) -> None:
    named: dict[str, list[str]] = {}
    for root in _both(s3, tmp_path, _DOTTED):
        given = f"{root}/{pattern}" if pattern else root
        named[root] = [p[len(root) + 1 :] for p in expand_paths(given)]
    local, store = named.values()
    assert local == store == expected


@pytest.mark.parametrize("pattern", ["*.jsonl", "**/*.jsonl*"])
def test_a_glob_counts_the_same_runs_from_files_and_objects(
    s3: S3Server, tmp_path: Path, capsys: pytest.CaptureFixture[str], pattern: str
) -> None:
    docs = []
    for root in _both(s3, tmp_path, _DOTTED):
        assert main(["summary", "--json", f"{root}/{pattern}"]) == 0
        doc = json.loads(capsys.readouterr().out)
        docs.append(sorted(r["run_id"] for r in doc["runs"]))
        assert {ev.run_id for ev in rt.read(f"{root}/{pattern}")} == set(docs[-1])
    local, store = docs
    assert local == store and run_id(2) not in store and run_id(5) not in store


# --- what cannot be read, said before a byte is read --------------------------------------


@pytest.mark.parametrize(
    ("given", "said"),
    [
        # A glob that matches nothing.
        (f"{URL}/set/*.jsonl.gz.none", f"no trace object matches '{URL}/set/*.jsonl.gz.none'"),
        # A key that is not there.
        (f"{URL}/set/gone.jsonl", f"no such trace object: '{URL}/set/gone.jsonl'"),
        # A prefix with no trace object under it.
        (f"{URL}/only-notes/", f"'{URL}/only-notes/' holds no .jsonl or .jsonl.gz object"),
        # A bucket that is not there, by key and by glob.
        ("s3://no-such-bucket/a.jsonl", "no such bucket 'no-such-bucket'"),
        ("s3://no-such-bucket/*.jsonl", "no such bucket 'no-such-bucket'"),
        # A scheme fsspec knows that is no object store.
        ("memory://set/a.jsonl", "memory:// is no object store read here"),
        # A bucket name the client refuses (its message takes lines, and regexes).
        ("s3://Bad_Bucket!/a.jsonl", "cannot read 's3://Bad_Bucket!/a.jsonl': 'Bad_Bucket!' is no"),
    ],
)
def test_what_cannot_be_read_is_one_error_naming_the_url(
    s3: S3Server, capsys: pytest.CaptureFixture[str], given: str, said: str
) -> None:
    _put(s3, {**_TREE, "only-notes/n.txt": b"notes"})
    with pytest.raises(TraceReadError) as caught:
        expand_paths([f"{URL}/set/a.jsonl", given])
    assert said in str(caught.value)
    # The command line: wrong usage, one line, no traceback.
    assert main(["summary", given]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1 and "Traceback" not in err


def test_a_scheme_whose_package_is_missing_names_the_extra() -> None:
    # gs:// is fsspec's, through gcsfs: honestly missing where gcsfs is not installed.
    try:
        import gcsfs  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("gcsfs is installed")
    with pytest.raises(TraceReadError) as caught:
        expand_paths("gs://bucket/runs/*.jsonl")
    assert "gcsfs" in str(caught.value) and "pip install 'rollout-trace[gcs]'" in str(caught.value)


def test_s3fs_missing_names_the_extra(s3: S3Server) -> None:
    # A child process where `import s3fs` fails, as where it is not installed.
    _put(s3, _TREE)
    code = (
        "import sys; sys.modules['s3fs'] = None\n"
        "from rollout_trace._cli.main import main\n"
        f"sys.exit(main(['summary', '{URL}/set/a.jsonl']))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_env(**s3.env())
    )
    assert proc.returncode == 2, proc.stderr
    assert "pip install 'rollout-trace[s3]'" in proc.stderr and "s3fs" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_local_reads_never_import_fsspec(tmp_path: Path) -> None:
    # fsspec blocked: reading local files, and every command over them, works without it.
    local = tmp_path / "a.jsonl"
    local.write_bytes(RUN)
    code = (
        "import sys\n"
        "import rollout_trace as rt\n"
        "from rollout_trace._cli.main import main\n"
        f"n = len(list(rt.read({str(local)!r})))\n"
        f"assert main(['summary', {str(local)!r}]) == 0\n"
        f"assert main(['cost', '--json', {str(local)!r}]) == 0\n"
        "assert 'fsspec' not in sys.modules and 's3fs' not in sys.modules\n"
        "sys.modules['fsspec'] = None\n"
        f"assert len(list(rt.read({str(local)!r}))) == n == 3, n\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env())
    assert proc.returncode == 0, proc.stderr


def test_a_store_that_cannot_be_reached_is_an_error_listing_or_reading(s3: S3Server) -> None:
    _put(s3, _TREE)
    files = expand_paths(f"{URL}/set/")  # listed while the store is up
    s3.proxy.down()
    try:
        with pytest.raises(TraceReadError, match="the object store cannot be reached"):
            expand_paths(f"{URL}/other/")
        # Read after it went down: the read's error, no botocore exception.
        with pytest.raises(TraceReadError) as caught:
            list(iter_blocks(files))
        assert f"{URL}/set/a.jsonl" in str(caught.value)
        assert "cannot be reached" in str(caught.value)
    finally:
        s3.proxy.up()
    assert len(list(iter_blocks(files))) == 2  # up again


# --- keys with glob characters --------------------------------------------------------

_BRACKETS = {"br/r[1].jsonl": _run_of(1), "br/r1.jsonl": _run_of(2), "only/[x].jsonl": _run_of(3)}


@pytest.mark.parametrize(
    ("given", "expected", "runs"),
    [
        # A key with glob characters is that object, as a file is: not the glob's match r1.jsonl.
        ([f"{URL}/br/r[1].jsonl"], ["br/r[1].jsonl"], [1]),
        # ... the only object there too, which the glob would not match.
        ([f"{URL}/only/[x].jsonl"], ["only/[x].jsonl"], [3]),
        # A prefix lists both; each is read as listed, not taken for a glob again.
        ([f"{URL}/br/"], ["br/r1.jsonl", "br/r[1].jsonl"], [2, 1]),
        # A glob that is no key is a glob.
        ([f"{URL}/br/r[12].jsonl"], ["br/r1.jsonl"], [2]),
        ([f"{URL}/br/r?1?.jsonl"], ["br/r[1].jsonl"], [1]),
    ],
)
def test_a_key_with_glob_characters_is_that_object(
    s3: S3Server,
    capsys: pytest.CaptureFixture[str],
    given: list[str],
    expected: list[str],
    runs: list[int],
) -> None:
    _put(s3, _BRACKETS)
    want = [f"{URL}/{e}" for e in expected]
    assert expand_paths(given) == want
    assert expand_paths(want) == want  # what a listing gave names the same objects again
    assert list(dict.fromkeys(ev.run_id for ev in rt.read(given))) == [run_id(n) for n in runs]
    # The command line: each object's run, once.
    assert main(["summary", "--json", *given]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert sorted(r["run_id"] for r in doc["runs"]) == sorted(run_id(n) for n in runs)


# --- what a command asks of the store -----------------------------------------------------


_MANY = 25


@pytest.mark.parametrize(
    ("given", "heads"),
    [
        # A prefix: its listing asks whether it is an object first.
        ([f"{URL}/many/"], 1),
        # A glob: whether it is an object's key first (it may be one), then its listing.
        ([f"{URL}/many/seg.*.jsonl"], 1),
        # Objects named one by one: each looked up once, as its listing.
        ([f"{URL}/many/seg.{i:03d}.jsonl" for i in range(_MANY)], _MANY),
    ],
)
@pytest.mark.parametrize(
    "command", [["summary"], ["cost", "--jobs", "1"], ["validate"], ["report"]]
)
def test_a_command_lists_once_and_reads_each_object_once(
    s3: S3Server,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: list[str],
    given: list[str],
    heads: int,
) -> None:
    # Before, each object cost some 8 HEAD requests: listed again by each step
    # of the command, sized for the progress, and looked up again at its open.
    _put(s3, {f"many/seg.{i:03d}.jsonl": _run_of(i + 1) for i in range(_MANY)})
    calls = _requests(monkeypatch)
    assert main([*command, *given]) in (0, 1)
    capsys.readouterr()
    assert calls["head_object"] <= heads
    assert calls["get_object"] == _MANY  # each object read once, as long as its listing says


@pytest.mark.parametrize(
    "given",
    [
        # A prefix.
        f"{URL}/many/",
        # A glob (whose listing s3fs keeps no sizes of for the open to find).
        f"{URL}/many/seg.*.jsonl",
    ],
)
def test_watch_asks_nothing_of_an_object_that_did_not_change(
    s3: S3Server, monkeypatch: pytest.MonkeyPatch, given: str
) -> None:
    n = 10
    _put(s3, {f"many/seg.{i:03d}.jsonl": _run_of(i + 1) for i in range(n)})
    follower = Follower([given])
    calls = _requests(monkeypatch)
    assert len(list(follower.lines())) == 3 * n
    assert calls["head_object"] <= 1 and calls["get_object"] == 2 * n  # its head, its rest
    calls.clear()
    assert list(follower.lines()) == []
    assert calls["head_object"] <= 1 and calls["get_object"] == 0  # the listing only


def test_telling_a_large_object_is_text_reads_its_first_chunk_only(
    s3: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Not a read ahead block of 8 MB, for each large object `cost --jobs` cuts in ranges.
    _put(s3, {"big/a.jsonl": RUN * (3 * (1 << 20) // len(RUN))})
    [url] = expand_paths(f"{URL}/big/a.jsonl")
    calls = _requests(monkeypatch)
    assert is_text(url)
    assert calls["get_object"] == 1 and calls["Range"] == reader._CHUNK


# --- a store that fails -------------------------------------------------------------------

# Short bounds, through fsspec's configuration, which wins over the readers' own: a
# hung store is then given up in seconds (with the readers' own, in about 40 s a
# request; with botocore's and s3fs's defaults, it took many minutes).
_SHORT = {"config_kwargs": {"connect_timeout": 1, "read_timeout": 1}}


@pytest.mark.parametrize(
    ("conf", "expected"),
    [
        # No configuration: the readers' own bounds.
        ({}, stores._S3_CONFIG),
        # fsspec's configuration wins, option by option; the rest are the readers'.
        ({"s3": _SHORT}, {**stores._S3_CONFIG, **_SHORT["config_kwargs"]}),
        (
            {"s3a": {"config_kwargs": {"retries": {"max_attempts": 9}}}},
            {
                **stores._S3_CONFIG,
                "retries": {"max_attempts": 9},
            },
        ),
    ],
)
def test_the_readers_client_is_bounded_unless_configured_otherwise(
    s3: S3Server,
    monkeypatch: pytest.MonkeyPatch,
    conf: dict[str, Any],
    expected: dict[str, Any],
) -> None:
    import fsspec.config

    for protocol, options in conf.items():
        monkeypatch.setitem(fsspec.config.conf, protocol, options)
    fs, _ = stores._filesystem(f"{URL}/set/a.jsonl")
    assert fs.config_kwargs == expected
    assert fs.retries == stores._S3_RETRIES == 2  # s3fs's own retries, over botocore's


# A hang guard, not a measure: with 1 s timeouts each case takes seconds (the
# client's own retries), with the readers' own bounds minutes. That fsspec's
# configuration wins is test_the_readers_client_is_bounded_unless_configured_otherwise's.
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("fault", "when", "command", "status"),
    [
        # Down at the listing: said before a byte is read, as a missing file is.
        ("down", "listing", ["summary"], 2),
        # Down once the read is under way: a read that failed part way, as a failing disk's.
        ("down", "reading", ["summary"], 1),
        # ... read by worker processes too.
        ("down", "reading", ["cost", "--jobs", "2"], 1),
        # Hung (it takes the connection, and says nothing): the same, in bounded time.
        ("hang", "listing", ["summary"], 2),
        ("hang", "reading", ["summary"], 1),
    ],
)
def test_a_store_that_fails_is_given_up_in_bounded_time(
    s3: S3Server,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    fault: str,
    when: str,
    command: list[str],
    status: int,
) -> None:
    import fsspec.config

    monkeypatch.setitem(fsspec.config.conf, "s3", _SHORT)
    monkeypatch.setattr(pieces, "_MIN_PIECE", 256)  # --jobs 2: two tasks, two workers
    _put(s3, {"set/a.jsonl": _run_of(1), "set/b.jsonl": _run_of(2)})

    def fail() -> None:
        if fault == "down":
            s3.proxy.down()
        else:
            s3.proxy.hang = True

    def listed_then_fail(url: str) -> list[str]:
        found = listed(url)
        fail()
        return found

    listed = paths.expand_url
    if when == "reading":
        monkeypatch.setattr(paths, "expand_url", listed_then_fail)

    def once(read: Callable[[], Any]) -> Any:
        if when == "listing":
            fail()
        try:
            return read()
        finally:
            s3.proxy.hang = False
            if fault == "down":
                s3.proxy.up()

    code = once(lambda: main([*command, f"{URL}/set/"]))
    # The library: a TraceReadError before a byte is read, an OSError after.
    with pytest.raises(OSError if status == 1 else TraceReadError) as caught:
        once(lambda: list(rt.read(f"{URL}/set/")))
    err = capsys.readouterr().err
    assert code == status, err
    # One line, naming the URL and what is wrong.
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"{URL}/set/" in err and "the object store cannot be reached" in err, err
    assert f"{URL}/set/" in str(caught.value)


# --- the same set, from local files and from the store ----------------------------------


def _opened(path: Path) -> float:
    """When the trace of ``path`` was opened (its first line's time)."""
    first: float = json.loads(path.read_bytes().split(b"\n")[0])["time"]
    return first


@pytest.fixture(scope="module")
def demo_set(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, bytes]]:
    """A demo's trace set (a run killed, a run restored from its snapshot), first run first,
    its killed run ending in a torn line: (name, bytes) of each file."""
    out = tmp_path_factory.mktemp("demo")
    proc = _cli("demo", "--out", str(out), "--seed", "3")
    assert proc.returncode == 0, proc.stderr
    files = sorted(out.glob("trace-*.jsonl"), key=_opened)
    assert len(files) == 2
    killed = files[0].read_bytes() + b'{"event":"attempt_sealed","time":1'
    return [(files[0].name, killed), (files[1].name, files[1].read_bytes())]


def _segments(body: bytes, n: int) -> list[bytes]:
    """``body`` cut into ``n`` segments of whole lines (the last one as it ends)."""
    rows = body.splitlines(keepends=True)
    step = -(-len(rows) // n)
    return [b"".join(rows[i : i + step]) for i in range(0, len(rows), step)]


def _members(body: bytes, n: int) -> bytes:
    """``body`` as ``n`` gzip members, one a batch, as the sink writes them."""
    return b"".join(gzip.compress(part) for part in _segments(body, n))


Layout = Callable[[list[tuple[str, bytes]]], dict[str, bytes]]

_LAYOUTS: list[tuple[str, Layout, str]] = [
    # The files as the demo wrote them, named by a glob.
    ("whole", lambda fs: dict(fs), "*.jsonl"),
    # Each file gzip, one member, named by a glob.
    ("gzip", lambda fs: {f"{n}.gz": gzip.compress(b) for n, b in fs}, "*.jsonl.gz"),
    # Each file gzip in many members (a batch each); the prefix names them.
    ("members", lambda fs: {f"{n}.gz": _members(b, 9) for n, b in fs}, "/"),
    # Each run cut into segments, plain and gzip in turn, named one by one, last first.
    (
        "segments",
        lambda fs: {
            f"{n[:-6]}.{i:04d}.jsonl{'.gz' if i % 2 else ''}": gzip.compress(s) if i % 2 else s
            for n, b in fs
            for i, s in enumerate(_segments(b, 4))
        },
        "reversed",
    ),
]


def _args(root: str, layout: dict[str, bytes], given: str) -> list[str]:
    """The PATHS naming the set under ``root`` (a folder or a URL prefix)."""
    if given == "reversed":
        return [f"{root}/{name}" for name in sorted(layout, reverse=True)]
    if given == "/":
        return [f"{root}/"]
    return [f"{root}/{given}"]


_FILES = re.compile(r"read from \d+ file\(s\)")


def _but_files(report: str) -> dict[str, object]:
    doc: dict[str, object] = json.loads(report)
    del doc["files"]
    return doc


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


_COMMANDS = [
    ["summary"],
    ["cost", "--json", "--jobs", "1"],
    ["cost", "--json", "--jobs", "2"],
    ["report", "--json"],
    ["validate"],
]


@pytest.mark.parametrize(("name", "build", "given"), _LAYOUTS, ids=[lay[0] for lay in _LAYOUTS])
def test_a_set_from_the_store_reads_as_from_local_files(
    s3: S3Server,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    demo_set: list[tuple[str, bytes]],
    name: str,
    build: Layout,
    given: str,
) -> None:
    # Pieces of a few hundred bytes: --jobs 2 cuts the set into byte ranges and
    # tasks, which the worker processes read from the store themselves.
    monkeypatch.setattr(pieces, "_MIN_PIECE", 256)
    layout = build(demo_set)
    folder = tmp_path / name
    folder.mkdir()
    for key, body in layout.items():
        (folder / key).write_bytes(body)
    _put(s3, {f"{name}/{key}": body for key, body in layout.items()})
    local = _args(str(folder), layout, given)
    remote = _args(f"{URL}/{name}", layout, given)
    # The set as the demo wrote it, read from local files: the figures of every layout.
    canonical = tmp_path / "canonical"
    canonical.mkdir(exist_ok=True)
    for key, body in demo_set:
        (canonical / key).write_bytes(body)

    for command in _COMMANDS:
        want = _run([*command, *local], capsys)
        got = _run([*command, *remote], capsys)
        assert want[0] in (0, 1), want[2]
        # Byte for byte, but for where the files are.
        where = (str(folder), f"{URL}/{name}")
        assert got == tuple(x.replace(*where) if isinstance(x, str) else x for x in want), command
        # The figures of the set as the demo wrote it. What names the files
        # differs with the layout: validate's files and lines, report's list of
        # files, and how many files summary read.
        figures = _run([*command, str(canonical)], capsys)
        if command[0] == "report":
            assert _but_files(got[1]) == _but_files(figures[1])
        elif command[0] == "summary":
            assert _FILES.sub("", got[1]) == _FILES.sub("", figures[1])
        elif command[0] != "validate":
            assert got[:2] == figures[:2], command
    assert "torn last line" in want[1]  # validate saw the killed run's torn line

    # The library: the same events, in the same order, and the same bad line.
    want_problems: list[rt.ReadProblem] = []
    got_problems: list[rt.ReadProblem] = []
    assert list(rt.read(remote, got_problems)) == list(rt.read(local, want_problems))
    assert [str(p) for p in got_problems] == [str(p).replace(*where) for p in want_problems]
    assert len(got_problems) == 1


# A program that runs the command line as the console script does, with pieces of
# a few hundred bytes so that a small set is cut into many tasks for the workers.
_PROGRAM = """\
import sys
from rollout_trace._cli.main import program
from rollout_trace._reading import pieces
if __name__ == "__main__":
    pieces._MIN_PIECE = 256
    sys.exit(program())
"""

# A program that starts the forkserver (which the workers are forked from) before
# it sets the store's variables, then runs the command: the workers must read the
# store as the command's process does, not as the forkserver found the environment.
_LATE = """\
import json, multiprocessing.forkserver, os, sys
from rollout_trace._cli.main import main
from rollout_trace._reading import pieces
if __name__ == "__main__":
    multiprocessing.forkserver.ensure_running()
    os.environ.update(json.loads(os.environ.pop("STORE_ENV")))
    pieces._MIN_PIECE = 256
    sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize(
    ("program", "late"),
    [
        # The variables in the program's environment from its start.
        (_PROGRAM, False),
        # The variables set by the program, after its forkserver started.
        (_LATE, True),
    ],
)
def test_the_program_in_a_child_process_reads_the_store_with_workers(
    s3: S3Server, tmp_path: Path, demo_set: list[tuple[str, bytes]], program: str, late: bool
) -> None:
    # Its worker processes open the objects themselves, each with a filesystem of its own.
    for key, body in demo_set:
        (tmp_path / key).write_bytes(body)
    _put(s3, {f"set/{key}": body for key, body in demo_set})
    script = tmp_path / "prog.py"
    script.write_text(program)
    store = s3.env()
    env = _env(STORE_ENV=json.dumps(store)) if late else _env(**store)
    for name in store if late else ():
        env.pop(name, None)

    def cost(*paths: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(script), "cost", "--json", "--jobs", "2", *paths],
            capture_output=True,
            text=True,
            env={**env, **extra},
            timeout=120,
            check=False,
        )

    want = cost(str(tmp_path / "trace-*.jsonl"))
    got = cost(f"{URL}/set/*.jsonl")
    assert want.returncode == 0, want.stderr
    assert (got.returncode, got.stdout) == (want.returncode, want.stdout), got.stderr
    assert got.stderr.replace(f"{URL}/set", str(tmp_path)) == want.stderr
    # The workers are who read: one that dies on an object names it.
    last = demo_set[-1][0]
    died = cost(f"{URL}/set/*.jsonl", _ROLLOUT_TRACE_TEST_WORKER_DIES_ON=last)
    assert died.returncode == 1
    assert "a worker process ended" in died.stderr and f"{URL}/set/{last}" in died.stderr


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_ray_tasks_read_the_store_as_the_local_files_read(
    s3: S3Server,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    demo_set: list[tuple[str, bytes]],
) -> None:
    # "On a cluster": the set read back by Ray tasks, each opening the objects
    # itself with the store's variables as the local cluster's workers have them.
    pytest.importorskip("ray")
    monkeypatch.setattr(pieces, "_MIN_PIECE", 1024)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    for key, body in demo_set:
        (tmp_path / key).write_bytes(body)
    _put(s3, {f"ray/{key}": body for key, body in demo_set})
    want = _run(["cost", "--json", "--jobs", "1", str(tmp_path)], capsys)
    got = _run(["cost", "--json", "--ray", f"{URL}/ray/"], capsys)
    assert want[0] == 0, want[2]
    assert got[:2] == want[:2], got[2]
