"""Reading: from trace files on disk to typed events, a block at a time.

``paths`` turns what the user named (files, globs, folders) into the list of
trace files, each once, and says what cannot be read before anything is.
``gunzip`` gives the text of a gzip file's members (one per write), and says
where a member was cut short by a kill or bytes are damaged. ``reader`` cuts
each file's text into blocks of whole lines and decodes each block in one
msgspec call into ``Event``s and ``UnknownEvent``s, reporting every line it
skips as a ``ReadProblem``.
"""
