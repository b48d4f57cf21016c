"""What the Python API takes as tokenized sentences, checked in one place for every entry point
(``batch_to_ids``, ``ElmoBiLm.batch_to_ids``, ``Elmo.batch_to_ids``, ``ElmoEmbedder.embed_sentence``
/ ``embed_sentences`` / ``embed_batch``, ELMoForManyLangs' ``sents2elmo``). TF-Hub's signatures
take TF-Hub's own shapes (padded token arrays with lengths, bytes as tf.string holds them, checked
in :mod:`elmo_fast.compat.tf_hub`) and hand the sentences they find to ``batch_to_ids``.

A sentence is any sequence of str tokens: a list, a tuple, a 1-D numpy array of str (dtype ``<U``,
or object holding str), any other iterable that is not a string, a mapping or a set (an iterator
is read once, into a list). A batch is a sequence of sentences: a list or tuple of them, a 2-D
numpy array of str (one sentence a row), or a 1-D object array of them. Anything else is a one-line
:class:`SentenceTypeError` saying what was expected and what was found (a string where tokens were
expected: the usual slip, said with the split to do).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from typing import Any

from .errors import InputError


class SentenceTypeError(InputError, TypeError):
    """Tokens or sentences of the wrong type: an :class:`~elmo_fast.errors.InputError` (a
    ValueError), and a TypeError, as ``batch_to_ids`` raised before."""


_SEQUENCE = "a list, a tuple or a 1-D numpy array"


def _found(value: Any) -> str:
    """What a value is, in words, for messages."""
    import numpy as np

    if isinstance(value, np.ndarray):
        return f"a {value.ndim}-D numpy array of {value.dtype} (shape {tuple(value.shape)})"
    if isinstance(value, (str, bytes)):
        return f"a {type(value).__name__} {value!r:.50}"
    return f"{type(value).__name__} {value!r:.50}"


def _items(value: Any, where: str, what: str) -> list:
    """The items of a 1-D sequence, as a list, or the error saying what ``what`` expects."""
    import numpy as np

    if isinstance(value, np.ndarray):
        if value.size == 0 and value.ndim <= 1:
            return []
        if value.ndim != 1 or value.dtype.kind not in "USO":
            raise SentenceTypeError(f"{where}: expected {what}, found {_found(value)}")
        return value.tolist()  # <U: str, S: bytes, O: as held
    if isinstance(value, (str, bytes, Mapping, Set)) or not isinstance(value, Iterable):
        raise SentenceTypeError(f"{where}: expected {what}, found {_found(value)}")
    return list(value)


def _token(token: Any, where: str) -> str:
    if type(token) is str:  # noqa: E721  (the common case, first)
        return token
    if isinstance(token, str):  # numpy.str_ and other subclasses: a plain str
        return str(token)
    raise SentenceTypeError(f"{where}: expected a str, found {_found(token)}")


def as_tokens(value: Any, where: str) -> list[str]:
    """A 1-D sequence of str tokens, as a new list of plain str; ``where`` names it in errors."""
    if isinstance(value, str):
        raise SentenceTypeError(
            f"{where}: expected a sequence of tokens ({_SEQUENCE} of str), found a string "
            f"{value!r:.50}; split it first: elmo_fast.tokenizer.split_text(text, tokenize=True) for raw text "
            f"(as embed --tokenize and the server split it), or text.split() for text tokenized already"
        )
    items = _items(value, where, f"a sequence of tokens ({_SEQUENCE} of str)")
    return [_token(t, f"{where}[{i}]") for i, t in enumerate(items)]


def as_sentence(sentence: Any, where: str = "sentence") -> list[str]:
    """One tokenized sentence [T] as a list of str (see the module's docstring)."""
    return as_tokens(sentence, where)


def as_batch(batch: Any, where: str = "batch") -> list[list[str]]:
    """A batch of tokenized sentences [B][T_i] as lists of str (see the module's docstring)."""
    import numpy as np

    if isinstance(batch, np.ndarray) and batch.ndim == 2 and batch.dtype.kind in "USO":
        rows = list(batch)  # a rectangular batch: one sentence a row
    else:
        if isinstance(batch, (str, bytes)):
            raise SentenceTypeError(
                f"{where}: expected a batch of sentences, each a sequence of tokens "
                f"(e.g. [['Hello', 'world']]), found {_found(batch)}"
            )
        rows = _items(batch, where, "a batch of sentences (a list, a tuple or a numpy array of them)")
    out = []
    for i, sentence in enumerate(rows):
        if isinstance(sentence, (str, bytes)):
            raise SentenceTypeError(
                f"{where}[{i}]: expected a sentence, a sequence of tokens, found "
                f"{_found(sentence)}; a batch is a list of sentences, each a list of tokens "
                f"(one sentence: [tokens])"
            )
        out.append(as_tokens(sentence, f"{where}[{i}]"))
    return out
