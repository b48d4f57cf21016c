"""``import elmo_fast.as_allennlp``: allennlp 0.9's ELMo import path, backed by elmo-fast, for code that
does ``from allennlp.commands.elmo import ElmoEmbedder`` and cannot be changed (flair's
``ELMoEmbeddings``, seqvec, bio_embeddings' ``SeqVecEmbedder``, allennlp-0.9-era scripts)::

    import elmo_fast.as_allennlp      # one line, before importing flair / seqvec / bio_embeddings
    from flair.embeddings import ELMoEmbeddings

or, with no code edited (a command line such as ``seqvec -i proteins.fa -o out.h5``)::

    ELMO_FAST_AS_ALLENNLP=1 seqvec -i proteins.fa -o out.h5 --model seqvec_model/

(the install puts a ``.pth`` hook in site-packages that imports this module at interpreter start when
that variable is set, and does nothing otherwise).

Only asking activates it: attribute access (``elmo_fast.as_allennlp``, ``hasattr``, ``dir``) never
imports it, and a tool that imports every module of the package to read it (pytest's
``--doctest-modules``, Sphinx, pydoc, ``pkgutil.walk_packages``) gets the module without the stand-in
(the module is then imported: in such a process, ``activate()`` turns it on).

What it provides, module by module: :data:`elmo_fast.compat.allennlp09.PROVIDED`; anything else under
``allennlp`` is not there (``find_spec`` answers None). Without activation nothing named ``allennlp``
exists. A real allennlp is never shadowed: when one is installed (or imported), activating says so in one
line (a :class:`~elmo_fast.compat.allennlp09.finder.RealAllennlpWarning`) and changes nothing; one that
becomes importable later is imported instead of the stand-in (see :mod:`elmo_fast.compat.allennlp09.finder`).

``activate()`` / ``deactivate()`` / ``is_active()`` do the same from code.
"""

from __future__ import annotations

import sys

from .compat.allennlp09.finder import ENV_VAR, RealAllennlpWarning, activate, deactivate, is_active

__all__ = ["ENV_VAR", "RealAllennlpWarning", "activate", "deactivate", "is_active"]

#: the modules of tools that import a package's every module to read it, not to use it
_WALKERS = ("_pytest.", "sphinx.", "pydoc", "pkgutil", "doctest")


def _importer() -> str:
    """The module whose code imports this one (called from its body; the import machinery's frames skipped)."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_globals.get("__name__") or ""
        if not (frame.f_code.co_filename.startswith("<frozen importlib") or name.split(".")[0] == "importlib"):
            return name
        frame = frame.f_back
    return ""


if not _importer().startswith(_WALKERS):
    activate()
