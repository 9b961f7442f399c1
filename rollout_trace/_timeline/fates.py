"""What each stop did to the tries of the run it stopped: the bars behind the figures.

For stop *i* (run A stopped, run B restored), A's tries get a ``fate``
named after the figure that counts them (README: Reference > Restore-cost
figures), so that the bars so marked are the siblings the figures count:

- ``resumed``: the sibling's last try that A started has no end in A, and B
  emits ``attempt_resumed`` for the sibling;
- ``restarted``: the same, but B does not resume it;
- ``redone``: the sibling is not in flight, and its last seal in A (by seq)
  is later than the capture of the restored state (``captured_at``); the bar
  is the try of that seal.
"""

from __future__ import annotations

from .._analysis.figures import StopCost
from .model import Attempt, RunLine

__all__ = ["mark_fates"]


def mark_fates(runs: list[RunLine], stops: list[StopCost]) -> None:
    by_id = {r.run_id: r for r in runs}
    for number, stop in enumerate(stops, 1):
        a_run = by_id.get(stop.stopped_run) if stop.stopped_run is not None else None
        b_run = by_id.get(stop.restored_run) if stop.restored_run is not None else None
        if a_run is None or b_run is None:
            continue
        resumed = {
            (a.prompt_id, a.generation_index) for a in b_run.attempts if a.resumed_turn is not None
        }
        last_started: dict[tuple[int | str, int], Attempt] = {}
        last_seal: dict[tuple[int | str, int], Attempt] = {}
        for a in a_run.attempts:
            key = (a.prompt_id, a.generation_index)
            if a.started:
                held = last_started.get(key)
                if held is None or a.start_seq > held.start_seq:
                    last_started[key] = a
            if a.outcome == "sealed":
                held = last_seal.get(key)
                if held is None or a.end_seq > held.end_seq:
                    last_seal[key] = a
        in_flight = set()
        for key, a in last_started.items():
            if a.end_seq < 0:
                in_flight.add(key)
                a.fate = "resumed" if key in resumed else "restarted"
                a.stop = number
        captured = stop.captured_at
        if captured is None:
            continue
        for key, a in last_seal.items():
            if key not in in_flight and a.end > captured:
                a.fate = "redone"
                a.stop = number
