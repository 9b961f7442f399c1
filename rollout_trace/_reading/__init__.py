"""Reading: from trace files on disk to typed events, a block at a time.

``paths`` turns what the user named (files, globs, folders) into the list of
trace files. ``reader`` streams each file's bytes (gunzipping torn streams
too), cuts them into blocks of whole lines and decodes each block in one
msgspec call into ``Event``s and ``UnknownEvent``s, reporting every line it
skips as a ``ReadProblem``. ``lean`` holds slim stand-ins for the built-in
events that the cost analysis reads instead, at speed; they never leave
``_analysis``.
"""
