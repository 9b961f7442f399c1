from __future__ import annotations

import pickle
import types
import typing
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from samples import ROLLOUT_SAMPLES

import rollout_trace as rt
from rollout_trace._schema.decoding import decode_line
from rollout_trace._schema.events import SinkTally
from rollout_trace._schema.registry import REGISTRY

# The README Reference, lifecycle and rollout events, field by field: (event, class, {field: type}).
SCHEMA: list[tuple[str, type[rt.Event], dict[str, Any]]] = [
    (
        "trace_opened",
        rt.TraceOpened,
        {"schema": int, "sdk_version": str, "pid": int, "host": str, "meta": dict[str, Any]},
    ),
    (
        "trace_closed",
        rt.TraceClosed,
        # `sinks`: an optional field added to schema 1, as the contract allows.
        {"emitted": int, "written": int, "dropped": int, "invalid": int, "sinks": list[SinkTally]},
    ),
    (
        "group_reserved",
        rt.GroupReserved,
        {
            "group_id": str,
            "prompt_id": int | str,
            "size": int,
            "weight_version": int,
            "target_step": int | None,
        },
    ),
    ("group_admitted", rt.GroupAdmitted, {"group_id": str, "prompt_id": int | str}),
    ("group_sealed", rt.GroupSealed, {"group_id": str, "prompt_id": int | str}),
    (
        "group_discarded",
        rt.GroupDiscarded,
        {"group_id": str, "prompt_id": int | str, "reason": str},
    ),
    (
        "attempt_dispatched",
        rt.AttemptDispatched,
        {
            "group_id": str,
            "prompt_id": int | str,
            "generation_index": int,
            "attempt": int,
            "weight_version": int,
        },
    ),
    (
        "attempt_sealed",
        rt.AttemptSealed,
        {"group_id": str, "prompt_id": int | str, "generation_index": int, "attempt": int},
    ),
    (
        "attempt_refused",
        rt.AttemptRefused,
        {
            "group_id": str,
            "prompt_id": int | str,
            "generation_index": int,
            "attempt": int,
            "reason": str,
        },
    ),
    (
        "attempt_resumed",
        rt.AttemptResumed,
        {
            "group_id": str,
            "prompt_id": int | str,
            "generation_index": int,
            "attempt": int,
            "turn": int,
        },
    ),
    (
        "attempt_abandoned",
        rt.AttemptAbandoned,
        {
            "group_id": str,
            "prompt_id": int | str,
            "generation_index": int,
            "attempt": int,
            "reason": typing.Literal["dropped", "failed", "cancelled", "restart", "whole_group"],
        },
    ),
    ("step_trained", rt.StepTrained, {"step": int, "group_ids": list[str]}),
    ("weights_synced", rt.WeightsSynced, {"weight_version": int}),
    ("trainer_checkpoint_published", rt.TrainerCheckpointPublished, {"step": int, "path": str}),
    (
        "snapshot_published",
        rt.SnapshotPublished,
        {"step": int, "path": str, "captured_at": float},
    ),
    ("restore_started", rt.RestoreStarted, {"path": str, "step": int}),
    ("restore_finished", rt.RestoreFinished, {"step": int, "unfinished_groups": list[str]}),
]


@pytest.mark.parametrize(("tag", "cls", "fields"), SCHEMA, ids=[row[0] for row in SCHEMA])
def test_schema_matches_spec(tag: str, cls: type[rt.Event], fields: dict[str, Any]) -> None:
    assert cls.__struct_config__.tag == tag
    assert cls.__struct_config__.tag_field == "event"
    hints = typing.get_type_hints(cls)
    own = {
        name: hints[name]
        for name in cls.__struct_fields__
        if name not in rt.Event.__struct_fields__
    }
    assert own == fields
    assert rt.event_types()[tag] is cls


def test_every_spec_event_is_covered_and_exported() -> None:
    assert {tag for tag, _, _ in SCHEMA} == set(rt.event_types()) - _user_tags()
    for _, cls, _ in SCHEMA:
        assert getattr(rt, cls.__name__) is cls
        assert cls.__name__ in rt.__all__


def _user_tags() -> set[str]:
    return {
        tag
        for tag, cls in rt.event_types().items()
        if not cls.__module__.startswith("rollout_trace")
    }


@pytest.mark.parametrize(
    ("class_name", "explicit", "expected"),
    [
        ("GpuMemorySampled", None, "gpu_memory_sampled"),  # CamelCase -> snake_case
        ("KVCacheEvicted", None, "kv_cache_evicted"),  # an acronym stays one word
        ("Step2Done", None, "step2_done"),  # digits stay with their word
        ("Anything", "custom_tag", "custom_tag"),  # tag= wins
    ],
)
def test_user_event_tags(class_name: str, explicit: str | None, expected: str) -> None:
    kwargs = {"tag": explicit} if explicit else {}
    cls = type(class_name, (rt.Event,), {"__annotations__": {"x": int}}, **kwargs)
    assert cls.__struct_config__.tag == expected
    assert rt.event_types()[expected] is cls


