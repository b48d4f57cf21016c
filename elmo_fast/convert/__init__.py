"""Converting TensorFlow ELMo checkpoints (bilm-tf training runs, TF-Hub modules) into model
directories, without TensorFlow.

* :mod:`~elmo_fast.convert.sources`    which checkpoint a folder holds (the latest, or ``step``)
* :mod:`~elmo_fast.convert.variables`  bilm-tf's and TF-Hub's variable names -> bilm-tf's datasets,
                                       and the architecture the shapes tell
* :mod:`~elmo_fast.convert.converter`  read, check, then write OUT_DIR

The checkpoint format itself is a file format: :mod:`elmo_fast.formats.tf_checkpoint`.
"""

from .converter import OUTPUT_FILES, Conversion, convert

__all__ = ["convert", "Conversion", "OUTPUT_FILES"]
