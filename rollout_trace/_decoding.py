"""Old home of the decoders, kept for the modules that import from it: see ``_schema``."""

from __future__ import annotations

from ._schema.decoding import AnyEvent, UnknownEvent, decode_line, decode_one, decoders

__all__ = ["UnknownEvent", "AnyEvent", "decoders", "decode_one", "decode_line"]
