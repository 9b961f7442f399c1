"""The model of a trace set that is still being written: built again and again.

``GrowingBuilder`` is a ``Builder`` that keeps each run it built: a run that
gained no line since the last ``build`` is not normalized or passed over
again, so a build costs the runs that grew (and the stops, paired and costed
over all the runs, as ``Model`` does). The set it gives is the one a
``Builder`` gives for the same lines, run for run (``rollout-trace watch``
answers from it).

A run kept is the same object in the next set, its ``index`` set to its
place there: a set built before is not to be read once another is built.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._reading.reader import Problems
from .traceset import Builder, M, Model
from .tries import Run

__all__ = ["GrowingBuilder"]


class GrowingBuilder(Builder):
    """A ``Builder`` whose ``build`` builds again only the runs that gained lines."""

    def __init__(self) -> None:
        super().__init__()
        # run id -> (how many lines it had when built, what that built)
        self._kept: dict[str, tuple[int, Run | None]] = {}
        self.rebuilt = 0  # runs built at the last build

    def build(self, problems: Problems = None, make: type[M] = Model) -> M:  # type: ignore[assignment]
        self.rebuilt = 0
        return super().build(problems, make)

    def _run_of(self, run_id: str, events: Sequence[Any], srcs: Sequence[int]) -> Run | None:
        # Lines only ever come added (``add``, ``merge``): a run is unchanged
        # exactly when it holds as many as when it was built.
        held = self._kept.get(run_id)
        if held is not None and held[0] == len(events):
            return held[1]
        run = super()._run_of(run_id, events, srcs)
        self._kept[run_id] = (len(events), run)
        self.rebuilt += 1
        return run
