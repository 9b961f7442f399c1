"""Writing: from ``emit`` to bytes acknowledged by every sink.

``config`` checks a tracer's settings once; ``specs`` turns sink URIs into
sink classes (entry points); ``tracers`` holds the one writer core (``emit``
queues, a writer thread per run numbers, encodes and writes) and its two
facades, the async ``Tracer`` and the ``SyncTracer``; ``engine`` is one run's
state and counts; ``runner`` gives every sink a thread of its own; ``hooks``
closes runs at exit and on SIGTERM and starts over after a fork.
"""
