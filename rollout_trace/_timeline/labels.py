"""Where the chart's text labels go, so that no two overlap.

The chart is plain SVG with no script, so text cannot be measured as it is
drawn: a label's box is estimated from its length and font size, on the wide
side (the metrics of DejaVu Sans, the widest of the usual sans-serif
fallbacks, rounded up). Labels are placed in order of importance; one whose
box meets a box already placed is tried at its other positions and, if none
is free, left out (its mark keeps its hover title).
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["Box", "Layout", "text_box"]

# (left, top, right, bottom) in SVG user units.
Box = tuple[float, float, float, float]

# Em widths per character, rounded up (DejaVu Sans digits are 0.636 em, its
# bold digits 0.696 em; most lowercase letters are narrower).
_EM = 0.64
_EM_BOLD = 0.72
# Above and below the baseline, in ems (DejaVu Sans: 0.928 and 0.236).
_ASCENT = 0.93
_DESCENT = 0.24
# Room kept clear around a label, so that neighbours do not touch.
_PAD = 1.5


def text_box(x: float, y: float, text: str, size: float, anchor: str, bold: bool = False) -> Box:
    """The box of ``text`` drawn at ``(x, y)`` (the baseline) with ``text-anchor`` ``anchor``."""
    width = len(text) * size * (_EM_BOLD if bold else _EM)
    if anchor == "middle":
        left = x - width / 2
    elif anchor == "end":
        left = x - width
    else:
        left = x
    return (left, y - _ASCENT * size, left + width, y + _DESCENT * size)


def _meet(a: Box, b: Box) -> bool:
    return a[0] < b[2] + _PAD and b[0] < a[2] + _PAD and a[1] < b[3] + _PAD and b[1] < a[3] + _PAD


class Layout:
    """The boxes of the labels placed so far."""

    def __init__(self) -> None:
        self.boxes: list[Box] = []

    def take(self, box: Box) -> None:
        """Reserve ``box`` whatever is there (labels that are always drawn)."""
        self.boxes.append(box)

    def free(self, box: Box) -> bool:
        return not any(_meet(box, b) for b in self.boxes)

    def place(self, boxes: Iterable[Box]) -> int | None:
        """Reserve the first free box of ``boxes``; its index, or None if none is free."""
        for i, box in enumerate(boxes):
            if self.free(box):
                self.boxes.append(box)
                return i
        return None
