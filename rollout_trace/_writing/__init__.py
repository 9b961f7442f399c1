"""Writing: from ``emit`` to bytes acknowledged by every sink.

``config`` checks a tracer's settings once; ``specs`` turns sink URIs into
sink classes (entry points); ``engine`` is one run's state, shared by the two
facades, ``async_tracer`` (an anyio memory stream to a pump task) and
``sync_tracer`` (a writer thread); ``runner`` gives every sink a thread of its
own; ``hooks`` closes runs at exit and on SIGTERM and starts over after a fork.
"""
