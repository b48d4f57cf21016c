"""Import the peer implementations the tests compare with: allennlp 2.10.1 and ELMoForManyLangs
0.0.4.post2 (``elmoformanylangs``), installed into ``.peers/site`` by ``bash tests/install_peers.sh``
(outside the venv: elmo-fast's allennlp import path needs an environment without a real allennlp);
:func:`use_peers` puts such a folder on this process's ``sys.path``.

allennlp imports libraries that its ELMo modules never use (transformers, spacy, torchvision,
fairscale, ...); they are not installed here, so an import hook hands it empty stand-ins for
exactly those, and only when the real one is missing. Tests call :func:`allennlp_elmo`, which
skips, saying how to install, when allennlp itself is absent.

ELMoForManyLangs needs no stand-ins: with torch, numpy, h5py (elmo-fast's own dependencies) and
overrides 3.1.0 (in peers.txt) its ``Embedder`` imports and runs on torch 2.13 as it is.
:func:`manylangs_embedder` builds one on the CPU (it would move itself to a GPU when it sees one,
where cuDNN's TF32 convolutions would take its outputs away from fp32).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import sys
import types
from pathlib import Path
from unittest import mock

import pytest
from repo_paths import REPO

# allennlp's imports off the ELMo path (found by importing allennlp.modules.elmo with none of them)
_STUBBED = {"transformers", "spacy", "cached_path", "lmdb", "huggingface_hub", "torchvision", "fairscale"}


class _Anything:
    """Stands for any name of a stubbed library: callable, subclassable, subscriptable."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return _Anything()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything()

    def __class_getitem__(cls, item):
        return cls

    def __iter__(self):
        return iter(())

    def __mro_entries__(self, bases):
        return (object,)


def _cached_path(path, *args, **kwargs):
    return str(path)  # local files only: what the tests pass


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if self.__name__ == "cached_path" and name == "cached_path":
            return _cached_path
        return _Anything


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] not in _STUBBED:
            return None
        if "." not in fullname and importlib.machinery.PathFinder.find_spec(fullname) is not None:
            return None  # the real library is installed: use it
        return importlib.util.spec_from_loader(fullname, self, is_package=True)

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


_finder = _StubFinder()


#: where tests/install_peers.sh installs the peers that stay out of the venv
PEERS = Path(os.environ.get("ELMO_FAST_PEERS") or REPO / ".peers")
INSTALL = "bash tests/install_peers.sh"


def use_peers(folder: str = "site") -> Path:
    """``.peers/<folder>`` at the end of this process's sys.path (installed packages keep precedence)."""
    path = PEERS / folder
    if path.is_dir() and str(path) not in sys.path:
        sys.path.append(str(path))
        importlib.invalidate_caches()
    return path


def allennlp_elmo():
    """``allennlp.modules.elmo``, or a skip naming the install command."""
    use_peers()
    if importlib.util.find_spec("allennlp") is None:
        pytest.skip(f"allennlp is not installed: {INSTALL}")
    if _finder not in sys.meta_path:
        sys.meta_path.append(_finder)  # after the real finders: stubs only for what is missing
    return importlib.import_module("allennlp.modules.elmo")


def manylangs():
    """The ``elmoformanylangs`` package, or a skip naming the install command."""
    use_peers()
    if importlib.util.find_spec("elmoformanylangs") is None:
        pytest.skip(f"ELMoForManyLangs is not installed: {INSTALL}")
    module = importlib.import_module("elmoformanylangs")
    logging.getLogger("elmoformanylangs").setLevel(logging.WARNING)  # it logs every batch at INFO
    return module


def manylangs_embedder(model_dir, batch_size: int = 64):
    """ELMoForManyLangs' own ``Embedder(model_dir, batch_size)``, on the CPU."""
    module = manylangs()
    with mock.patch("torch.cuda.is_available", return_value=False):
        return module.Embedder(str(model_dir), batch_size=batch_size)
