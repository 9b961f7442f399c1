"""Timelines: a trace set drawn on one time axis, as a trace-event document or an HTML page.

Events go, a block at a time, into ``fold.TimelineFold``, which feeds the
restore-cost analysis (``_analysis``) and folds each run into a ``RunLine``
(``model``: attempts packed into lanes, marks in the columns of a
``marks.MarkTable``, restores) without keeping the events; ``fates`` marks on
each stopped run's attempts what the stop did to them. Both views are drawn
from that one ``Timeline``: ``document`` writes the Chrome trace-event
document that Perfetto opens (``timeline_document``), with the flows and
counters that ``links`` works out and the events of another document
(``ray timeline``'s) that ``merge`` renumbers into it, and ``page`` the
self-contained HTML page (``timeline_html``), whose SVG chart ``chart``
draws on the time axis of ``axis``, with its labels laid out by ``labels``.
"""
