"""Sink URIs: parsing, templates and the entry-point registry of sink classes."""

from __future__ import annotations

import difflib
import functools
import logging
import os
import re
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from urllib.parse import parse_qsl

from rollout_trace.sinks import JsonlSink, Sink

from .._errors import SinkError, SinkOptionError, UnknownSchemeError

__all__ = ["ENV_VAR", "SinkSpec", "parse_uri", "uris_from_env", "known_schemes", "build_sinks"]

ENV_VAR = "ROLLOUT_TRACE"
ENTRY_POINT_GROUP = "rollout_trace.sinks"
_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*")
_BARE_SUFFIXES = (".jsonl", ".jsonl.gz")
_TEMPLATES = ("run_id", "pid", "host")
# A ``{name}`` in a location: a template, known or not.
_TEMPLATE_REF = re.compile(r"\{([^{}/\\\s]*)\}")
logger = logging.getLogger("rollout_trace")


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
        raise SinkError(uri, f"the plugin for {scheme}:// is not a rollout_trace.Sink subclass")
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
        except SinkOptionError as exc:
            if exc.uri:
                raise
            raise SinkOptionError(self.uri, exc.reason) from exc


def parse_uri(uri: str) -> SinkSpec:
    """Parse one sink URI; raise a ``SinkError`` subclass naming what is wrong."""
    if not isinstance(uri, str):
        raise TypeError(f"a sink URI must be a str, not {type(uri).__name__}: {uri!r}")
    if "://" not in uri:
        if uri.endswith(_BARE_SUFFIXES):
            # A bare path: relative to the working folder on purpose.
            return _parse(uri, "jsonl", uri, bare=True)
        raise UnknownSchemeError(
            uri,
            "not a sink URI: use scheme://location (known schemes: "
            + ", ".join(known_schemes())
            + ") or a path ending in .jsonl or .jsonl.gz",
        )
    scheme, _, rest = uri.partition("://")
    return _parse(uri, scheme.lower(), rest)


def _parse(uri: str, scheme: str, rest: str, *, bare: bool = False) -> SinkSpec:
    """``parse_uri`` of ``scheme://rest``; errors name ``uri``, as the user wrote it."""
    if not _SCHEME.fullmatch(scheme):
        raise UnknownSchemeError(uri, f"{scheme!r} is not a URI scheme")
    factory = _load(uri, scheme)
    location, _, query = rest.partition("?")
    _check_templates(uri, location)
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
    if not bare and issubclass(factory, JsonlSink) and not _relative_on_purpose(location):
        _say_relative(uri, location)
    return spec


def _check_templates(uri: str, location: str) -> None:
    """Refuse a ``{name}`` that no template fills: it would be in the path as written."""
    for name in _TEMPLATE_REF.findall(location):
        if name not in _TEMPLATES:
            close = difflib.get_close_matches(name.lower(), _TEMPLATES, n=1)
            hint = f"did you mean {{{close[0]}}}? " if close else ""
            raise SinkError(
                uri,
                f"unknown template {{{name}}} in the location: {hint}the templates are "
                + ", ".join(f"{{{t}}}" for t in _TEMPLATES),
            )


def _relative_on_purpose(location: str) -> bool:
    return os.path.isabs(location) or location.startswith(("./", "../"))


# The relative jsonl:// URIs said already (once a process: tracers are made often).
_said_relative: set[str] = set()


def _say_relative(uri: str, location: str) -> None:
    """``jsonl://tmp/x.jsonl`` is relative (two slashes): most likely a slash left out."""
    if uri in _said_relative:
        return
    _said_relative.add(uri)
    scheme = uri.partition("://")[0]
    logger.warning(
        "rollout_trace: sink %r names a relative path (two slashes after %s:): it writes "
        "%s, under the working folder. For an absolute path write three slashes "
        "(%s:///%s); for a relative one on purpose, write %s://./%s",
        uri,
        scheme,
        os.path.abspath(location),
        scheme,
        location,
        scheme,
        location,
    )


def uris_from_env() -> list[str]:
    """The URIs in ``$ROLLOUT_TRACE`` (comma-separated); none when unset or empty."""
    value = os.environ.get(ENV_VAR, "")
    return [part.strip() for part in value.split(",") if part.strip()]


# While rollout_trace.testing.capture_events() is active, every tracer that
# opens writes to the sinks this returns instead of its own.
capture_override: list[Callable[[], list[tuple[str, Sink]]]] = []
# Beside each of them: whether that capture_events() is strict, which makes
# every tracer that opens inside it strict (``TracerConfig.strict``).
capture_strict: list[bool] = []


def build_sinks(
    specs: Sequence[SinkSpec], *, run_id: str, pid: int, host: str
) -> list[tuple[str, Sink]]:
    """Build (not open) one sink per spec for a run, or the capture sinks of
    ``rollout_trace.testing.capture_events()`` while it is active."""
    if capture_override:
        return capture_override[-1]()
    return [(spec.uri, spec.build(run_id=run_id, pid=pid, host=host)) for spec in specs]
