"""Rollout health and per-attempt tables, read off a timeline.

Both are computed from the ``Timeline`` model that ``_timeline.fold`` folds
from events in any order and file layout: ``health`` turns it into the
``report`` command's figures (outcomes, tries, durations, stalls, staleness,
intervals, sealed attempts per second), ``table`` into one row per attempt
(``attempts``: CSV or Parquet), and ``api`` offers both in Python.
"""
