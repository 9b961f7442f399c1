"""The ``rollout-trace`` command line: from argv to an exit status.

``main`` builds one argparse parser from ``COMMANDS``, a ``Command``
(``command``) per subcommand module (``cost``, ``summary``, ``validate``,
``timeline``, ``demo``), and runs the one named; errors become exit statuses
there. The subcommands read trace sets through ``common.blocks`` (progress on
a terminal) and lay tables out with ``common.table``; the figures, the runs'
statistics and the timelines they print are functions of one model of the
trace set (``_model``, drawn by ``_timeline`` and ``_report``), the demo
comes from ``_demo``.
"""
