#!/usr/bin/env bash
# The peer libraries the tests compare with or run on elmo-fast, installed for the README's test command
# (run inside the project's venv, from anywhere):
#
#   .peers/site/           allennlp 2.10.1 and ELMoForManyLangs (tests/peers.txt), without their dependency
#                          trees (they pin old torch versions)
#   .peers/allennlp-0.9/   allennlp 0.9.0, the release flair, seqvec and bio_embeddings were written for:
#                          the peer of elmo-fast's allennlp 0.9 import path (tests/compat/test_as_allennlp.py)
#   .peers/bio-embeddings/ bio-embeddings 0.2.2 (its package imports every embedder it has; the tests load
#                          its SeqVec module's file alone)
#   the venv:              flair 0.15.1 (with its dependencies: it installs on torch 2.x) and seqvec 0.4.1
#                          (--no-deps: its one stale pin is allennlp, which elmo-fast stands in for)
#
# allennlp is kept OUT of the venv on purpose: elmo-fast's allennlp import path never shadows a real
# allennlp, so the tests that drive flair and seqvec on it need an environment without one. Tests add
# a .peers folder to their own sys.path when they compare (tests/support/peers.py); each skips, naming this
# script, when what it needs is missing. ELMO_FAST_PEERS moves the folder.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PEERS="${ELMO_FAST_PEERS:-$ROOT/.peers}"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
pip install -q --no-deps --upgrade --target "$PEERS/site" -r "$ROOT/tests/peers.txt"
pip install -q --no-deps --upgrade --target "$PEERS/allennlp-0.9" allennlp==0.9.0
pip install -q --no-deps --upgrade --ignore-requires-python --target "$PEERS/bio-embeddings" bio-embeddings==0.2.2
pip install -q flair==0.15.1
pip install -q --no-deps seqvec==0.4.1
