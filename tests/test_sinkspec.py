from __future__ import annotations

import os
from pathlib import Path

import pytest

import rollout_trace as rt
from rollout_trace._writing.specs import parse_uri, uris_from_env
from sinks import JsonlSink, MemorySink, NullSink, StderrSink, StdoutSink

# Accepted forms: (uri, sink class, location, options).
ACCEPTED = [
    ("jsonl:///abs/path/trace.jsonl", JsonlSink, "/abs/path/trace.jsonl", {}),  # absolute
    ("jsonl://rel/path.jsonl", JsonlSink, "rel/path.jsonl", {}),  # relative to the cwd
    ("runs/x.jsonl", JsonlSink, "runs/x.jsonl", {}),  # a bare path ending in .jsonl
    ("/runs/x.jsonl.gz", JsonlSink, "/runs/x.jsonl.gz", {}),  # a bare compressed path
    ("jsonl:///r/{run_id}-{pid}-{host}.jsonl", JsonlSink, "/r/{run_id}-{pid}-{host}.jsonl", {}),
    ("jsonl:///x.jsonl?fsync=batch", JsonlSink, "/x.jsonl", {"fsync": "batch"}),  # an option
    ("JSONL:///x.jsonl", JsonlSink, "/x.jsonl", {}),  # schemes are case-insensitive
    ("stdout://", StdoutSink, "", {}),
    ("stderr://", StderrSink, "", {}),
    ("null://", NullSink, "", {}),
    ("memory://", MemorySink, "", {}),
]


@pytest.mark.parametrize(("uri", "cls", "location", "options"), ACCEPTED)
def test_accepted_uris(uri: str, cls: type, location: str, options: dict[str, str]) -> None:
    spec = parse_uri(uri)
    assert spec.factory is cls
    assert spec.location == location
    assert dict(spec.options) == options
    assert spec.uri == uri


# Rejected forms: (uri, error class, words the message must hold).
REJECTED = [
    ("ftp://host/x.jsonl", rt.UnknownSchemeError, ["'ftp'", "jsonl://", "stdout://", "null://"]),
    ("trace.txt", rt.UnknownSchemeError, ["not a sink URI", ".jsonl", "memory"]),  # bare, no .jsonl
    ("1bad://x", rt.UnknownSchemeError, ["'1bad' is not a URI scheme"]),
    ("jsonl:///x.jsonl?level=3", rt.SinkOptionError, ["unknown option 'level'", "known: fsync"]),
    ("null://?fsync=batch", rt.SinkOptionError, ["unknown option 'fsync'", "known: none"]),
    (
        "jsonl:///x.jsonl?fsync=sometimes",
        rt.SinkOptionError,
        ["'sometimes'", "never, batch, always"],
    ),
    ("jsonl:///x.jsonl?fsync=batch&fsync=never", rt.SinkOptionError, ["given twice"]),
    ("jsonl:///x.jsonl?fsync", rt.SinkOptionError, ["malformed query"]),
    ("jsonl://", rt.SinkOptionError, ["needs a file path"]),
]


@pytest.mark.parametrize(("uri", "error", "words"), REJECTED)
def test_rejected_uris(uri: str, error: type[Exception], words: list[str]) -> None:
    with pytest.raises(error) as info:
        parse_uri(uri)
    assert isinstance(info.value, rt.RolloutTraceError)
    assert uri in str(info.value)
    for word in words:
        assert word in str(info.value)


@pytest.mark.usefixtures("plugins")
@pytest.mark.parametrize(
    ("uri", "error", "words"),
    [
        ("notasink://", rt.SinkError, ["not a sinks.Sink subclass"]),  # wrong class
        ("broken://", rt.SinkError, ["failed to load", "ModuleNotFoundError"]),  # import fails
        ("failing://?ok=x", rt.SinkOptionError, ["'x' is not an integer"]),  # plugin's own check
    ],
)
def test_bad_plugins_are_named(uri: str, error: type[Exception], words: list[str]) -> None:
    with pytest.raises(error) as info:
        parse_uri(uri)
    for word in words:
        assert word in str(info.value)


@pytest.mark.usefixtures("plugins")
def test_plugins_come_from_entry_points() -> None:
    from plugin_sinks import FailingSink

    assert parse_uri("failing://?ok=2").factory is FailingSink


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, []),  # unset: disabled
        ("", []),  # empty: disabled
        ("stdout://", ["stdout://"]),
        (" null:// , /tmp/x.jsonl ,", ["null://", "/tmp/x.jsonl"]),  # spaces and empties ignored
    ],
)
def test_uris_from_env(
    value: str | None, expected: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    if value is None:
        monkeypatch.delenv("ROLLOUT_TRACE", raising=False)
    else:
        monkeypatch.setenv("ROLLOUT_TRACE", value)
    assert uris_from_env() == expected


def test_templates_are_filled_at_open(tmp_path: Path) -> None:
    uri = f"jsonl://{tmp_path}/{{host}}/{{pid}}-{{run_id}}.jsonl"
    with rt.sync_tracer(uri) as t:
        run_id = t.run_id
    (path,) = tmp_path.glob("*/*.jsonl")
    assert path.name == f"{os.getpid()}-{run_id}.jsonl"
    assert path.parent.name == os.uname().nodename


@pytest.mark.parametrize(
    "uri",
    [
        "s3://{host}/{run_id}.jsonl",  # a bucket named by the host, checked with a real one
        "s3://b/{host}/{pid}.jsonl",  # a folder named by the host
    ],
)
def test_templates_are_checked_with_this_process_host_and_pid(uri: str) -> None:
    pytest.importorskip("s3fs", reason="the s3 extra is not installed")
    assert parse_uri(uri).location == uri.removeprefix("s3://")
