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

# Every Event subclass by tag, and the set of their types. `emit` checks
# `type(ev) in _EVENT_TYPES` because a set lookup costs a third of what
# isinstance() costs on a Struct.
_REGISTRY: dict[str, type[Event]] = {}
_EVENT_TYPES: set[type[Any]] = set()
_registry_version = [0]


def _snake_case(name: str) -> str:
    return _CAMEL_BOUNDARY.sub("_", name).lower()


class _EventMeta(msgspec.StructMeta):
    """Makes every event's own fields keyword-only and registers its tag.

    Keyword-only fields keep the envelope first on the wire (SPEC section 1)
    and let subclasses declare required fields after the envelope defaults.
    """

    def __new__(
        mcls, name: str, bases: tuple[type, ...], namespace: dict[str, Any], **kwargs: Any
    ) -> _EventMeta:
        kwargs.setdefault("kw_only", True)
        cls = super().__new__(mcls, name, bases, namespace, **kwargs)
        tag = cls.__struct_config__.tag
        if isinstance(tag, str):
            _REGISTRY[tag] = cls  # type: ignore[assignment]
            _EVENT_TYPES.add(cls)
            _registry_version[0] += 1
        return cls


class Event(
    msgspec.Struct,
    metaclass=_EventMeta,
    tag_field="event",
    tag=_snake_case,
    gc=False,
    kw_only=True,
):
    """Base of every event. Subclass it with ``tag="snake_name"`` for your own.

    The envelope (``time``, ``run_id``, ``seq``) is stamped by the tracer at
    ``emit``; pass only the event's own fields. ``gc=False``: events hold plain
    data, so the garbage collector need not track millions of queued ones.
    """

    time: float = 0.0
    run_id: str = ""
    seq: int = -1


# The base class itself is not an event anyone emits.
_REGISTRY.pop("event", None)
_EVENT_TYPES.discard(Event)


def event_types() -> dict[str, type[Event]]:
    """Every event class defined so far (built-in and user), by tag."""
    return dict(_REGISTRY)


# --- lifecycle events (SPEC section 2) ---------------------------------------


class TraceOpened(Event, kw_only=True):
    schema: int = SCHEMA_VERSION
    sdk_version: str
    pid: int
    host: str
    meta: dict[str, Any] = {}


class TraceClosed(Event):
    emitted: int
    written: int
    dropped: int
    invalid: int


LIFECYCLE_EVENTS: frozenset[str] = frozenset({"trace_opened", "trace_closed"})

# --- rollout events (SPEC section 3) ------------------------------------------

AbandonReason = Literal["dropped", "failed", "cancelled", "restart", "whole_group"]


class GroupReserved(Event):
    group_id: str
    prompt_id: int | str
    size: int
    weight_version: int
    target_step: int | None = None


class GroupAdmitted(Event):
    group_id: str
    prompt_id: int | str


class GroupSealed(Event):
    group_id: str
    prompt_id: int | str


class GroupDiscarded(Event):
    group_id: str
    prompt_id: int | str
    reason: str


class AttemptDispatched(Event):
    group_id: str
    prompt_id: int | str
    generation_index: int
    attempt: int
    weight_version: int


class AttemptSealed(Event):
    group_id: str
    prompt_id: int | str
    generation_index: int
    attempt: int


class AttemptRefused(Event):
    group_id: str
    prompt_id: int | str
    generation_index: int
    attempt: int
    reason: str


class AttemptResumed(Event):
    group_id: str
    prompt_id: int | str
    generation_index: int
    attempt: int
    turn: int


class AttemptAbandoned(Event):
    group_id: str
    prompt_id: int | str
    generation_index: int
    attempt: int
    reason: AbandonReason


class StepTrained(Event):
    step: int
    group_ids: list[str]


class WeightsSynced(Event):
    weight_version: int


class TrainerCheckpointPublished(Event):
    step: int
    path: str


class SnapshotPublished(Event):
    step: int
    path: str
    captured_at: float


class RestoreStarted(Event):
    path: str
    step: int


class RestoreFinished(Event):
    step: int
    unfinished_groups: list[str]

