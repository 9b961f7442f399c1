"""Slim stand-ins for the built-in events, for reading at speed.

The restore-cost figures need few fields: a sibling's key and attempt, a few
steps, paths and times, and the envelope. Decoding into classes that declare
just these lets msgspec skip the rest (group ids, weight versions, metadata)
instead of building objects for them, about a fifth faster on a typical
trace. Their envelope fields are required, unlike ``Event``'s defaults, so a
line without one fails the block and is read again line by line, where it is
reported. These classes are not ``Event`` subclasses, so they never enter the
event registry; they serve the analysis and never leave it.
"""

from __future__ import annotations

from typing import Any, Union

import msgspec

from .._schema.events import event_types
from .._schema.registry import REGISTRY

__all__ = [
    "LeanEnvelope",
    "LeanAttempt",
    "LeanStepTrained",
    "LeanTrainerCheckpointPublished",
    "LeanSnapshotPublished",
    "LeanRestoreStarted",
    "LeanRestoreFinished",
    "LeanTraceOpened",
    "LEAN",
    "ENVELOPE_ONLY",
    "ATTEMPT_KIND",
    "DISPATCHED",
    "SEALED",
    "ENDED",
    "RESUMED",
    "lean_list_decoder",
]


class LeanEnvelope(msgspec.Struct, tag_field="event", gc=False, kw_only=True):
    time: float
    run_id: str
    seq: int


class LeanAttempt(LeanEnvelope):
    prompt_id: int | str
    generation_index: int
    attempt: int


class LeanStepTrained(LeanEnvelope, tag="step_trained"):
    step: int


class LeanTrainerCheckpointPublished(LeanEnvelope, tag="trainer_checkpoint_published"):
    step: int
    path: str


class LeanSnapshotPublished(LeanEnvelope, tag="snapshot_published"):
    step: int
    path: str
    captured_at: float


class LeanRestoreStarted(LeanEnvelope, tag="restore_started"):
    path: str
    step: int


class LeanRestoreFinished(LeanEnvelope, tag="restore_finished"):
    step: int


class LeanTraceOpened(LeanEnvelope, tag="trace_opened"):
    pass


def _slim_class(tag: str, base: type[LeanEnvelope]) -> type[LeanEnvelope]:
    name = "Lean" + "".join(part.title() for part in tag.split("_"))
    return type(name, (base,), {}, tag=tag)


_ATTEMPT_TAGS = (
    "attempt_dispatched",
    "attempt_sealed",
    "attempt_refused",
    "attempt_resumed",
    "attempt_abandoned",
)
# Events that no figure reads beyond their envelope.
ENVELOPE_ONLY = (
    "group_reserved",
    "group_admitted",
    "group_sealed",
    "group_discarded",
    "weights_synced",
    "trace_closed",
)

LEAN: dict[str, type[LeanEnvelope]] = {tag: _slim_class(tag, LeanAttempt) for tag in _ATTEMPT_TAGS}
LEAN.update({tag: _slim_class(tag, LeanEnvelope) for tag in ENVELOPE_ONLY})
for _cls in (
    LeanStepTrained,
    LeanTrainerCheckpointPublished,
    LeanSnapshotPublished,
    LeanRestoreStarted,
    LeanRestoreFinished,
    LeanTraceOpened,
):
    LEAN[_cls.__struct_config__.tag] = _cls  # type: ignore[index]

# What an attempt event does to its sibling, for the real and the lean class.
DISPATCHED, SEALED, ENDED, RESUMED = 1, 2, 3, 4
_KIND_BY_TAG = {
    "attempt_dispatched": DISPATCHED,
    "attempt_sealed": SEALED,
    "attempt_refused": ENDED,
    "attempt_abandoned": ENDED,
    "attempt_resumed": RESUMED,
}
ATTEMPT_KIND: dict[type[Any], int] = {}
for _tag, _kind in _KIND_BY_TAG.items():
    ATTEMPT_KIND[LEAN[_tag]] = _kind
    ATTEMPT_KIND[event_types()[_tag]] = _kind


def lean_list_decoder() -> msgspec.json.Decoder[Any]:
    """A decoder for a JSON array of events: lean where one exists, real otherwise."""
    return REGISTRY.cached("lean_list_decoder", _build_lean_list_decoder)


def _build_lean_list_decoder() -> msgspec.json.Decoder[Any]:
    types = tuple(LEAN.get(tag, cls) for tag, cls in REGISTRY.decodable_types().items())
    union: Any = Union[types]  # noqa: UP007
    return msgspec.json.Decoder(list[union])
