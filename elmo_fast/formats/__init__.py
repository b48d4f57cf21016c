"""Model files: reading (and writing) biLMs in the layouts other tools use, into plain tensors.

* :mod:`~elmo_fast.formats.bilm_tf`  bilm-tf's ``options.json`` + ``weights.hdf5`` (allennlp's and TF-Hub's models)

Formats know nothing of modules: they turn files into :class:`ElmoOptions` and
:class:`ElmoWeights` (tensors in PyTorch layout) and back.
"""
from .bilm_tf import ElmoOptions, ElmoWeights, LstmWeights, load_model_files, load_options, load_weights

__all__ = ["ElmoOptions", "ElmoWeights", "LstmWeights", "load_model_files", "load_options", "load_weights"]
