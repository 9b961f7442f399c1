"""Timelines: a trace set drawn on one time axis, as a trace-event document or an HTML page.

``model.timeline_of`` reads a ``Timeline`` off the trace set's model
(``_model``): per run a ``RunLine`` with its tries as ``Attempt``s packed
into lanes (each with the fate its stop gave it), its marks in the columns of
a ``marks.MarkTable``, and its restores. Both views are drawn from that one
``Timeline``: ``document`` writes the Chrome trace-event document that
Perfetto opens (``timeline_document``), with the flows and counters that
``links`` works out and the events of another document (``ray timeline``'s)
that ``merge`` renumbers into it, and ``page`` the self-contained HTML page
(``timeline_html``), whose SVG chart ``chart`` draws on the time axis of
``axis``, with its labels laid out by ``labels``.
"""
