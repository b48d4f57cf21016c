"""The project's own error types.

Every problem a user can cause (a bad model file, a bad input line, a bad option) raises a
subclass of :class:`ElmoFastError`, which is a ``ValueError``: callers can catch one type, and
the CLI turns it into a one-line message with exit code 2.

A message that names one of the caller's parameters holds it as a :class:`Param`, not as text:
the Python API shows it as the parameter (``batch_size must be >= 1``, ``pass overwrite=True``),
the CLI as its flag (``--batch-size must be >= 1``, ``pass --overwrite``), from the one error.
"""

from __future__ import annotations

from collections.abc import Mapping

_NO_VALUE = object()


class Param:
    """A parameter named inside an error message, with the value to suggest, if any."""

    __slots__ = ("name", "value")

    def __init__(self, name: str, value: object = _NO_VALUE) -> None:
        self.name = name
        self.value = value

    def render(self, flags: Mapping[str, str] | None = None) -> str:
        flag = (flags or {}).get(self.name)
        if flag is None:  # the Python API's spelling
            return self.name if self.value is _NO_VALUE else f"{self.name}={self.value!r}"
        if self.value is _NO_VALUE or self.value is True:
            return flag
        return f"{flag} {self.value}"


class ElmoFastError(ValueError):
    """Base class of every error elmo-fast raises on purpose.

    ``ElmoFastError("at most ", Param("batch_size"), " sentences")``: the parts are joined;
    ``str()`` gives the Python API's wording, :meth:`render` with a map from parameter names to
    flags the command line's.
    """

    def __init__(self, *parts: str | Param) -> None:
        self.parts = parts
        super().__init__(self.render())

    def render(self, flags: Mapping[str, str] | None = None) -> str:
        return "".join(p.render(flags) if isinstance(p, Param) else str(p) for p in self.parts)

    def __reduce__(self):  # pickles (e.g. from a worker process) as its API wording
        return type(self), (str(self),)


class ModelFileError(ElmoFastError):
    """An options or weights file is missing, unreadable, or disagrees with the options."""


class InputError(ElmoFastError):
    """An input sentence, line or file cannot be embedded (names the line or item)."""


class DownloadError(ElmoFastError):
    """A named model could not be fetched (offline, HTTP error, truncated download)."""


class ExtensionNotBuiltError(ElmoFastError):
    """The compiled extension (or its CUDA part) is not available in this install."""


class ConfigurationError(ElmoFastError):
    """A module configured in a way it cannot run: raised where allennlp raises its own
    ``ConfigurationError`` (``ScalarMix``'s sizes, ``Elmo``'s ``module=`` beside model files, a model
    whose options allennlp refuses), so that code migrated from allennlp catches it by importing
    this class in place of ``allennlp.common.checks.ConfigurationError``
    (``from elmo_fast.compat import ConfigurationError``). Unlike allennlp's, it is also an
    :class:`ElmoFastError` (a ``ValueError``)."""


class ModelConfigurationError(ModelFileError, ConfigurationError):
    """Options a model file holds that the biLM cannot run with (allennlp's ``ConfigurationError``
    for them: a char CNN activation other than relu/tanh, no skip connections)."""
