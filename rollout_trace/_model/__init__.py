"""One model of a trace set, under every command.

What flows: decoded events (``_reading``) are gathered per run and put in seq
order with copies collapsed and conflicting versions flagged (``runs``); one
pass per run yields its tries and marks (``tries``); the runs in the run
order give the stops, each sibling's class at a stop, the figures and the
notes (``stops``); ``traceset.analyze`` ties them into a ``Model``. The
words all of them use (try, open, sealed, superseded, outcome, the run
order, a use of a sibling) are defined once, in ``terms``.
"""

from __future__ import annotations

from .traceset import Model, TryRow, analyze

__all__ = ["Model", "TryRow", "analyze"]
