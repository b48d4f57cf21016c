"""The one validator of an architecture's JSON (bilm-tf's ``options.json``, ELMoForManyLangs'
config): sections, keys, whole numbers and clips, each failure one line naming the file and the key
and quoting (a short piece of) what was found."""

from __future__ import annotations

import math
from typing import Any

from ..errors import ModelFileError


def short(value: Any, limit: int = 80) -> str:
    """repr() cut to ``limit`` characters: a message quotes a bad value, not a whole file of it."""
    try:
        text = repr(value)
    except ValueError:  # an int past Python's str-conversion digit limit
        return "an integer too long to print"
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Architecture:
    """What both architectures (bilm-tf's options, ELMoForManyLangs' config) derive alike from their
    ``filters`` and ``projection_dim``."""

    filters: tuple[tuple[int, int], ...]
    projection_dim: int

    @property
    def n_filters(self) -> int:
        return sum(n for _, n in self.filters)

    @property
    def output_dim(self) -> int:
        """Width of every output layer: both directions' projections."""
        return 2 * self.projection_dim


class OptionsReader:
    """Reads ``data`` (a parsed JSON object of sections of keys) from ``source`` (named in errors)."""

    def __init__(self, data: Any, source: str) -> None:
        self.data = data
        self.source = source

    def error(self, message: str) -> ModelFileError:
        return ModelFileError(f"{self.source}: {message}")

    def sections(self, holds: dict[str, str | None]) -> None:
        """Each section must be there and be a JSON object; ``holds[section]`` (its keys, for the
        message) or None."""
        if not isinstance(self.data, dict):
            raise self.error("must hold a JSON object")
        for section, keys in holds.items():
            if section not in self.data:
                raise self.error(
                    f"missing key '{section}'" + (f" (the section of {section}.{{{keys}}})" if keys else "")
                )
            if not isinstance(self.data[section], dict):
                raise self.error(f"'{section}' must be a JSON object, got {short(self.data[section])}")

    def get(self, section: str, key: str, default: Any = KeyError) -> Any:
        """The value of ``section.key``; ``default`` where it is missing (none: an error)."""
        if key not in self.data[section]:
            if default is KeyError:
                raise self.error(f"missing key '{section}.{key}'")
            return default
        return self.data[section][key]

    def integer(self, section: str, key: str, low: int | None = None, default: Any = KeyError) -> int | None:
        """``section.key`` as an integer (>= ``low``, when given); None where it is null and the
        default is None."""
        value = self.get(section, key, default)
        if value is None and default is None:
            return None
        return self.check_integer(f"{section}.{key}", value, low)

    def check_integer(self, name: str, value: Any, low: int | None = None) -> int:
        # Python's json reads NaN, Infinity and ints of any length. A whole float (4.0) counts as an
        # integer, as it does for bilm-tf and ELMoForManyLangs, which pass the values on.
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or low is not None and value < low:
            raise self.error(
                f"'{name}' must be an integer{f' >= {low}' if low is not None else ''}, got {short(value)}"
            )
        return value

    def clip(self, section: str, key: str) -> float | None:
        """A clip value: a number >= 0; 0 or null mean no clip (None)."""
        value = self.get(section, key, None)
        if value is None:
            return None
        try:  # an int past a float's range (10**400) does not convert
            number = None if isinstance(value, bool) or not isinstance(value, (int, float)) else float(value)
        except OverflowError:
            number = None
        if number is None or not math.isfinite(number) or number < 0:
            # clamp(x, -c, c) with c < 0 would set every value to c instead of clipping
            raise self.error(f"'{section}.{key}' must be a number >= 0 (0 or null: no clip), got {short(value)}")
        return number if number else None
