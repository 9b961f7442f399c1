"""The chart's time axis: where a time goes across the plot, and how a time reads.

The chart is ``WIDTH`` units wide: run labels in the gutter left of ``LEFT``,
the plot from there to ``RIGHT`` units short of the edge.
"""

from __future__ import annotations

import math
import sys

__all__ = ["LEFT", "PLOT_W", "RIGHT", "WIDTH", "Scale", "fmt_rel", "nice_step"]

WIDTH = 1040
LEFT = 176
RIGHT = 16
PLOT_W = WIDTH - LEFT - RIGHT


class Scale:
    """Time to x, safe at the ends of the float range.

    Halves are subtracted, not times: ``t1 - t0`` overflows to infinity for
    times such as -1e308 and 1.7e308, while ``t1/2 - t0/2`` does not, and
    halving is exact, so ordinary times map as before.
    """

    def __init__(self, t0: float, t1: float) -> None:
        self.t0_half = t0 * 0.5
        half = t1 * 0.5 - self.t0_half
        self.half_span = half if half > 0 else 0.5e-6

    def __call__(self, t: float) -> float:
        v = LEFT + (t * 0.5 - self.t0_half) / self.half_span * PLOT_W
        if not v >= LEFT - 1:  # NaN too
            return LEFT - 1.0
        return min(v, WIDTH - RIGHT + 1.0)


def fmt_rel(s: float, step: float = 0.0) -> str:
    """Seconds since the time origin as ``12.5 s``, ``4:05`` or ``1:04:05``."""
    if not math.isfinite(s):
        # Times at the ends of the float range are further apart than a float.
        return f"{'-' if s < 0 else ''}more than {sys.float_info.max:.3g} s"
    if abs(s) >= 1e9:
        return f"{s:.3g} s"
    if step and step < 1:
        return f"{s:.1f} s"
    if abs(s) < 60 and (not step or step < 60):
        return f"{s:.1f} s" if s % 1 else f"{s:.0f} s"
    sign = "-" if s < 0 else ""
    whole = round(abs(s))
    h, rest = divmod(whole, 3600)
    m, sec = divmod(rest, 60)
    return f"{sign}{h}:{m:02d}:{sec:02d}" if h else f"{sign}{m}:{sec:02d}"


def nice_step(target: float) -> float:
    """A round tick step of at least ``target`` seconds."""
    for step in (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600):
        if step >= target:
            return float(step)
    if target <= 3600e6:
        return 3600.0 * math.ceil(target / 3600)
    return 10.0 ** math.ceil(math.log10(target))
