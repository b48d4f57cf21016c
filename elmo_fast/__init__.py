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
"""
from . import pretrained
from .bilm import ElmoBiLm, ScalarMix, batch_to_ids
from .compat import Elmo, HubElmo, hub_module, hub_signature
from .embedding import ElmoEmbedder
from .errors import (ConfigurationError, DownloadError, ElmoFastError, ExtensionNotBuiltError, InputError,
                     ModelFileError)
from .formats import ElmoOptions, ElmoWeights, load_options, load_weights

__version__ = "0.1.0"

__all__ = [
    "batch_to_ids", "Elmo", "ElmoEmbedder", "ElmoBiLm", "ScalarMix", "ElmoOptions", "ElmoWeights", "load_options",
    "load_weights", "HubElmo", "hub_signature", "hub_module", "pretrained",
    "ElmoFastError", "ModelFileError", "InputError", "DownloadError", "ExtensionNotBuiltError", "ConfigurationError",
    "__version__",
]
