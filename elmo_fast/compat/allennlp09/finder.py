"""The import hook behind :mod:`elmo_fast.as_allennlp`: a meta path finder that serves the modules of
:data:`~elmo_fast.compat.allennlp09.PROVIDED` under the name ``allennlp``, and nothing else under it
(``importlib.util.find_spec`` answers None for any other ``allennlp.*`` module; importing one is the usual
ModuleNotFoundError; a name a provided module lacks is an AttributeError saying what is provided).

It also runs post-import hooks (:data:`POST_IMPORT`) on the modules of libraries that need more than
allennlp from a compatibility front: flair's ``ELMoEmbeddings`` cannot be saved without one
(:mod:`elmo_fast.compat.flair`).

Never over a real allennlp: :func:`activate` looks for one first (imported already, or importable) and,
when there is one, says so in one line and changes nothing. Once active, the finder asks the other
finders for ``allennlp`` every time it is consulted, so that one that becomes importable later (a folder
put on ``sys.path``, an install from a notebook) is imported instead, with one line saying so. Modules
of the stand-in imported before that stay for the process (Python keeps imported modules, and mixing
the two would be worse): the line says so, and :func:`deactivate` drops them, after which ``import
allennlp`` finds the real one.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings

from . import PACKAGES, PROVIDED

#: the environment variable that activates the import path at interpreter start (the .pth hook)
ENV_VAR = "ELMO_FAST_AS_ALLENNLP"

#: module -> "elmo_fast module:function" run on it once it is imported (and at activation if it is already)
POST_IMPORT = {"flair.embeddings.legacy": "elmo_fast.compat.flair:make_elmo_embeddings_saveable"}


class RealAllennlpWarning(UserWarning):
    """A real allennlp is installed or imported: the stand-in stays off."""


def _summary() -> str:
    modules = sorted(m for m in PROVIDED if m not in PACKAGES)
    return ", ".join(modules)


def not_provided_message(name: str) -> str:
    """Why ``import name`` fails with the stand-in active: one line."""
    return (
        f"No module named {name!r}: elmo-fast stands in for allennlp (elmo_fast.as_allennlp / {ENV_VAR}=1) on "
        f"ELMo's import path only ({_summary()}); for the rest of allennlp, install allennlp itself, in an "
        f"environment of its own"
    )


def _resolve(target: str) -> object:
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


class _MissingName:
    """A provided module's ``__getattr__``: names outside ELMo's path are an AttributeError saying why."""

    def __init__(self, module: str) -> None:
        self.module = module

    def __call__(self, name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"{self.module}.{name} is not provided: elmo-fast stands in for allennlp on ELMo's "
            f"import path only ({_summary()})"
        )


class AllennlpFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves ``allennlp`` and its provided submodules; hooks :data:`POST_IMPORT` modules."""

    # ---- finder ----------------------------------------------------------------------------------

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname == "allennlp" or fullname.startswith("allennlp."):
            return self._allennlp_spec(fullname)
        if fullname in POST_IMPORT:
            return self._hooked_spec(fullname, path, target)
        return None

    def _allennlp_spec(self, fullname: str):
        """The stand-in's spec of ``fullname``, or None: for modules it does not provide, and whenever a
        real allennlp is imported or, the stand-in's own not yet imported, importable (asked of the other
        finders at every call)."""
        top = sys.modules.get("allennlp")
        if top is not None and not getattr(top, "ELMO_FAST_STAND_IN", False):
            return None  # a real allennlp is imported: its submodules are its own
        real = _real_spec()
        if real is not None:
            if top is None:
                _say_once(
                    f"elmo_fast.as_allennlp: a real allennlp is importable now ({_where(real)}); it is imported, "
                    "and elmo-fast's stand-in stays out"
                )
                return None
            _say_once(
                f"elmo_fast.as_allennlp: a real allennlp is importable now ({_where(real)}), but elmo-fast's "
                "stand-in was imported first in this process: its modules stay (call "
                "elmo_fast.as_allennlp.deactivate() before importing allennlp again to use the real one)"
            )
        if fullname not in PROVIDED:
            return None
        return importlib.util.spec_from_loader(fullname, self, is_package=fullname in PACKAGES)

    def _hooked_spec(self, fullname: str, path, target):
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PostImportLoader(spec.loader, POST_IMPORT[fullname])
                return spec
        return None

    # ---- loader (the allennlp modules) -----------------------------------------------------------

    def create_module(self, spec):
        return None  # the default module object

    def exec_module(self, module: types.ModuleType) -> None:
        name = module.__name__
        names = PROVIDED.get(name)
        if names is None:
            raise ModuleNotFoundError(not_provided_message(name), name=name)
        module.__dict__["ELMO_FAST_STAND_IN"] = True
        for attribute, target in names.items():
            setattr(module, attribute, _resolve(target))
        module.__dict__["__getattr__"] = _MissingName(name)
        if name in PACKAGES:
            module.__path__ = []  # submodules come from this finder only


class _PostImportLoader(importlib.abc.Loader):
    """A module's own loader, then a hook on the module it loaded."""

    def __init__(self, loader, hook: str) -> None:
        self._loader = loader
        self._hook = hook

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self._loader.exec_module(module)
        _resolve(self._hook)(module)

    def __getattr__(self, name: str):  # get_source, get_code, is_package, resource readers ...
        return getattr(self._loader, name)


_FINDER = AllennlpFinder()


def is_active() -> bool:
    """Whether the stand-in serves ``allennlp`` in this process."""
    return _FINDER in sys.meta_path


def _real_spec():
    """The spec of ``allennlp`` from the finders other than the stand-in's, or None."""
    for finder in sys.meta_path:
        if finder is _FINDER or not hasattr(finder, "find_spec"):
            continue
        try:
            spec = finder.find_spec("allennlp", None, None)
        except (ImportError, ValueError):
            continue
        if spec is not None:
            return spec
    return None


def _where(spec) -> str:
    return spec.origin or (list(spec.submodule_search_locations or []) or ["?"])[0]


_said: set[str] = set()


def _say_once(message: str) -> None:
    if message not in _said:
        _said.add(message)
        warnings.warn(message, RealAllennlpWarning, stacklevel=3)


def real_allennlp() -> str | None:
    """Where a real allennlp is (imported already, or importable), or None."""
    module = sys.modules.get("allennlp")
    if module is not None and not getattr(module, "ELMO_FAST_STAND_IN", False):
        return getattr(module, "__file__", None) or repr(module)
    if module is not None:
        return None
    spec = _real_spec()
    return None if spec is None else _where(spec)


def activate() -> bool:
    """Serve allennlp 0.9's ELMo import path from elmo-fast in this process; True when it does.
    With a real allennlp installed or imported, one line (a :class:`RealAllennlpWarning`) says so and
    nothing changes (False)."""
    if is_active():
        return True
    real = real_allennlp()
    if real is not None:
        warnings.warn(
            f"elmo_fast.as_allennlp: a real allennlp is installed ({real}); it is used, and elmo-fast's "
            "stand-in stays off",
            RealAllennlpWarning,
            stacklevel=3,
        )
        return False
    sys.meta_path.insert(0, _FINDER)
    for module, hook in POST_IMPORT.items():  # imported before activation: hook them now
        if module in sys.modules:
            _resolve(hook)(sys.modules[module])
    return True


def deactivate() -> None:
    """Stop serving ``allennlp`` (the modules imported so far leave ``sys.modules``)."""
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
    for name in [m for m in sys.modules if m == "allennlp" or m.startswith("allennlp.")]:
        if getattr(sys.modules[name], "ELMO_FAST_STAND_IN", False):
            del sys.modules[name]
