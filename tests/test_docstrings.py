"""Every public name, and every public method of a public class, says what it does.

``help(rt.Tracer.emit)`` once raised ``AttributeError`` (``emit`` was made per
run, on the instance, with no docstring).
"""

from __future__ import annotations

import inspect
import pydoc
from types import ModuleType
from typing import Any

import pytest

import rollout_trace as rt
import rollout_trace.testing
from rollout_trace import sinks

PUBLIC: list[tuple[ModuleType, str]] = [
    (module, name)
    for module in (rt, rollout_trace.testing, sinks)
    for name in module.__all__
    if not name.startswith("__")  # __version__: data
]


def _ours(cls: type) -> bool:
    return getattr(cls, "__module__", "").split(".")[0] in ("rollout_trace", "sinks")


def _doc(cls: type, name: str, member: Any) -> str | None:
    """What ``help()`` shows for ``cls.name``: its own docstring, or the one it overrides."""
    doc = member.__doc__ if isinstance(member, property) else inspect.getdoc(member)
    if doc:
        return doc
    for base in cls.__mro__[1:]:
        inherited = getattr(base, name, None)
        if inherited is not None and inspect.getdoc(inherited):
            return inspect.getdoc(inherited)
    return None


def _methods(cls: type) -> list[tuple[str, Any]]:
    """The public methods and properties ``cls`` and its bases of this project define."""
    found: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        if not _ours(klass):
            continue
        for name, member in vars(klass).items():
            if name.startswith("_"):
                continue
            if isinstance(member, (staticmethod, classmethod)):
                member = member.__func__
            if isinstance(member, property) or inspect.isfunction(member):
                found[name] = member
    return sorted(found.items())


@pytest.mark.parametrize(("module", "name"), PUBLIC, ids=[f"{m.__name__}.{n}" for m, n in PUBLIC])
def test_every_public_name_and_method_has_a_docstring(module: ModuleType, name: str) -> None:
    obj = getattr(module, name)
    # A class's own: one inherited (msgspec.Struct's, say) says nothing of it.
    doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else inspect.getdoc(obj)
    assert (doc or "").strip(), f"{module.__name__}.{name} has no docstring"
    if inspect.isclass(obj):
        bare = [m for m, member in _methods(obj) if not _doc(obj, m, member)]
        assert bare == [], f"{module.__name__}.{name}: methods without a docstring: {bare}"


@pytest.mark.parametrize("cls", [rt.Tracer, rt.SyncTracer])
def test_help_on_the_tracers_calls_works(cls: type) -> None:
    for name in ("emit", "flush", "counts", "close" if cls is rt.SyncTracer else "aclose"):
        assert inspect.getdoc(getattr(cls, name)), f"{cls.__name__}.{name}"
    text = pydoc.render_doc(cls.emit, renderer=pydoc.plaintext)
    assert "stamp its envelope" in text and "never blocks" in text


def test_an_open_tracer_s_emit_carries_the_docstring() -> None:
    with rt.sync_tracer("memory://") as t:
        assert t.emit.__doc__ == rt.SyncTracer.emit.__doc__
        rt.SyncTracer.emit(t, rt.WeightsSynced(weight_version=1))  # through the class
    assert t.counts.written == 1


@pytest.mark.parametrize(
    "make",
    [
        lambda: rt.tracer(enabled=False),
        lambda: rt.sync_tracer(enabled=False),
        lambda: rt.tracer("memory://"),  # no run open yet
    ],
    ids=["disabled-async", "disabled-sync", "not-open"],
)
def test_every_emit_a_tracer_holds_says_the_contract_and_refuses_a_non_event(make: Any) -> None:
    t = make()
    assert t.emit.__doc__ == rt.Tracer.emit.__doc__
    assert "Record ``ev``" in pydoc.render_doc(t.emit, renderer=pydoc.plaintext)
    # Off or on, the same mistake is refused at once.
    with pytest.raises(TypeError, match=r"emit\(\) takes a rollout_trace\.Event"):
        t.emit({"event": "step_trained"})
