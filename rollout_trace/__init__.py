"""rollout_trace: typed, non-blocking event tracing for asyncio RL controllers."""

from ._errors import (
    EventTagError,
    InvalidEventError,
    RolloutTraceError,
    SinkError,
    SinkOpenError,
    SinkOptionError,
    TraceReadError,
    TracerStateError,
    UnknownSchemeError,
)
from ._model.stops import StopCost
from ._model.traceset import restore_costs
from ._reading.reader import ReadProblem, read, read_located
from ._report.api import TraceSet, analyze, attempts, health_report
from ._report.health import HealthReport, RunHealth
from ._report.table import AttemptRow
from ._schema.decoding import UnknownEvent
from ._schema.events import (
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
)
from ._timeline.document import timeline_document
from ._timeline.page import timeline_html
from ._version import __version__
from ._writing.attempts import Attempt
from ._writing.config import TraceCounts
from ._writing.tracers import SyncTracer, Tracer, sync_tracer, tracer
from .sinks import Sink

__all__ = [
    "__version__",
    # tracers
    "tracer",
    "sync_tracer",
    "Tracer",
    "SyncTracer",
    "TraceCounts",
    "Attempt",
    # events
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
    "UnknownEvent",
    "event_types",
    # errors
    "RolloutTraceError",
    "Sink",
    "SinkError",
    "UnknownSchemeError",
    "SinkOptionError",
    "SinkOpenError",
    "TraceReadError",
    "EventTagError",
    "InvalidEventError",
    "TracerStateError",
    # reading traces and restore costs
    "read",
    "read_located",
    "ReadProblem",
    "restore_costs",
    "analyze",
    "TraceSet",
    "StopCost",
    # rollout health and per-attempt tables
    "health_report",
    "HealthReport",
    "RunHealth",
    "attempts",
    "AttemptRow",
    # timelines
    "timeline_document",
    "timeline_html",
]


def _pin_public_names() -> None:
    # Public names live at the package, as httpx and anyio pin theirs: pickles,
    # reprs and tracebacks carry `rollout_trace.Tracer`, and moving a private
    # module later breaks nobody. Data (`__version__`) has no module to pin.
    for name in __all__:
        obj = globals()[name]
        if getattr(obj, "__module__", "").startswith("rollout_trace."):
            obj.__module__ = __name__


_pin_public_names()
