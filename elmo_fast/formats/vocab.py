"""bilm-tf's vocabulary file: one token per line, most frequent first, holding ``<S>``, ``</S>``
and ``<UNK>``. The softmax of a biLM predicts these ids; the candidate sampler of its training
assumes the frequency order (a log-uniform distribution over ids)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

from ..durable import write_text
from ..errors import ModelFileError
from ..textio import text_lines

BOS, EOS, UNK = "<S>", "</S>", "<UNK>"
SPECIAL_TOKENS = (EOS, BOS, UNK)


class Vocabulary:
    """Tokens and their ids (line numbers of the file). Unknown tokens map to ``<UNK>``."""

    def __init__(self, tokens: Sequence[str], source: str = "vocabulary") -> None:
        self.tokens = list(tokens)
        self.source = source
        self._ids: dict[str, int] = {}
        for i, token in enumerate(self.tokens):
            if not token or any(c.isspace() for c in token):
                raise ModelFileError(f"{source}: line {i + 1} is not one token: {token!r}")
            if token in self._ids:
                raise ModelFileError(
                    f"{source}: token {token!r} appears twice (lines {self._ids[token] + 1} and {i + 1})"
                )
            self._ids[token] = i
        missing = [t for t in SPECIAL_TOKENS if t not in self._ids]
        if missing:
            raise ModelFileError(
                f"{source}: the vocabulary lacks {', '.join(missing)} (a biLM vocabulary holds "
                f"{', '.join(SPECIAL_TOKENS)}; `elmo-fast vocab` writes them)"
            )
        self.bos, self.eos, self.unk = self._ids[BOS], self._ids[EOS], self._ids[UNK]

    def __len__(self) -> int:
        return len(self.tokens)

    def __contains__(self, token: str) -> bool:
        return token in self._ids

    def id(self, token: str) -> int:
        return self._ids.get(token, self.unk)

    def ids(self, tokens: Iterable[str]) -> list[int]:
        get, unk = self._ids.get, self.unk
        return [get(t, unk) for t in tokens]

    @classmethod
    def load(cls, path: str | os.PathLike) -> Vocabulary:
        path = os.fspath(path)
        if os.path.isdir(path):
            raise ModelFileError(f"{path}: is a directory, expected a vocabulary file (one token per line)")
        try:
            with open(path, encoding="utf-8", newline="") as f:
                lines = text_lines(f.read())  # lines end at "\n" or "\r\n" only
        except FileNotFoundError:
            raise ModelFileError(f"{path}: vocabulary file not found") from None
        except UnicodeDecodeError as e:
            raise ModelFileError(f"{path}: vocabulary file is not UTF-8 text ({e.reason} at byte {e.start})") from None
        except OSError as e:
            raise ModelFileError(f"{path}: cannot read vocabulary file: {e}") from None
        if lines and lines[0].startswith("\ufeff"):
            lines[0] = lines[0][1:]
        tokens = [line.strip() for line in lines]
        while tokens and not tokens[-1]:
            tokens.pop()
        if not tokens:
            raise ModelFileError(f"{path}: vocabulary file is empty")
        for i, t in enumerate(tokens):
            if not t:
                raise ModelFileError(f"{path}: line {i + 1} is empty")
        return cls(tokens, source=path)

    def save(self, path: str | os.PathLike) -> None:
        """One token per line, written durably (:mod:`elmo_fast.durable`)."""
        write_text(path, "\n".join(self.tokens) + "\n")
