"""Sinks: small blocking writers of encoded JSON lines, chosen by URI scheme.

They know nothing of events. Third-party sinks subclass ``Sink`` and register
under the entry-point group ``rollout_trace.sinks`` (name = URI scheme).
"""

from ._base import Sink, SinkOptionError
from .jsonl import JsonlSink
from .memory import MemorySink
from .null import NullSink
from .stdio import StderrSink, StdoutSink

__all__ = [
    "Sink",
    "SinkOptionError",
    "JsonlSink",
    "MemorySink",
    "NullSink",
    "StdoutSink",
    "StderrSink",
]
