"""simple_elmo's API and the NLPL repository's ELMo archives: ``from elmo_fast.simple_elmo import
ElmoModel`` in place of ``from simple_elmo import ElmoModel`` (see :mod:`elmo_fast.compat.simple_elmo`,
which lists what simple_elmo computes, quirks included, and the few differences).

The archives themselves (a folder or a ``.zip`` with ``options.json``, ``model.hdf5``, optional
``vocab.txt`` / ``vocab.txt.gz`` and ``meta.json``) are read by :mod:`elmo_fast.formats.nlpl_archive`.
"""

from .compat.simple_elmo import ElmoModel, SimpleElmoExit
from .compat.simple_elmo_vocab import Batcher, UnicodeCharsVocabulary, Vocabulary
from .formats.nlpl_archive import NlplArchive, open_nlpl

__all__ = ["ElmoModel", "SimpleElmoExit", "Batcher", "UnicodeCharsVocabulary", "Vocabulary", "NlplArchive", "open_nlpl"]
