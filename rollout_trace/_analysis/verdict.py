"""How a sibling stands at its run's end, from its row (``retired.Row``).

In flight or not, and when its last seal came and how long the try it sealed
took: all the figures read of a sibling, once ``siblings.SiblingTable`` has
joined what it kept of it.
"""

from __future__ import annotations

import math
from array import array
from typing import NamedTuple

from .retired import (
    E_ATT,
    E_SEQ,
    EXTRA,
    S_ATT,
    S_SEQ,
    S_TIME,
    Z_ATT,
    Z_SEQ,
    Z_TIME,
    Extra,
    PackedKey,
    Row,
    SiblingKey,
    pack_key,
)

__all__ = ["Siblings", "judge"]


class Siblings(NamedTuple):
    """A run's siblings as the figures see them at its end.

    ``open`` maps each sibling in flight to the time its open attempt began.
    Each sibling with an ``attempt_sealed`` has an entry in the other three,
    for its last seal: its key (packed, see ``pack_key``), the seal's time,
    and the seal's time minus the start of the try it sealed (NaN where the
    run has no start of that attempt before the seal). Columns, not tuples: a run has a seal for
    nearly every sibling.
    """

    open: dict[SiblingKey, float]
    seal_keys: list[PackedKey]
    seal_times: array[float]
    seal_spans: array[float]


def judge(key: SiblingKey, row: Row, out: Siblings) -> None:
    """Add the sibling of ``row`` to ``out``: in flight when no end of its latest
    start's attempt came after that start, and its last seal if it has one."""
    extra: Extra | None = row[EXTRA]
    if row[S_SEQ] >= 0:
        attempt = row[S_ATT]
        ended = row[E_SEQ] >= 0 and row[E_ATT] == attempt
        if not ended and extra is not None:
            ended = attempt in extra.ends.values()
        if not ended:
            out.open[key] = row[S_TIME]
    if row[Z_SEQ] >= 0:
        out.seal_keys.append(pack_key(key))
        out.seal_times.append(row[Z_TIME])
        out.seal_spans.append(row[Z_TIME] - _began(row, extra))


def _began(row: Row, extra: Extra | None) -> float:
    """When the try of the sibling's last seal began: its latest start before the seal."""
    sealed, attempt = row[Z_SEQ], row[Z_ATT]
    best = (-1, math.nan)
    if row[S_ATT] == attempt and 0 <= row[S_SEQ] < sealed:
        best = (row[S_SEQ], row[S_TIME])
    if extra is not None:
        for seq, (a, t) in extra.starts.items():
            if a == attempt and best[0] < seq < sealed:
                best = (seq, t)
    return best[1]
