from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from samples import ROLLOUT_SAMPLES

import rollout_trace as rt
from rollout_trace._decoding import decode_line

# SPEC sections 2 and 3, field by field: (event, class, {field: type}).
SCHEMA: list[tuple[str, type[rt.Event], dict[str, Any]]] = [
    (
        "trace_opened",
        rt.TraceOpened,
        {"schema": int, "sdk_version": str, "pid": int, "host": str, "meta": dict[str, Any]},
    ),
    (
        "trace_closed",
        rt.TraceClosed,
        {"emitted": int, "written": int, "dropped": int, "invalid": int},
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
