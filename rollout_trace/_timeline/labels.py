"""Where the chart's text labels go, so that no two overlap.

The chart is plain SVG with no script, so text cannot be measured as it is
drawn: a label's box is estimated from its characters and font size, on the
wide side (the advance widths of DejaVu Sans, the widest of the usual
sans-serif fallbacks, rounded up). Labels are placed in order of importance;
one whose box meets a box already placed is tried at its other positions
and, if none is free, left out (its mark keeps its hover title).

Placed boxes are indexed by the cells of a coarse grid that they cover, so a
label is checked against its neighbours only, not against every label placed
so far: a page of thousands of runs places its labels in linear time.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator

__all__ = ["ELLIPSIS", "Box", "Layout", "fit", "text_box", "text_width"]

# (left, top, right, bottom) in SVG user units.
Box = tuple[float, float, float, float]

# Advance widths in hundredths of an em of DejaVu Sans and DejaVu Sans Bold
# (the widest of the usual sans-serif fallbacks), rounded up, for printable
# ASCII from the space on, and for the few other characters the chart draws.
# Anything else counts as wide as the widest glyph, so that a box errs large.
_ASCII = 32
_REGULAR = (
    "32 41 46 84 64 96 78 28 40 40 50 84 32 37 32 34 64 64 64 64 64 64 64 64 64 64 34 34 84 "
    "84 84 54 100 69 69 70 78 64 58 78 76 30 30 66 56 87 75 79 61 79 70 64 62 74 69 99 69 62 "
    "69 40 34 40 84 50 50 62 64 55 64 62 36 64 64 28 28 58 28 98 64 62 64 64 42 53 40 64 60 "
    "82 60 60 53 64 34 64 84"
)
_BOLD = (
    "35 46 53 84 70 101 88 31 46 46 53 84 38 42 38 37 70 70 70 70 70 70 70 70 70 70 40 40 84 "
    "84 84 59 100 78 77 74 84 69 69 83 84 38 38 78 64 100 84 86 74 86 78 73 69 82 78 111 78 "
    "73 73 46 37 46 84 50 50 68 72 60 72 68 44 72 72 35 35 67 35 105 72 69 72 72 50 60 48 72 "
    "66 93 65 66 59 72 37 72 84"
)
_OTHER = {"\u00b7": (32, 38), "\u2026": (100, 100), "\u2192": (84, 84)}
_WIDE = 1.25


def _table(widths: str, bold: int) -> dict[str, float]:
    table = {chr(_ASCII + i): int(w) / 100 for i, w in enumerate(widths.split())}
    table.update((c, w[bold] / 100) for c, w in _OTHER.items())
    return table


_EMS = (_table(_REGULAR, 0), _table(_BOLD, 1))

# Above and below the baseline, in ems (DejaVu Sans: 0.928 and 0.236).
_ASCENT = 0.93
_DESCENT = 0.24
# Room kept clear around a label, so that neighbours do not touch.
_PAD = 1.5
# The grid of the index: a cell holds a few labels at most (labels are
# 10 to 20 units high and mostly under 100 wide).
_CELL_W = 64.0
_CELL_H = 32.0
# Cells beyond these coordinates fold into the outermost ones, so that a box
# far off the chart (or of no finite size) still takes few cells: the chart
# is about a thousand units wide, however many runs make it tall. Folding is
# monotone, so two boxes that meet still share a cell.
_X_REACH = 4096.0
_Y_REACH = 1e12

ELLIPSIS = "\u2026"


def text_box(x: float, y: float, text: str, size: float, anchor: str, bold: bool = False) -> Box:
    """The box of ``text`` drawn at ``(x, y)`` (the baseline) with ``text-anchor`` ``anchor``."""
    width = text_width(text, size, bold)
    if anchor == "middle":
        left = x - width / 2
    elif anchor == "end":
        left = x - width
    else:
        left = x
    return (left, y - _ASCENT * size, left + width, y + _DESCENT * size)


def text_width(text: str, size: float, bold: bool = False) -> float:
    """The width of ``text`` at font size ``size``, on the wide side."""
    ems = _EMS[bold]
    return size * sum(ems.get(c, _WIDE) for c in text)


def fit(text: str, size: float, width: float, bold: bool = False) -> str:
    """``text`` if it is at most ``width`` wide, else its longest start that fits with "…"."""
    if text_width(text, size, bold) <= width:
        return text
    ems = _EMS[bold]
    room = width / size - ems[ELLIPSIS]
    keep = 0
    for c in text:
        room -= ems.get(c, _WIDE)
        if room < 0:
            break
        keep += 1
    return text[:keep].rstrip() + ELLIPSIS


def _meet(a: Box, b: Box) -> bool:
    return a[0] < b[2] + _PAD and b[0] < a[2] + _PAD and a[1] < b[3] + _PAD and b[1] < a[3] + _PAD


def _index(v: float, cell: float, reach: float) -> int:
    if not -reach < v < reach:  # NaN folds to the low end
        v = reach if v > 0 else -reach
    return math.floor(v / cell)


def _cells(box: Box) -> Iterator[tuple[int, int]]:
    """The grid cells that ``box``, padded, covers."""
    left, top, right, bottom = box
    x0, x1 = _index(left - _PAD, _CELL_W, _X_REACH), _index(right + _PAD, _CELL_W, _X_REACH)
    y0, y1 = _index(top - _PAD, _CELL_H, _Y_REACH), _index(bottom + _PAD, _CELL_H, _Y_REACH)
    for cx in range(x0, x1 + 1):
        for cy in range(y0, y1 + 1):
            yield cx, cy


class Layout:
    """The boxes of the labels placed so far, indexed by the grid cells they cover."""

    def __init__(self) -> None:
        self.boxes: list[Box] = []
        self._grid: dict[tuple[int, int], list[Box]] = {}

    def take(self, box: Box) -> None:
        """Reserve ``box`` whatever is there (labels that are always drawn)."""
        self.boxes.append(box)
        grid = self._grid
        for cell in _cells(box):
            held = grid.get(cell)
            if held is None:
                grid[cell] = [box]
            else:
                held.append(box)

    def free(self, box: Box) -> bool:
        """Whether ``box`` meets no box placed so far (only its neighbours are checked)."""
        grid = self._grid
        for cell in _cells(box):
            for b in grid.get(cell, ()):
                if _meet(box, b):
                    return False
        return True

    def place(self, boxes: Iterable[Box]) -> int | None:
        """Reserve the first free box of ``boxes``; its index, or None if none is free."""
        for i, box in enumerate(boxes):
            if self.free(box):
                self.take(box)
                return i
        return None