def test_envelope_comes_first_on_the_wire() -> None:
    ev = rt.WeightsSynced(weight_version=3, time=1.5, run_id="r" * 32, seq=4)
    assert msgspec.json.encode(ev) == (
        b'{"event":"weights_synced","time":1.5,"run_id":"' + b"r" * 32 + b'","seq":4,'
        b'"weight_version":3}'
    )


@pytest.mark.parametrize("ev", ROLLOUT_SAMPLES, ids=lambda ev: type(ev).__name__)
def test_every_rollout_event_round_trips_through_a_file(ev: rt.Event, tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    with rt.sync_tracer(str(path)) as t:
        t.emit(ev)
    lines = path.read_bytes().splitlines()
    assert len(lines) == 3
    back = decode_line(lines[1])
    assert type(back) is type(ev)
    assert back == ev  # emit stamped the envelope on the object itself
    assert back.seq == 1 and len(back.run_id) == 32 and back.time > 0


class Sampled(rt.Event, tag="np_sampled"):
    value: Any
    array: Any = None


@pytest.mark.parametrize(
    ("value", "array", "expected"),
    [
        (np.float32(1.5), None, {"value": 1.5, "array": None}),  # a numpy scalar
        (np.int64(7), np.arange(3), {"value": 7, "array": [0, 1, 2]}),  # an array
        (np.bool_(True), np.zeros((2, 2)), {"value": True, "array": [[0.0, 0.0], [0.0, 0.0]]}),
    ],
)
def test_numpy_values_are_encoded_through_orjson(
    value: Any, array: Any, expected: dict[str, Any], tmp_path: Path
) -> None:
    path = tmp_path / "np.jsonl"
    with rt.sync_tracer(str(path)) as t:
        t.emit(Sampled(value=value, array=array))
    line = msgspec.json.decode(path.read_bytes().splitlines()[1])
    assert {k: line[k] for k in expected} == expected


# --- one registry: tags that clash, classes defined again ------------------------


def _define(module_name: str, source: str) -> types.ModuleType:
    """Run ``source`` as the body of a fresh module named ``module_name``."""
    module = types.ModuleType(module_name)
    source = "import rollout_trace as rt\nfrom typing import Any, ClassVar\n" + source
    # dont_inherit: not this file's `from __future__ import annotations`, whose
    # string annotations msgspec would look up in a module that is not imported.
    exec(compile(source, module_name, "exec", dont_inherit=True), vars(module))
    return module


@pytest.mark.parametrize(
    ("first", "second", "tag", "holder", "refused"),
    [
        # The same class name in two modules: both default to one tag.
        (
            ("clash_a", "class Clash(rt.Event):\n    x: int\n"),
            ("clash_b", "class Clash(rt.Event):\n    y: str\n"),
            "clash",
            "clash_a.Clash",
            "clash_b.Clash",
        ),
        # A user's class named like a built-in event.
        (
            None,
            ("user_steps", "class StepTrained(rt.Event):\n    step: int\n"),
            "step_trained",
            "rollout_trace.StepTrained",
            "user_steps.StepTrained",
        ),
        # A class whose name differs but snake-cases to a tag already taken.
        (
            ("gpu_a", "class GpuSampled(rt.Event):\n    x: int\n"),
            ("gpu_b", "class GPUSampled(rt.Event):\n    x: int\n"),
            "gpu_sampled",
            "gpu_a.GpuSampled",
            "gpu_b.GPUSampled",
        ),
    ],
    ids=["same-name-two-modules", "named-like-a-built-in", "same-snake-case"],
)
def test_a_second_class_with_a_tag_is_refused_at_definition(
    first: tuple[str, str] | None,
    second: tuple[str, str],
    tag: str,
    holder: str,
    refused: str,
) -> None:
    if first is not None:
        _define(*first)
    before = rt.event_types()
    with pytest.raises(rt.EventTagError) as info:
        _define(*second)
    message = str(info.value)
    assert f"'{tag}'" in message and holder in message and refused in message
    assert 'tag="' in message  # says how to fix it
    assert isinstance(info.value, rt.RolloutTraceError) and isinstance(info.value, TypeError)
    assert info.value.tag == tag
    # The refused class left nothing behind: not emittable, not decoded into.
    assert not [c for c in REGISTRY.emit_types if f"{c.__module__}.{c.__qualname__}" == refused]
    assert rt.event_types()[tag] is before[tag]
    assert type(decode_line(msgspec.json.encode(_sample_of(before[tag])))) is before[tag]


def _sample_of(cls: type[rt.Event]) -> rt.Event:
    for ev in ROLLOUT_SAMPLES:
        if type(ev) is cls:
            return msgspec.structs.replace(ev, time=1.0, run_id="r" * 32, seq=1)
    return cls(x=1, time=1.0, run_id="r" * 32, seq=1)  # type: ignore[call-arg]


def test_an_explicit_tag_that_is_taken_is_refused_at_the_next_lookup(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # msgspec sets an explicit tag after every hook of ours has run, so the
    # clash shows when a tag is next looked up (a warning), and at emit.
    module = _define("late_clash", "class Mine(rt.Event, tag='weights_synced'):\n    x: int\n")
    with caplog.at_level("WARNING", logger="rollout_trace"):
        rt.event_types()
    assert any("late_clash.Mine" in r.getMessage() for r in caplog.records)
    with pytest.raises(rt.EventTagError, match=r"late_clash\.Mine.*rollout_trace\.WeightsSynced"):
        REGISTRY.emit_type(module.Mine)
    assert module.Mine not in REGISTRY.emit_types
    assert rt.event_types()["weights_synced"] is rt.WeightsSynced


def test_a_class_defined_again_replaces_the_old_one() -> None:
    # A module reloaded or a notebook cell run twice: same module, same qualname.
    source = "class Redefined(rt.Event):\n    x: int\n"
    old = _define("redefining", source).Redefined
    new = _define("redefining", source).Redefined
    line = msgspec.json.encode(new(x=1, time=1.0, run_id="r", seq=0))
    assert new is not old
    assert rt.event_types()["redefined"] is new
    assert type(decode_line(line)) is new
    # Objects made from the old class can still be emitted.
    assert REGISTRY.emit_types[old] is False and REGISTRY.emit_types[new] is False
    # ... and a definition that changes the tag frees the old one.
    newer = _define("redefining", "class Redefined(rt.Event, tag='redefined_2'):\n    x: int\n")
    types_now = rt.event_types()
    assert types_now["redefined_2"] is newer.Redefined and "redefined" not in types_now


# --- urgent events -----------------------------------------------------------------

URGENT = {
    rt.SnapshotPublished,
    rt.TrainerCheckpointPublished,
    rt.RestoreStarted,
    rt.RestoreFinished,
    rt.StepTrained,
}


@pytest.mark.parametrize(("tag", "cls", "fields"), SCHEMA, ids=[row[0] for row in SCHEMA])
def test_urgent_flags_of_the_built_in_events(
    tag: str, cls: type[rt.Event], fields: dict[str, Any]
) -> None:
    expected = cls in URGENT  # the five events a crash must not lose
    assert cls.urgent is expected
    assert REGISTRY.emit_types[cls] is expected
    assert "urgent" not in cls.__struct_fields__


def test_a_user_event_marks_itself_urgent_with_a_class_variable() -> None:
    module = _define(
        "urgent_user",
        "class Preempted(rt.Event):\n"
        "    urgent: ClassVar[bool] = True\n"
        "    limit: ClassVar[int] = 3\n"  # any class variable stays off the wire
        "    node: str\n"
        "class Later(Preempted, tag='preempted_later'):\n"  # inherited
        "    pass\n",
    )
    cls = module.Preempted
    assert cls.urgent is True and REGISTRY.emit_types[cls] is True
    # Later is the last class defined: emit's slow path settles it.
    assert REGISTRY.emit_type(module.Later) is True and REGISTRY.emit_types[module.Later]
    assert set(cls.__struct_fields__) == {"node", "time", "run_id", "seq"}
    wire = msgspec.json.decode(msgspec.json.encode(cls(node="n1")))
    assert set(wire) == {"event", "node", "time", "run_id", "seq"}
    back = decode_line(msgspec.json.encode(cls(node="n1", time=1.0, run_id="r", seq=0)))
    assert type(back) is cls and msgspec.structs.asdict(back)["node"] == "n1"


def test_urgent_declared_as_a_field_is_refused() -> None:
    with pytest.raises(TypeError, match=r"ClassVar\[bool\] = True"):
        _define("urgent_field", "class Loud(rt.Event):\n    urgent: bool = True\n")
    assert "loud" not in rt.event_types()


# --- one public home ---------------------------------------------------------------


@pytest.mark.parametrize(
    "cls",
    [rt.Event, *(cls for _, cls, _ in SCHEMA), rt.UnknownEvent, rt.EventTagError],
    ids=lambda cls: cls.__name__,
)
def test_public_classes_live_in_rollout_trace(cls: type[Any]) -> None:
    assert cls.__module__ == "rollout_trace"
    assert getattr(rt, cls.__name__) is cls and cls.__name__ in rt.__all__
    if issubclass(cls, msgspec.Struct):
        msgspec.inspect.type_info(cls)  # its annotations still resolve


@pytest.mark.parametrize("ev", ROLLOUT_SAMPLES, ids=lambda ev: type(ev).__name__)
def test_events_pickle_and_round_trip(ev: rt.Event) -> None:
    assert pickle.loads(pickle.dumps(ev)) == ev
    assert msgspec.json.Decoder(type(ev)).decode(msgspec.json.encode(ev)) == ev


def test_one_registry_serves_emit_and_decoding() -> None:
    assert rt.AttemptDispatched in REGISTRY.emit_types
    version = REGISTRY.version
    _define("bump_version", "class Bumped(rt.Event):\n    x: int\n")
    rt.event_types()
    assert REGISTRY.version > version
    assert "bumped" in REGISTRY.tags()
