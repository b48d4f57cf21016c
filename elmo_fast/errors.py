"""The project's own error types.

Every problem a user can cause (a bad model file, a bad input line, a bad option) raises a
subclass of :class:`ElmoFastError`, which is a ``ValueError``: callers can catch one type, and
the CLI turns it into a one-line message with exit code 2.
"""


class ElmoFastError(ValueError):
    """Base class of every error elmo-fast raises on purpose."""


class ModelFileError(ElmoFastError):
    """An options or weights file is missing, unreadable, or disagrees with the options."""


class InputError(ElmoFastError):
    """An input sentence, line or file cannot be embedded (names the line or item)."""


class DownloadError(ElmoFastError):
    """A named model could not be fetched (offline, HTTP error, truncated download)."""


class ExtensionNotBuiltError(ElmoFastError):
    """The compiled extension (or its CUDA part) is not available in this install."""
