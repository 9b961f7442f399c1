"""Timelines: a trace set drawn on one time axis, as a trace-event document or an HTML page.

Events go into ``model.build_timeline``, which folds each run into a
``RunLine`` (attempts packed into lanes, marks, restores) and takes the stops
and their figures from ``_analysis``; both views are drawn from that one
``Timeline``. ``document`` writes the Chrome trace-event document that
Perfetto opens (``timeline_document``); ``page`` writes the self-contained
HTML page (``timeline_html``), whose SVG chart ``chart`` draws.
"""
