"""Training and fine-tuning biLMs, bilm-tf's recipe on the elmo-fast core.

* :mod:`~elmo_fast.training.vocab`    vocabularies from corpora
* :mod:`~elmo_fast.training.data`     deterministic batches: sentences, or bilm-tf's unrolled windows
* :mod:`~elmo_fast.training.softmax`  the shared softmax: sampled (log-uniform sampler) and full
* :mod:`~elmo_fast.training.model`    the biLM with dropout and softmax; bilm-tf's initialisation
* :mod:`~elmo_fast.training.trainer`  the run: start or resume, the loop (Adagrad, clipping), checkpoints, export
* :mod:`~elmo_fast.training.evaluate` held-out perplexity, full softmax
* :mod:`~elmo_fast.training.stop_signals`     SIGTERM/SIGHUP: the run stops after its step, on a checkpoint
* :mod:`~elmo_fast.training.checkpoints`      checkpoints: written durably, the newest readable found, checked
* :mod:`~elmo_fast.training.run_fingerprint`  digests of the vocabulary, corpus and settings, compared on resume
* :mod:`~elmo_fast.training.metrics_log`      ``metrics.jsonl``: appended by whole lines, a torn last line tolerated
* :mod:`~elmo_fast.training.out_dir`          the output directory: its lock, swept leftovers, no run taken over
"""
