"""Sink URIs: parsing, templates and the entry-point registry of sink classes."""

from __future__ import annotations

import functools
import os
import re
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from urllib.parse import parse_qsl

from sinks import Sink, SinkOptionValueError

from .._errors import SinkError, SinkOptionError, UnknownSchemeError

__all__ = ["ENV_VAR", "SinkSpec", "parse_uri", "uris_from_env", "known_schemes", "build_sinks"]

ENV_VAR = "ROLLOUT_TRACE"
ENTRY_POINT_GROUP = "rollout_trace.sinks"
_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*")
_BARE_SUFFIXES = (".jsonl", ".jsonl.gz")
_TEMPLATES = ("run_id", "pid", "host")


@functools.cache
def _registry() -> dict[str, object]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def known_schemes() -> list[str]:
    """Every scheme an installed package provides, the built-in ones included."""
    return sorted(_registry())


def _load(uri: str, scheme: str) -> type[Sink]:
    ep = _registry().get(scheme)
    if ep is None:
        known = (
            ", ".join(f"{s}://" for s in known_schemes()) or "none (is rollout-trace installed?)"
        )
        raise UnknownSchemeError(
            uri, f"unknown scheme {scheme!r}; known: {known}, or a path ending in .jsonl"
        )
    try:
        factory = ep.load()  # type: ignore[attr-defined]
    except Exception as exc:
        raise SinkError(uri, f"the plugin for {scheme}:// failed to load: {exc!r}") from exc
    if not (isinstance(factory, type) and issubclass(factory, Sink)):
        raise SinkError(uri, f"the plugin for {scheme}:// is not a sinks.Sink subclass")
    return factory


@dataclass(frozen=True)
class SinkSpec:
    """A parsed sink URI: which sink, where, with which options."""

    uri: str
    scheme: str
    location: str
    options: tuple[tuple[str, str], ...]
    factory: type[Sink]

    def with_uri(self, uri: str) -> SinkSpec:
        return SinkSpec(uri, self.scheme, self.location, self.options, self.factory)

    def build(self, *, run_id: str, pid: int, host: str) -> Sink:
        """Construct the sink for one run, with ``{run_id}``, ``{pid}``, ``{host}`` filled."""
        values = {"run_id": run_id, "pid": str(pid), "host": host}
        location = self.location
        for name in _TEMPLATES:
            location = location.replace("{" + name + "}", values[name])
        try:
            return self.factory(location, dict(self.options))
        except SinkOptionValueError as exc:
            raise SinkOptionError(self.uri, str(exc)) from exc


def parse_uri(uri: str) -> SinkSpec:
    """Parse one sink URI; raise a ``SinkError`` subclass naming what is wrong."""
    if not isinstance(uri, str):
        raise TypeError(f"a sink URI must be a str, not {type(uri).__name__}: {uri!r}")
    if "://" not in uri:
        if uri.endswith(_BARE_SUFFIXES):
            uri_path = uri
            return parse_uri("jsonl://" + uri_path).with_uri(uri)
        raise UnknownSchemeError(
            uri,
            "not a sink URI: use scheme://location (known schemes: "
            + ", ".join(known_schemes())
            + ") or a path ending in .jsonl or .jsonl.gz",
        )
    scheme, _, rest = uri.partition("://")
    scheme = scheme.lower()
    if not _SCHEME.fullmatch(scheme):
        raise UnknownSchemeError(uri, f"{scheme!r} is not a URI scheme")
    factory = _load(uri, scheme)
    location, _, query = rest.partition("?")
    options: dict[str, str] = {}
    if query:
        try:
            pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True)
        except ValueError as exc:
            raise SinkOptionError(uri, f"malformed query string {query!r}") from exc
        for key, value in pairs:
            if key in options:
                raise SinkOptionError(uri, f"option {key!r} is given twice")
            options[key] = value
    unknown = sorted(set(options) - factory.options)
    if unknown:
        known = ", ".join(sorted(factory.options)) or "none"
        raise SinkOptionError(
            uri, f"unknown option {', '.join(map(repr, unknown))} for {scheme}://; known: {known}"
        )
    spec = SinkSpec(uri, scheme, location, tuple(sorted(options.items())), factory)
    # Sink constructors do no I/O: building one now checks option values
    # here, where the user can see the error, rather than in a lazy open.
    # This process's host and pid, as the open will have them: an empty host
    # would make `s3://{host}/...` look like a location with no bucket.
    spec.build(run_id="0" * 32, pid=os.getpid(), host=socket.gethostname())
    return spec


def uris_from_env() -> list[str]:
    """The URIs in ``$ROLLOUT_TRACE`` (comma-separated); none when unset or empty."""
    value = os.environ.get(ENV_VAR, "")
    return [part.strip() for part in value.split(",") if part.strip()]


# While rollout_trace.testing.capture_events() is active, every tracer that
# opens writes to the sinks this returns instead of its own.
capture_override: list[Callable[[], list[tuple[str, Sink]]]] = []


def build_sinks(
    specs: Sequence[SinkSpec], *, run_id: str, pid: int, host: str
) -> list[tuple[str, Sink]]:
    """Build (not open) one sink per spec for a run, or the capture sinks of
    ``rollout_trace.testing.capture_events()`` while it is active."""
    if capture_override:
        return capture_override[-1]()
    return [(spec.uri, spec.build(run_id=run_id, pid=pid, host=host)) for spec in specs]
