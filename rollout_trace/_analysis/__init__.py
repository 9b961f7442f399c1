"""Analysis: what a trace set says, computed from its events alone.

Events come in from ``_reading`` (real classes, or ``lean`` ones for speed).
``fold`` folds each run into the small state the figures need (``RunFold``);
``cost`` feeds a trace set through it (``CostAnalysis``, ``restore_costs``)
and pairs every run that begins with a restore with the run before it;
``figures`` turns such a pair into a ``StopCost`` and holds the table of
figures (``FIGURES``, ``FIGURE_ROWS``) that the command line and the timeline
show. ``seqs`` keeps the seqs of a run as ranges (``SeqSet``), for the fold
and for ``runstats``, which keeps per-run counts and times for ``summary`` and
``validate``; ``protocol`` holds the rules a controller's events follow, per
event and per sibling; ``validate`` checks every line and run against the
README's Reference and gives ``Finding``s. ``copies`` compares, on a second
read, the lines of the seqs a first read saw more than once: a conflicting
copy (lines of one ``(run_id, seq)`` that differ) is reported by every command.
"""
