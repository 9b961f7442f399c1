"""The event schema: what flows through a tracer, and how it becomes JSON lines and back.

A user's ``emit`` hands an ``Event`` (``events``) to a tracer, which checks its
class against ``REGISTRY.emit_types`` (``registry``) and queues it. The writer
turns each batch into JSON lines with ``BatchEncoder`` (``encoding``), which
leaves out, with a reason (``reasons``), every event its own class would not
read back. A reader turns the lines into events again (``decoding``), with
decoders over every class the registry holds; a line of a class this process
does not know becomes an ``UnknownEvent``.
"""
