"""elmo-fast: ELMo (Peters et al., 2018) on modern PyTorch, from bilm-tf model files.

The package, by room:

* :mod:`elmo_fast.bilm`          the biLM core: stages (char CNN, highway, projection, biLSTM), their
                                 reference twins, the compiled ops, ``ElmoBiLm`` and the parts it composes
                                 (backends, precision, distinct rows, token cache, derived weights, CUDA
                                 graphs, legacy state-dict keys), ``ScalarMix``
* :mod:`elmo_fast.formats`       model files (bilm-tf's options.json + weights.hdf5, ELMoForManyLangs' directories,
                                 the NLPL repository's archives), random models of the official shapes
* :mod:`elmo_fast.model_source`  which model a constructor was given (files, a directory, weights, or the bundled one)
* :mod:`elmo_fast.embedding`     ``ElmoEmbedder`` and corpus-scale ``embed_file`` (a pipeline, one module a stage)
* :mod:`elmo_fast.compat`        allennlp's ``Elmo`` and ``ConfigurationError``, TF-Hub's signatures,
                                 ELMoForManyLangs' ``Embedder`` (compat/elmoformanylangs.py), simple_elmo's
                                 ``ElmoModel`` (compat/simple_elmo.py)
* :mod:`elmo_fast.manylangs`     ``from elmo_fast.manylangs import Embedder``: ELMoForManyLangs' API and models
* :mod:`elmo_fast.simple_elmo`   ``from elmo_fast.simple_elmo import ElmoModel``: simple_elmo's API, NLPL archives
* :mod:`elmo_fast.pretrained`    models by name
* :mod:`elmo_fast.convert`       TensorFlow checkpoints (bilm-tf runs, TF-Hub modules) into model directories
* :mod:`elmo_fast.cli`           the ``elmo-fast`` command
* :mod:`elmo_fast.durable`       the one write path: every file the package writes is whole under its final name
* :mod:`elmo_fast.run_lock`      one run per target: a lock held for a whole run (a killed holder never blocks)
* :mod:`elmo_fast.sentences`     what the Python API takes as tokenized sentences, checked in one place
* :mod:`elmo_fast.as_allennlp`   ``import elmo_fast.as_allennlp`` (or ``ELMO_FAST_AS_ALLENNLP=1``): allennlp 0.9's ELMo
                                 import path (``allennlp.commands.elmo`` ...) for flair, seqvec and bio_embeddings

Names are loaded on first use (PEP 562): ``import elmo_fast`` alone imports neither torch nor the
extension, so that the opt-in ``allennlp`` import path can be set up at interpreter start for free.
"""

from __future__ import annotations

import importlib
import importlib.util

__version__ = "0.1.0"

#: public name -> the module that defines it
_EXPORTS = {
    "pretrained": "elmo_fast.pretrained",
    "ElmoBiLm": "elmo_fast.bilm",
    "ScalarMix": "elmo_fast.bilm",
    "batch_to_ids": "elmo_fast.bilm",
    "Elmo": "elmo_fast.compat",
    "HubElmo": "elmo_fast.compat",
    "hub_module": "elmo_fast.compat",
    "hub_signature": "elmo_fast.compat",
    "ElmoEmbedder": "elmo_fast.embedding",
    "ConfigurationError": "elmo_fast.errors",
    "DownloadError": "elmo_fast.errors",
    "ElmoFastError": "elmo_fast.errors",
    "ExtensionNotBuiltError": "elmo_fast.errors",
    "InputError": "elmo_fast.errors",
    "ModelFileError": "elmo_fast.errors",
    "ElmoOptions": "elmo_fast.formats",
    "ElmoWeights": "elmo_fast.formats",
    "load_options": "elmo_fast.formats",
    "load_weights": "elmo_fast.formats",
}

__all__ = [
    "batch_to_ids",
    "Elmo",
    "ElmoEmbedder",
    "ElmoBiLm",
    "ScalarMix",
    "ElmoOptions",
    "ElmoWeights",
    "load_options",
    "load_weights",
    "HubElmo",
    "hub_signature",
    "hub_module",
    "pretrained",
    "ElmoFastError",
    "ModelFileError",
    "InputError",
    "DownloadError",
    "ExtensionNotBuiltError",
    "ConfigurationError",
    "__version__",
]


#: submodules that act when imported (the allennlp import path): only ``import elmo_fast.as_allennlp``
#: imports them, never an attribute lookup (``hasattr``, a tool walking the package's attributes)
_ONLY_BY_IMPORT = frozenset({"as_allennlp"})


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        if name.startswith("_") or name in _ONLY_BY_IMPORT or importlib.util.find_spec(f"elmo_fast.{name}") is None:
            raise AttributeError(f"module 'elmo_fast' has no attribute {name!r}")
        return importlib.import_module(f"elmo_fast.{name}")  # a room, as if imported (``elmo_fast.durable``)
    value = (
        importlib.import_module(module)
        if module.endswith("." + name)
        else getattr(importlib.import_module(module), name)
    )
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
