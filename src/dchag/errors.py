"""The one error type users see.

Every error caused by a user's input, file or config derives from :class:`DchagError`; its
message names the file, key or value at fault and says what was expected. The ``dchag``
command catches ``DchagError`` (and nothing else by name) and prints that one line; any
other exception is a bug in dchag and keeps its traceback. The subclasses also derive from
the built-in exception a caller would expect (``ValueError`` for bad values,
``FileNotFoundError`` for a missing file), so library callers can catch either.
"""

from __future__ import annotations


class DchagError(Exception):
    """A user's input, file or setting is at fault; the message says which and what was expected."""


class MissingFileError(DchagError, FileNotFoundError):
    """A file or store a command needs does not exist."""
