"""The ``rollout-trace`` command line: from argv to an exit status.

``main`` builds one argparse parser from ``COMMANDS``, a ``Command``
(``command``) per subcommand module (``cost``, ``summary``, ``validate``,
``timeline``, ``demo``), and runs the one named; errors become exit statuses
there. The subcommands read trace sets through ``common.blocks`` (progress on
a terminal) and lay tables out with ``common.table``; the figures, the runs'
statistics and the timelines they print come from ``_analysis`` and
``_timeline``, the demo from ``_demo``.
"""
