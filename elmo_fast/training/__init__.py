"""Training and fine-tuning biLMs, bilm-tf's recipe on the elmo-fast core.

* :mod:`~elmo_fast.training.vocab`    vocabularies from corpora
* :mod:`~elmo_fast.training.data`     deterministic batches: sentences, or bilm-tf's unrolled windows
* :mod:`~elmo_fast.training.softmax`  the shared softmax: sampled (log-uniform sampler) and full
* :mod:`~elmo_fast.training.model`    the biLM with dropout and softmax; bilm-tf's initialisation
* :mod:`~elmo_fast.training.trainer`  the loop: Adagrad, clipping, checkpoints, resume, metrics, evaluation
"""
