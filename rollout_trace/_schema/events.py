"""The event classes: one tagged msgspec Struct base and the schema (docs: Reference)."""

# No `from __future__ import annotations`: msgspec would resolve string
# annotations in the module named by `__module__`, which is `rollout_trace`
# for these classes (see the end of the module), where `Any` is not defined.
from typing import Any, ClassVar, Literal

import msgspec

from .registry import REGISTRY

__all__ = [
    "Event",
    "TraceOpened",
    "TraceClosed",
    "SinkTally",
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

SCHEMA_VERSION = 1


class Event(msgspec.Struct, tag_field="event", tag=REGISTRY.default_tag, gc=False, kw_only=True):
    """Base of every event. Subclass it with ``tag="snake_name"`` for your own.

    The envelope (``time``, ``run_id``, ``seq``) is stamped by the tracer at
    ``emit``; pass only the event's own fields. Without ``tag=`` the tag is the
    class name in snake_case; two classes may not share a tag, and options that
    change the line (``array_like``, ``tag_field``, ``tag=False``) are refused
    (``EventTagError``).
    ``gc=False``: events hold plain data, so the garbage collector need not
    track millions of queued ones.

    ``urgent``: a class that sets ``urgent: ClassVar[bool] = True`` in its body
    has its events written at once instead of at the next flush interval (for
    the rare events a crash must not lose). It is a class variable, never a
    field on the wire.
    """

    time: float = 0.0
    run_id: str = ""
    seq: int = -1

    urgent: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # A custom metaclass would be the tidier hook, but msgspec then takes a
        # slower path for every construction (measured 3-4x): register here.
        super().__init_subclass__(**kwargs)
        REGISTRY.add(cls)


def tag_of(cls: type[Event]) -> str:
    """The wire name of an event class."""
    tag = cls.__struct_config__.tag
    assert isinstance(tag, str)
    return tag


def event_types() -> dict[str, type[Event]]:
    """Every event class defined so far (built-in and user), by tag."""
    # The registry holds nothing but Event subclasses (Event.__init_subclass__).
    return REGISTRY.event_types()  # type: ignore[return-value]


# --- lifecycle events (docs: Reference > Lifecycle events) -----------------


class TraceOpened(Event, kw_only=True):
    """The first line of every run (``seq`` 0), written by the tracer as it opens.

    ``schema`` is the version of the rollout schema the run writes (1);
    ``sdk_version`` the version of rollout_trace that wrote it; ``pid`` and
    ``host`` say which process on which machine; ``meta`` is the user's run
    metadata as passed to the tracer (``{}`` when none was).
    """

    schema: int = SCHEMA_VERSION
    sdk_version: str
    pid: int
    host: str
    meta: dict[str, Any] = {}


class SinkTally(msgspec.Struct, kw_only=True, gc=False):
    """One sink's part of ``trace_closed``: the events it wrote, and why it
    stopped (``error``, ``None`` if it never failed)."""

    uri: str
    written: int
    error: str | None = None


class TraceClosed(Event, kw_only=True):
    """The last line of a run that closed cleanly; a killed run has none.

    The counts cover the run's ``emit`` calls, leaving out the two lifecycle
    events: ``emitted`` of them in all, ``written`` that at least one sink
    acknowledged writing, ``dropped`` that no sink wrote (a full buffer, the
    close deadline, every sink failed) and ``invalid`` that could not be
    encoded or held a value their field's type does not allow, so that
    ``emitted == written + dropped + invalid``.
    """

    emitted: int
    written: int
    dropped: int
    invalid: int
    # Added to schema 1 (an optional field): what each sink acknowledged. A
    # sink that never failed holds exactly its ``written`` lines of the run.
    sinks: list[SinkTally] = []


LIFECYCLE_EVENTS: frozenset[str] = frozenset({"trace_opened", "trace_closed"})

# --- rollout events (docs: Reference > Rollout events) ---------------------

AbandonReason = Literal["dropped", "failed", "cancelled", "restart", "whole_group"]


class GroupReserved(Event, kw_only=True):
    """The controller took on a group: one prompt and the generations it will make of it.

    ``group_id`` names the group within the run (a new id in every run unless
    the group was restored); ``prompt_id`` is the prompt, the part of a
    sibling's key that holds across runs; ``size`` is how many generations the
    group has; ``weight_version`` the policy weights in use when it was reserved;
    ``target_step`` the training step it is meant for, or None when it has none.
    """

    group_id: str
    prompt_id: int | str
    size: int
    weight_version: int
    target_step: int | None = None


class GroupAdmitted(Event, kw_only=True):
    """The controller admitted a reserved group into its rollout work.

    ``group_id`` and ``prompt_id`` as in ``GroupReserved``.
    """

    group_id: str
    prompt_id: int | str


class GroupSealed(Event, kw_only=True):
    """The controller sealed a group: its generations are final, ready for training.

    ``group_id`` and ``prompt_id`` as in ``GroupReserved``.
    """

    group_id: str
    prompt_id: int | str


class GroupDiscarded(Event, kw_only=True):
    """The controller threw a group away without training on it.

    ``group_id`` and ``prompt_id`` as in ``GroupReserved``; ``reason`` is the
    controller's own word for why.
    """

    group_id: str
    prompt_id: int | str
    reason: str


class AttemptDispatched(Event, kw_only=True):
    """One try of one generation slot (a sibling) was sent to an inference worker.

    ``group_id`` and ``prompt_id`` name the group; ``generation_index`` the
    slot within it (with ``prompt_id``, the sibling's key across runs);
    ``attempt`` counts this sibling's tries from 0 within the run;
    ``weight_version`` the policy weights the try is generated with.
    """

    group_id: str
    prompt_id: int | str
    generation_index: int
    attempt: int
    weight_version: int


class AttemptSealed(Event, kw_only=True):
    """A try finished and its result was kept; it is no longer in flight.

    Fields name the try as in ``AttemptDispatched``.
    """

    group_id: str
    prompt_id: int | str
    generation_index: int
    attempt: int


class AttemptRefused(Event, kw_only=True):
    """The controller refused a try; like a seal or an abandon, this ends the attempt.

    Fields name the try as in ``AttemptDispatched``; ``reason`` is the
    controller's own word for why.
    """

    group_id: str
    prompt_id: int | str
    generation_index: int
    attempt: int
    reason: str


class AttemptResumed(Event, kw_only=True):
    """After a restore, a try interrupted by the stop goes on from where it was.

    Fields name the try as in ``AttemptDispatched`` (``attempt`` as the run
    before numbered it); ``turn`` is the turn it resumes from. For restore
    costs the try starts again in this run, at this event's time.
    """

    group_id: str
    prompt_id: int | str
    generation_index: int
    attempt: int
    turn: int


class AttemptAbandoned(Event, kw_only=True):
    """A try ended without a kept result.

    Fields name the try as in ``AttemptDispatched``. ``reason`` is one of
    ``dropped`` (thrown away by the controller, e.g. stale), ``failed`` (the
    try raised), ``cancelled`` (stopped on purpose, e.g. at the run's end),
    ``restart`` (a restore found it interrupted and starts it over) and
    ``whole_group`` (its group was restarted, taking it along).
    """

    group_id: str
    prompt_id: int | str
    generation_index: int
    attempt: int
    reason: AbandonReason


class StepTrained(Event, kw_only=True):
    """The trainer finished a training step.

    ``step`` is the step's number; ``group_ids`` the groups it trained on.
    """

    urgent: ClassVar[bool] = True

    step: int
    group_ids: list[str]


class WeightsSynced(Event, kw_only=True):
    """New policy weights reached the inference workers.

    ``weight_version`` is the version they now generate with.
    """

    weight_version: int


class TrainerCheckpointPublished(Event, kw_only=True):
    """The trainer wrote a checkpoint that a later run can restore from.

    ``step`` is the training step it holds; ``path`` where it was written.
    When no snapshot matches a restore's path, this event's time stands in for
    the moment the restored state was captured.
    """

    urgent: ClassVar[bool] = True

    step: int
    path: str


class SnapshotPublished(Event, kw_only=True):
    """The controller wrote a snapshot of its own state that a later run can restore.

    ``step`` is the training step it goes with; ``path`` where it was written;
    ``captured_at`` the wall-clock time (Unix seconds) the state in it was
    taken, which can be earlier than this event: work sealed after it is not
    in the snapshot and is redone after a restore.
    """

    urgent: ClassVar[bool] = True

    step: int
    path: str
    captured_at: float


class RestoreStarted(Event, kw_only=True):
    """A run began to load a snapshot or checkpoint: its rollout work starts with a restore.

    ``path`` is what it restores from (matched against the ``path`` of the
    stopped run's ``SnapshotPublished`` or ``TrainerCheckpointPublished``);
    ``step`` the training step that holds.
    """

    urgent: ClassVar[bool] = True

    path: str
    step: int


class RestoreFinished(Event, kw_only=True):
    """The restore is complete and the run goes on with new work.

    ``step`` is the restored training step; ``unfinished_groups`` the ids of
    the groups that were loaded unfinished.
    """

    urgent: ClassVar[bool] = True

    step: int
    unfinished_groups: list[str]


# One public home: reprs, pickles and error messages say `rollout_trace.X`.
for _cls in (
    Event,
    TraceOpened,
    TraceClosed,
    GroupReserved,
    GroupAdmitted,
    GroupSealed,
    GroupDiscarded,
    AttemptDispatched,
    AttemptSealed,
    AttemptRefused,
    AttemptResumed,
    AttemptAbandoned,
    StepTrained,
    WeightsSynced,
    TrainerCheckpointPublished,
    SnapshotPublished,
    RestoreStarted,
    RestoreFinished,
):
    _cls.__module__ = "rollout_trace"
del _cls
