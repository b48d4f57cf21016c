"""Verification, beside the biLM core: each compiled op against its reference twin on this machine, and
what was built.

* :mod:`~elmo_fast.verification.tolerances`       the one table of per-op bounds, fast vs reference (tests, doctor,
                                                  self-check)
* :mod:`~elmo_fast.verification.selfcheck_cases`  the inputs of each op's check, and the schedules it runs in
                                                  (packed weights, GEMV thresholds, LSTM tunings)
* :mod:`~elmo_fast.verification.selfcheck`        each op (and the whole model) against its twin: ``elmo-fast doctor``
* :mod:`~elmo_fast.verification.first_use`        ``ELMO_FAST_SELFCHECK``: each op checked on its first use (on for CUDA
                                                  ops by default), the one record of what that decided (fallbacks)
* :mod:`~elmo_fast.verification.fallback`         an op that failed its first-use check: its twin, called as the op is
* :mod:`~elmo_fast.verification.build_report`     what was built: version, torch, backends, CUDA archs (``--version``)

Importing this package imports none of them: :mod:`elmo_fast.bilm` installs the first-use check when it
is imported.
"""
