"""Model files: reading (and writing) biLMs in the layouts other tools use, into plain tensors.

* :mod:`~elmo_fast.formats.bilm_tf`        bilm-tf's ``options.json`` + ``weights.hdf5`` (allennlp's and TF-Hub's models)
* :mod:`~elmo_fast.formats.manylangs_dir`  ELMoForManyLangs' model directories (config, dictionaries, state dicts)
* :mod:`~elmo_fast.formats.model_dir`      which kind of model a directory holds, and its weights
* :mod:`~elmo_fast.formats.nlpl_archive`   the NLPL repository's archives (a folder or a .zip; vocab.txt(.gz), meta.json)
* :mod:`~elmo_fast.formats.tf_checkpoint`  TensorFlow checkpoints (tensor bundles), read without TensorFlow
  (:mod:`~elmo_fast.formats.sstable` their index tables, :mod:`~elmo_fast.formats.crc32c` their checksums)

Formats know nothing of modules: they turn files into :class:`ElmoOptions` and
:class:`ElmoWeights` (or :class:`ManyLangsConfig` and :class:`ManyLangsWeights`), tensors in
PyTorch layout, and back.
"""

from .bilm_tf import ElmoOptions, ElmoWeights, LstmWeights, load_model_files, load_options, load_weights
from .manylangs_dir import ManyLangsConfig, ManyLangsWeights, load_manylangs
from .model_dir import inspect_model_dir, load_model_dir

__all__ = [
    "ElmoOptions",
    "ElmoWeights",
    "LstmWeights",
    "load_model_files",
    "load_options",
    "load_weights",
    "ManyLangsConfig",
    "ManyLangsWeights",
    "load_manylangs",
    "inspect_model_dir",
    "load_model_dir",
]
