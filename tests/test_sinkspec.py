from __future__ import annotations

import os
from pathlib import Path

import pytest

import rollout_trace as rt
from rollout_trace._writing import specs
from rollout_trace._writing.specs import parse_uri, uris_from_env
from rollout_trace.sinks import JsonlSink, MemorySink, NullSink, StderrSink, StdoutSink

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
    # A {name} no template fills would be in the path as written.
    (
        "jsonl:///runs/{runid}.jsonl",
        rt.SinkError,
        ["unknown template {runid}", "did you mean {run_id}?", "{run_id}, {pid}, {host}"],
    ),
    ("runs/{PID}-x.jsonl", rt.SinkError, ["unknown template {PID}", "did you mean {pid}?"]),
    ("s3://b/{date}/x.jsonl", rt.SinkError, ["unknown template {date} in the location: the"]),
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
        ("notasink://", rt.SinkError, ["not a rollout_trace.Sink subclass"]),  # wrong class
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


def test_an_unknown_template_is_refused_when_the_tracer_is_made(tmp_path: Path) -> None:
    with pytest.raises(rt.SinkError, match=r"unknown template \{runid\}"):
        rt.tracer(f"jsonl://{tmp_path}/{{runid}}.jsonl")
    assert list(tmp_path.iterdir()) == []  # no file literally named {runid}.jsonl


@pytest.mark.parametrize(
    ("uri", "warned"),
    [
        ("jsonl://tmp/x.jsonl", True),  # two slashes: relative, most likely a slash left out
        ("jsonl://tmp/x.jsonl.gz?fsync=batch", True),
        ("jsonl:///tmp/x.jsonl", False),  # three: absolute
        ("jsonl://./tmp/x.jsonl", False),  # relative on purpose
        ("jsonl://../x.jsonl", False),
        ("tmp/x.jsonl", False),  # a bare path: relative on purpose
    ],
)
def test_a_relative_jsonl_uri_is_said_with_the_path_it_means(
    uri: str, warned: bool, trace_log: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(specs, "_said_relative", set())  # as in a new process
    spec = parse_uri(uri)
    said = [r.getMessage() for r in trace_log.records if "relative path" in r.getMessage()]
    if not warned:
        assert said == []
        return
    (message,) = said
    location = spec.location
    assert repr(uri) in message
    assert os.path.abspath(location) in message  # the path it writes
    assert f"jsonl:///{location}" in message and f"jsonl://./{location}" in message
    parse_uri(uri)  # once a process
    assert len([r for r in trace_log.records if "relative path" in r.getMessage()]) == 1
