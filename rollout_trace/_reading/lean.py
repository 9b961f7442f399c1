"""Twins of the built-in events for the cost analysis, which check their envelope themselves.

A lean class declares every field of its event, with the same type and
default, so that it accepts exactly the lines the event class does: whether
a line is read must not depend on which decoder a block was given to. It
differs in the envelope alone: ``Event`` gives it defaults (time 0.0,
run_id "", seq -1, so that users can build events without one), which the
reader must then look for in every event it decodes; here the fields are
required and constrained, so msgspec rejects a bad envelope inside its one
call per block. These classes are not ``Event`` subclasses, so they never
enter the event registry; they serve the analysis and never leave it.
"""

from __future__ import annotations

from typing import Annotated, Any, Union, cast

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
    "lean_decoder",
    "lean_list_decoder",
    "lean_holds_real_classes",
]

# What `envelope_problem` in `_schema.decoding` asks of an envelope, as
# constraints msgspec checks while it decodes.
_Time = Annotated[float, msgspec.Meta(gt=0.0)]
_RunId = Annotated[str, msgspec.Meta(min_length=1)]
_Seq = Annotated[int, msgspec.Meta(ge=0)]


class LeanEnvelope(msgspec.Struct, tag_field="event", gc=False, kw_only=True):
    time: _Time
    run_id: _RunId
    seq: _Seq


class LeanAttempt(LeanEnvelope):
    group_id: str
    prompt_id: int | str
    generation_index: int
    attempt: int


class LeanStepTrained(LeanEnvelope, tag="step_trained"):
    step: int
    group_ids: list[str]


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
    unfinished_groups: list[str]


class LeanTraceOpened(LeanEnvelope, tag="trace_opened", kw_only=True):
    schema: int = 1
    sdk_version: str
    pid: int
    host: str
    meta: dict[str, Any] = {}


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
_ENVELOPE = frozenset(LeanEnvelope.__struct_fields__)


def _fields(cls: type[Any]) -> list[tuple[str, Any, Any]]:
    """``cls``'s fields beyond the envelope: name, type, default (``NODEFAULT`` if required)."""
    out = []
    for f in msgspec.structs.fields(cls):
        if f.name in _ENVELOPE:
            continue
        default = f.default
        if f.default_factory is not msgspec.NODEFAULT:
            default = f.default_factory()
        out.append((f.name, f.type, default))
    return out


def _slim_class(tag: str, base: type[LeanEnvelope]) -> type[LeanEnvelope]:
    """The lean twin of the event tagged ``tag``: its fields on ``base``."""
    own = {name for name, _, _ in _fields(base)}
    fields: list[Any] = []
    for name, typ, default in _fields(event_types()[tag]):
        if name in own:
            continue
        fields.append((name, typ) if default is msgspec.NODEFAULT else (name, typ, default))
    name = "Lean" + "".join(part.title() for part in tag.split("_"))
    slim = msgspec.defstruct(name, fields, bases=(base,), tag=tag, kw_only=True, module=__name__)
    # A module attribute, as pickle finds a class: folds cross processes (``--jobs``).
    globals()[name] = slim
    return cast("type[LeanEnvelope]", slim)


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


def _check_twins() -> None:
    """Every built-in event has a twin, field for field (the written ones too)."""
    real = event_types()
    missing = {tag for tag, cls in real.items() if cls.__module__ == "rollout_trace"} - set(LEAN)
    if missing:
        raise TypeError(f"built-in events without a lean twin: {sorted(missing)}")
    for tag, lean in LEAN.items():
        if _fields(lean) != _fields(real[tag]) or hasattr(real[tag], "__post_init__"):
            raise TypeError(
                f"{lean.__name__} must declare the fields of {real[tag].__name__} "
                f"with their types and defaults: {_fields(lean)} != {_fields(real[tag])}"
            )


_check_twins()

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


def lean_decoder() -> msgspec.json.Decoder[Any]:
    """A decoder for one event, or for lines of them (``decode_lines``): lean where
    a twin exists, real otherwise."""
    return _lean()[1]


def lean_list_decoder() -> msgspec.json.Decoder[Any]:
    """A decoder for a JSON array of events: lean where a twin exists, real otherwise."""
    return _lean()[0]


def lean_holds_real_classes() -> bool:
    """Whether ``lean_decoder()`` decodes some events (users') into real classes,
    whose envelope defaults the reader must then look for."""
    return _lean()[2]


def _lean() -> tuple[msgspec.json.Decoder[Any], msgspec.json.Decoder[Any], bool]:
    return REGISTRY.cached("lean_decoders", _build_lean_decoders)


def _build_lean_decoders() -> tuple[msgspec.json.Decoder[Any], msgspec.json.Decoder[Any], bool]:
    classes = REGISTRY.decodable_types()
    types = tuple(LEAN.get(tag, cls) for tag, cls in classes.items())
    union: Any = Union[types]  # noqa: UP007
    holds_real = not set(classes) <= set(LEAN)
    return msgspec.json.Decoder(list[union]), msgspec.json.Decoder(union), holds_real
