"""``allennlp.common.util``'s helper on ELMo's path."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import islice
from typing import TypeVar

T = TypeVar("T")


def lazy_groups_of(iterable: Iterable[T], group_size: int) -> Iterator[list[T]]:
    """Lists of ``group_size`` items of ``iterable`` (the last one shorter), read as needed."""
    iterator = iter(iterable)
    while group := list(islice(iterator, group_size)):
        yield group
