"""Old home of the event classes, kept for the modules that import from it: see ``_schema``."""

from __future__ import annotations

from ._schema.events import (
    LIFECYCLE_EVENTS,
    SCHEMA_VERSION,
    AbandonReason,
    AttemptAbandoned,
    AttemptDispatched,
    AttemptRefused,
    AttemptResumed,
    AttemptSealed,
    Event,
    GroupAdmitted,
    GroupDiscarded,
    GroupReserved,
    GroupSealed,
    RestoreFinished,
    RestoreStarted,
    SnapshotPublished,
    StepTrained,
    TraceClosed,
    TraceOpened,
    TrainerCheckpointPublished,
    WeightsSynced,
    event_types,
    tag_of,
)
from ._schema.registry import REGISTRY

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
    "SCHEMA_VERSION",
    "LIFECYCLE_EVENTS",
    "event_types",
    "tag_of",
]

# The registry's own dict, not a copy: `type(ev) in _EVENT_TYPES` sees every
# class defined later.
_EVENT_TYPES = REGISTRY.emit_types


class _Version:
    """``_registry_version[0]``: the registry's version, for code that still reads it."""

    def __getitem__(self, index: int) -> int:
        if index != 0:
            raise IndexError(index)
        return REGISTRY.version


_registry_version = _Version()
