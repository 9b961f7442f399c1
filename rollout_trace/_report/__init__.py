"""Rollout health and per-attempt tables, read off a timeline.

Both are computed from the ``Timeline`` that ``_timeline.model.timeline_of``
reads off the trace set's model, whatever the order and file layout: ``health`` turns it into the
``report`` command's figures (outcomes, tries, durations, stalls, staleness,
intervals, sealed attempts per second), ``table`` into one row per attempt
(``attempts``: CSV or Parquet), and ``api`` offers both in Python.
"""
