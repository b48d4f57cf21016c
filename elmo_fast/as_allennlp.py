"""``import elmo_fast.as_allennlp``: allennlp 0.9's ELMo import path, backed by elmo-fast, for code that
does ``from allennlp.commands.elmo import ElmoEmbedder`` and cannot be changed (flair's
``ELMoEmbeddings``, seqvec, bio_embeddings' ``SeqVecEmbedder``, allennlp-0.9-era scripts)::

    import elmo_fast.as_allennlp      # one line, before importing flair / seqvec / bio_embeddings
    from flair.embeddings import ELMoEmbeddings

or, with no code edited (a command line such as ``seqvec -i proteins.fa -o out.h5``)::

    ELMO_FAST_AS_ALLENNLP=1 seqvec -i proteins.fa -o out.h5 --model seqvec_model/

(the install puts a ``.pth`` hook in site-packages that imports this module at interpreter start when
that variable is set, and does nothing otherwise).

What it provides, module by module: :data:`elmo_fast.compat.allennlp09.PROVIDED`; anything else under
``allennlp`` is an ImportError saying so. Without activation nothing named ``allennlp`` exists. A real
allennlp is never shadowed: when one is installed (or imported), activating says so in one line (a
:class:`~elmo_fast.compat.allennlp09.finder.RealAllennlpWarning`) and changes nothing.

``activate()`` / ``deactivate()`` / ``is_active()`` do the same from code.
"""

from __future__ import annotations

from .compat.allennlp09.finder import ENV_VAR, RealAllennlpWarning, activate, deactivate, is_active

__all__ = ["ENV_VAR", "RealAllennlpWarning", "activate", "deactivate", "is_active"]

activate()
