"""Old home of the encoder, kept for the modules that import from it: see ``_schema``."""

from __future__ import annotations

from ._schema.encoding import BatchEncoder, encode_one

__all__ = ["BatchEncoder", "encode_one"]
