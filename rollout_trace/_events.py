"""Typed events: one tagged msgspec Struct base and the schema pinned in SPEC.md."""

from __future__ import annotations

import re
from typing import Any, Literal

import msgspec

__all__ = [
    "Event",
    "TraceOpened",
    "TraceClosed",
    "GroupReserved",
    "GroupAdmitted",
    "GroupSealed",
    "GroupDiscarded",
    "AttemptDispatched",
    "AttemptSealed",
    "AttemptRefused",
    "AttemptResumed",
    "AttemptAbandoned",
    "StepTrained",
    "WeightsSynced",
    "TrainerCheckpointPublished",
    "SnapshotPublished",
    "RestoreStarted",
    "RestoreFinished",
    "AbandonReason",
    "event_types",
    "LIFECYCLE_EVENTS",
]

SCHEMA_VERSION = 1

_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")

# Every Event subclass, in the order they were defined. `emit` checks
# `type(ev) in _EVENT_TYPES` because a set lookup costs a third of what
# isinstance() costs on a Struct.
_DEFINED: list[type[Event]] = []
_EVENT_TYPES: set[type[Any]] = set()
_registry_version = [0]
_by_tag: dict[str, Any] = {"version": -1, "map": {}}


def _snake_case(name: str) -> str:
    return _CAMEL_BOUNDARY.sub("_", name).lower()


class Event(msgspec.Struct, tag_field="event", tag=_snake_case, gc=False, kw_only=True):
    """Base of every event. Subclass it with ``tag="snake_name"`` for your own.

    The envelope (``time``, ``run_id``, ``seq``) is stamped by the tracer at
    ``emit``; pass only the event's own fields. Without ``tag=`` the tag is the
    class name in snake_case. ``gc=False``: events hold plain data, so the
    garbage collector need not track millions of queued ones.
    """

    time: float = 0.0
    run_id: str = ""
    seq: int = -1

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # A custom metaclass would be the tidier hook, but msgspec then takes a
        # slower path for every construction (measured 3-4x): register here.
        super().__init_subclass__(**kwargs)
        _DEFINED.append(cls)
        _EVENT_TYPES.add(cls)
        _registry_version[0] += 1


def tag_of(cls: type[Event]) -> str:
    """The wire name of an event class."""
    tag = cls.__struct_config__.tag
    assert isinstance(tag, str)
    return tag


def _registry() -> dict[str, type[Event]]:
    if _by_tag["version"] != _registry_version[0]:
        # A later class with the same tag replaces the earlier one (a module
        # reloaded, a class redefined in a notebook).
        _by_tag["map"] = {tag_of(cls): cls for cls in _DEFINED}
        _by_tag["version"] = _registry_version[0]
    registry: dict[str, type[Event]] = _by_tag["map"]
    return registry


def event_types() -> dict[str, type[Event]]:
    """Every event class defined so far (built-in and user), by tag."""
    return dict(_registry())


# --- lifecycle events (SPEC section 2) ---------------------------------------


class TraceOpened(Event, kw_only=True):
    schema: int = SCHEMA_VERSION
    sdk_version: str
    pid: int
    host: str
    meta: dict[str, Any] = {}


class TraceClosed(Event, kw_only=True):
    emitted: int
    written: int
    dropped: int
    invalid: int


LIFECYCLE_EVENTS: frozenset[str] = frozenset({"trace_opened", "trace_closed"})

# --- rollout events (SPEC section 3) ------------------------------------------

AbandonReason = Literal["dropped", "failed", "cancelled", "restart", "whole_group"]


class GroupReserved(Event, kw_only=True):
    group_id: str
    prompt_id: int | str
    size: int
    weight_version: int
    target_step: int | None = None


class GroupAdmitted(Event, kw_only=True):
    group_id: str
    prompt_id: int | str


class GroupSealed(Event, kw_only=True):
    group_id: str
    prompt_id: int | str


class GroupDiscarded(Event, kw_only=True):
    group_id: str
    prompt_id: int | str
    reason: str


class AttemptDispatched(Event, kw_only=True):
    group_id: str
    prompt_id: int | str
    generation_index: int
    attempt: int
    weight_version: int


class AttemptSealed(Event, kw_only=True):
    group_id: str
    prompt_id: int | str
    generation_index: int
    attempt: int


class AttemptRefused(Event, kw_only=True):
    group_id: str
    prompt_id: int | str
    generation_index: int
    attempt: int
    reason: str


class AttemptResumed(Event, kw_only=True):
    group_id: str
    prompt_id: int | str
    generation_index: int
    attempt: int
    turn: int


class AttemptAbandoned(Event, kw_only=True):
    group_id: str
    prompt_id: int | str
    generation_index: int
    attempt: int
    reason: AbandonReason


class StepTrained(Event, kw_only=True):
    step: int
    group_ids: list[str]


class WeightsSynced(Event, kw_only=True):
    weight_version: int


class TrainerCheckpointPublished(Event, kw_only=True):
    step: int
    path: str


class SnapshotPublished(Event, kw_only=True):
    step: int
    path: str
    captured_at: float


class RestoreStarted(Event, kw_only=True):
    path: str
    step: int


class RestoreFinished(Event, kw_only=True):
    step: int
    unfinished_groups: list[str]
