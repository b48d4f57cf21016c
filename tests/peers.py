"""Import the peer implementations the tests compare with: allennlp 2.10.1 (and, where installed,
ELMoForManyLangs), installed with ``pip install --no-deps -r tests/peers.txt``.

allennlp imports libraries that its ELMo modules never use (transformers, spacy, torchvision,
fairscale, ...); they are not installed here, so an import hook hands it empty stand-ins for
exactly those, and only when the real one is missing. Tests call :func:`allennlp_elmo`, which
skips, saying how to install, when allennlp itself is absent.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

import pytest

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


def allennlp_elmo():
    """``allennlp.modules.elmo``, or a skip naming the install command."""
    if importlib.util.find_spec("allennlp") is None:
        pytest.skip("allennlp is not installed: pip install --no-deps -r tests/peers.txt")
    if _finder not in sys.meta_path:
        sys.meta_path.append(_finder)  # after the real finders: stubs only for what is missing
    return importlib.import_module("allennlp.modules.elmo")
