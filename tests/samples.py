"""One sample of every built-in event, with every field set (shared by the tests)."""

from __future__ import annotations

import rollout_trace as rt

ROLLOUT_SAMPLES: list[rt.Event] = [
    rt.GroupReserved(group_id="g1", prompt_id=42, size=4, weight_version=3, target_step=7),
    rt.GroupReserved(group_id="g2", prompt_id="p-7", size=2, weight_version=3, target_step=None),
    rt.GroupAdmitted(group_id="g1", prompt_id=42),
    rt.GroupSealed(group_id="g1", prompt_id=42),
    rt.GroupDiscarded(group_id="g1", prompt_id=42, reason="stale"),
    rt.AttemptDispatched(
        group_id="g1", prompt_id=42, generation_index=1, attempt=0, weight_version=3
    ),
    rt.AttemptSealed(group_id="g1", prompt_id=42, generation_index=1, attempt=0),
    rt.AttemptRefused(group_id="g1", prompt_id=42, generation_index=1, attempt=1, reason="full"),
    rt.AttemptResumed(group_id="g1", prompt_id=42, generation_index=1, attempt=2, turn=3),
    rt.AttemptAbandoned(
        group_id="g1", prompt_id=42, generation_index=1, attempt=2, reason="whole_group"
    ),
    rt.StepTrained(step=5, group_ids=["g1", "g2"]),
    rt.WeightsSynced(weight_version=4),
    rt.TrainerCheckpointPublished(step=5, path="/ckpt/step5"),
    rt.SnapshotPublished(step=5, path="/snap/5", captured_at=1700000000.25),
    rt.RestoreStarted(path="/snap/5", step=5),
    rt.RestoreFinished(step=5, unfinished_groups=["g2"]),
]


def dispatched(i: int) -> rt.AttemptDispatched:
    return rt.AttemptDispatched(
        group_id=f"g{i // 8}", prompt_id=i // 8, generation_index=i % 8, attempt=0, weight_version=1
    )
