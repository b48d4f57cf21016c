"""The package's architecture, checked from its source: no import cycles, and the rooms depend on
each other in one direction only (kernels and ops know nothing of files or the CLI; the reference
never imports the fast path)."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import cli_process
import pytest
from repo_paths import REPO

PACKAGE = REPO / "elmo_fast"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every elmo_fast module ``name`` imports, wherever the import stands (top level, inside a
    function, under ``if TYPE_CHECKING``): a cycle through a lazy import is still a cycle of the design."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # `from pkg import sub` imports the submodule when there is one, else a name of pkg
            targets = [
                f"{module}.{alias.name}" if f"{module}.{alias.name}" in known else module for alias in node.names
            ]
        else:
            continue
        out.update(t for t in targets if t == "elmo_fast" or t.startswith("elmo_fast."))
    out.discard(name)
    return out


@functools.cache
def _parsed_graph() -> dict[str, frozenset[str]]:
    modules = _modules()
    known = set(modules) | {"elmo_fast._C"}
    return {name: frozenset(_imports(name, path, known)) for name, path in modules.items()}


def _graph() -> dict[str, set[str]]:
    """Each module's imports of the package. The sources are parsed once per test run (each of the ~40
    checks below parsing them again cost a second or more each), and each caller gets its own copy."""
    return {name: set(deps) for name, deps in _parsed_graph().items()}


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    color: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        color[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if color.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in color and (found := visit(nxt)):
                return found
        stack.pop()
        color[node] = 2
        return None

    for node in sorted(graph):
        if node not in color and (found := visit(node)):
            return found
    return None


def _without_package_inits(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Modules only: a package's ``__init__`` re-exports its rooms, and importing a submodule runs
    its parents' ``__init__`` first, which is import order, not a dependency of the submodule."""
    packages = {name for name, path in _modules().items() if path.name == "__init__.py"}
    return {n: {t for t in deps if t not in packages} for n, deps in graph.items() if n not in packages}


def test_the_detector_finds_cycles():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_relative_imports_are_resolved():
    graph = _graph()
    assert "elmo_fast.bilm.ops" in graph["elmo_fast.bilm.model"]  # from . import ops
    assert "elmo_fast.errors" in graph["elmo_fast.bilm.model"]  # from ..errors import
    assert "elmo_fast._C" in graph["elmo_fast._extension_status"]  # from elmo_fast import _C


def test_no_import_cycle_between_modules():
    cycle = _find_cycle(_without_package_inits(_graph()))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "elmo_fast"


def test_no_import_cycle_between_rooms():
    """Rooms (elmo_fast.bilm, .formats, .embedding, ...) form a DAG, the package's own __init__ aside."""
    rooms: dict[str, set[str]] = {}
    for module, deps in _without_package_inits(_graph()).items():
        rooms.setdefault(_room(module), set()).update(_room(d) for d in deps if _room(d) != _room(module))
    rooms.pop("elmo_fast", None)
    cycle = _find_cycle(rooms)
    assert cycle is None, "rooms import each other in a cycle: " + " -> ".join(cycle)


# What each low-level module may import from the package (besides itself and the stdlib/torch).
ALLOWED = {
    "elmo_fast.errors": set(),
    # this machine's name, one owner for every place that shows it
    "elmo_fast.host": set(),
    # one run per target: a lock any room may take, knowing none of them
    "elmo_fast.run_lock": {"elmo_fast.errors", "elmo_fast.host"},
    # what the API takes as tokenized sentences: one check for every entry point, knowing none of them
    "elmo_fast.sentences": {"elmo_fast.errors"},
    "elmo_fast.bilm.char_ids": {"elmo_fast.sentences"},
    "elmo_fast.bilm.word_char_ids": {"elmo_fast.sentences"},
    # the oracle: plain PyTorch, never the fast path
    "elmo_fast.bilm.reference": {"elmo_fast.bilm.char_ids"},
    # the ops know nothing of files, models or the CLI: the extension (and what it was built
    # against, to explain one that does not load) and the error types only
    "elmo_fast.bilm.ops": {"elmo_fast._extension_status", "elmo_fast.errors"},
    "elmo_fast._extension_info": set(),
    # whether the extension loaded and what it holds: the one place that imports it
    "elmo_fast._extension_status": {"elmo_fast._C", "elmo_fast._extension_info", "elmo_fast.errors"},
    # the stages hold weights and run ops or their twins; the model composes them with the parts below
    "elmo_fast.bilm.stages": {"elmo_fast.bilm.ops", "elmo_fast.bilm.reference", "elmo_fast.errors"},
    # the parts ElmoBiLm composes, each knowing nothing of the model (nor of each other, the ops aside)
    "elmo_fast.bilm.precision": {"elmo_fast.errors"},
    "elmo_fast.bilm.backends": {"elmo_fast.bilm.ops", "elmo_fast.errors"},
    "elmo_fast.bilm.distinct_rows": set(),
    "elmo_fast.bilm.token_cache": {"elmo_fast.bilm.ops"},
    "elmo_fast.bilm.derived_weights": set(),
    "elmo_fast.bilm.cuda_graphs": set(),
    "elmo_fast.bilm.legacy_keys": set(),
    "elmo_fast.bilm.vocab_cache": {"elmo_fast.errors"},
    # the CPU kernels' choices as the ops take them, and the seam where a model asks for its own (the tuning
    # room answers, installed by elmo_fast.bilm's package init): the model knows nothing of the tuning room
    "elmo_fast.bilm.cpu_choices": set(),
    # the tuning room, beside the core: one owner for its key (key.py) and its state (cpu_tuning.py)
    "elmo_fast.tuning.environment": {"elmo_fast.errors"},
    "elmo_fast.tuning.dispatch": {"elmo_fast.bilm.ops", "elmo_fast.tuning.environment"},
    "elmo_fast.tuning.key": {"elmo_fast.tuning.dispatch"},
    "elmo_fast.tuning.measure": set(),
    # measured through the ops, gated by their reference twins and the one table of bounds
    "elmo_fast.tuning.calibration": {
        "elmo_fast.bilm.ops",
        "elmo_fast.bilm.reference",
        "elmo_fast.verification.tolerances",
        "elmo_fast.bilm.cpu_choices",
        "elmo_fast.tuning.measure",
    },
    "elmo_fast.tuning.recheck": {
        "elmo_fast.bilm.ops",
        "elmo_fast.bilm.cpu_choices",
        "elmo_fast.tuning.calibration",
        "elmo_fast.tuning.measure",
    },
    # remembered through the one write path, in the one cache directory
    "elmo_fast.tuning.store": {
        "elmo_fast.bilm.cpu_choices",
        "elmo_fast.cache_dir",
        "elmo_fast.durable",
        "elmo_fast.tuning.calibration",
        "elmo_fast.tuning.key",
    },
    "elmo_fast.tuning.cpu_tuning": {
        "elmo_fast.bilm.cpu_choices",
        "elmo_fast.run_lock",
        "elmo_fast.tuning.calibration",
        "elmo_fast.tuning.dispatch",
        "elmo_fast.tuning.environment",
        "elmo_fast.tuning.key",
        "elmo_fast.tuning.measure",
        "elmo_fast.tuning.recheck",
        "elmo_fast.tuning.store",
    },
    # which model a constructor was given: the formats, the bundled model's directory, and a model by name
    # (model=) made local
    "elmo_fast.model_source": {
        "elmo_fast.errors",
        "elmo_fast.formats.bilm_tf",
        "elmo_fast.formats.manylangs_dir",
        "elmo_fast.formats.model_dir",
        "elmo_fast.pretrained.bundled",
        "elmo_fast.pretrained.fetch",
    },
    # verification, beside the core: its door loads nothing (elmo_fast.bilm installs the first-use check)
    "elmo_fast.verification": set(),
    # the one table of bounds: plain numbers, used by the tests and the self-check alike
    "elmo_fast.verification.tolerances": set(),
    # the self-check's inputs: the ops and their twins, nothing else (the CLI's doctor drives them)
    "elmo_fast.verification.selfcheck_cases": {"elmo_fast.bilm.ops", "elmo_fast.bilm.reference"},
    # the first-use check's state, and the ops' hook: the ops, the checks and the twins (bound when enabled)
    "elmo_fast.verification.first_use": {
        "elmo_fast.bilm.ops",
        "elmo_fast.verification.fallback",
        "elmo_fast.verification.selfcheck",
        "elmo_fast.verification.selfcheck_cases",
    },
    # the opt-in allennlp import path is set up at interpreter start (a .pth hook): its door and finder import
    # nothing of the model (the table of what it provides is plain data; the modules load on first import)
    "elmo_fast.as_allennlp": {"elmo_fast.compat.allennlp09.finder"},
    "elmo_fast.compat.allennlp09.finder": {"elmo_fast.compat.allennlp09"},
    "elmo_fast.compat.allennlp09": set(),
    # an op that failed its first-use self-check: its twin, called as the op is (nothing of the fast path)
    "elmo_fast.verification.fallback": {"elmo_fast.bilm.reference"},
    # the one cache directory, at the bottom of the house: every room that keeps files between runs asks it
    "elmo_fast.cache_dir": set(),
}


@pytest.mark.parametrize("module", sorted(ALLOWED))
def test_low_level_modules_import_only_what_they_may(module):
    imported = _graph()[module]
    assert imported <= ALLOWED[module], f"{module} imports {sorted(imported - ALLOWED[module])}"


def _durable_modules() -> list[str]:
    return sorted(m for m in _modules() if m == "elmo_fast.durable" or m.startswith("elmo_fast.durable."))


@pytest.mark.slow
def test_the_write_path_knows_none_of_the_rooms():
    """elmo_fast.durable, the one write path: every room writes through it, it knows none of them (its
    own modules, the error types and the host's name only)."""
    modules = _durable_modules()
    assert "elmo_fast.durable.file_writers" in modules and "elmo_fast.durable.temp_names" in modules
    for module in modules:
        bad = {
            d
            for d in _graph()[module]
            if not (d.startswith("elmo_fast.durable") or d in ("elmo_fast.errors", "elmo_fast.host"))
        }
        assert not bad, f"{module} imports {sorted(bad)}"


def test_formats_know_nothing_of_modules_or_the_fast_path():
    for module, deps in _graph().items():
        if module.startswith("elmo_fast.formats"):
            bad = {d for d in deps if _room(d) not in ("formats", "errors", "durable", "textio")}
            assert not bad, f"{module} imports {sorted(bad)}"


def test_only_the_cli_and_main_import_the_cli():
    for module, deps in _graph().items():
        if not (module.startswith("elmo_fast.cli") or module == "elmo_fast.__main__"):
            assert not any(d.startswith("elmo_fast.cli") for d in deps), f"{module} imports the CLI"


def test_the_ray_room_is_a_leaf():
    """elmo_fast.ray (the [ray] extra) imports the core, never the other way: nothing else in the package
    imports it, and it imports neither the CLI nor the compatibility fronts."""
    graph = _graph()
    assert "elmo_fast.ray.batch_embedder" in graph  # the rule below must not be checking an empty room
    for module, deps in graph.items():
        inside = module == "elmo_fast.ray" or module.startswith("elmo_fast.ray.")
        if not inside:
            assert not any(d == "elmo_fast.ray" or d.startswith("elmo_fast.ray.") for d in deps), (
                f"{module} imports the Ray room"
            )
        else:
            bad = {d for d in deps if _room(d) in ("cli", "compat")}
            assert not bad, f"{module} imports {sorted(bad)}"


def test_only_the_cli_and_the_ray_room_import_the_server():
    """elmo_fast.serve (the [serve] extra) is reached from the CLI (`elmo-fast serve`) and the Ray room (its
    Ray Serve replicas run the same app) only: a core install need not have Starlette or uvicorn."""
    for module, deps in _graph().items():
        if module.startswith(("elmo_fast.serve", "elmo_fast.cli", "elmo_fast.ray")) or module == "elmo_fast.__main__":
            continue
        assert not any(d.startswith("elmo_fast.serve") for d in deps), f"{module} imports the server"


@pytest.mark.slow
def test_importing_elmo_fast_imports_no_ray():
    """``import elmo_fast`` (and the Ray room's door, and its batch embedder) import no Ray: a core install
    has none, and the actors Ray starts import it themselves."""

    import sys

    code = (
        "import sys, elmo_fast, elmo_fast.ray\n"
        "from elmo_fast import ElmoEmbedder\n"
        "from elmo_fast.ray import ElmoBatchEmbedder\n"
        "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))"
    )
    proc = cli_process.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", f"Ray modules imported: {proc.stdout.strip()}"


@pytest.mark.slow
def test_only_the_hub_module_names_huggingface_hub_and_nothing_imports_it_at_once():
    """huggingface_hub (the [hub] extra) is reached through elmo_fast/pretrained/hf_hub.py alone, which
    imports it when a Hub model is asked for: a core install has none, and loading a model from files
    or the pretrained room costs no import of it."""
    import sys

    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "hf_hub.py":
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            assert not any(n.split(".")[0] == "huggingface_hub" for n in names), f"{path} imports huggingface_hub"
    code = (
        "import sys, elmo_fast, elmo_fast.pretrained, elmo_fast.pretrained.hf_hub, elmo_fast.cli.models\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'huggingface_hub'))"
    )
    proc = cli_process.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", f"huggingface_hub modules imported: {proc.stdout.strip()}"


def test_kernels_know_nothing_of_python():
    """csrc/: no Python.h outside the module stub, no reference to files or the CLI."""
    csrc = PACKAGE.parent / "csrc"
    for path in sorted(csrc.rglob("*")):
        if path.suffix not in (".cpp", ".cu", ".cuh", ".h"):
            continue
        text = path.read_text()
        if path.name != "elmo_fast.cpp":
            assert "Python.h" not in text and "pybind11" not in text, f"{path} includes Python"
        assert "hdf5" not in text.lower() and "argparse" not in text, f"{path} knows of files or the CLI"


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return "?"


def _writes(call: ast.Call) -> str | None:
    """What a call writes to disk, in words, or None."""
    name = _dotted(call.func)
    last = name.rsplit(".", 1)[-1]

    def mode(index: int) -> str | None:
        arg = (
            call.args[index]
            if len(call.args) > index
            else next((k.value for k in call.keywords if k.arg == "mode"), None)
        )
        if arg is None:
            return "r"
        return arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else "?"

    if name in ("open", "io.open", "builtins.open") or name.endswith("File") and name.split(".")[0] == "h5py":
        m = mode(1)
        return None if m in ("r", "rb", "rt") else f"{name}(..., {m!r})"
    if name == "os.open":
        flags = {n.attr if isinstance(n, ast.Attribute) else getattr(n, "id", "") for n in ast.walk(call.args[1])}
        return (
            f"{name} with {sorted(flags & {'O_WRONLY', 'O_RDWR', 'O_CREAT', 'O_APPEND'})}"
            if flags & {"O_WRONLY", "O_RDWR", "O_CREAT", "O_APPEND"}
            else None
        )
    if name in ("os.replace", "os.rename", "torch.save", "shutil.move") or (
        name.startswith(("tempfile.", "shutil.copy")) and name != "shutil.copyfileobj"
    ):  # (streams)
        return name
    if last in ("mkstemp", "NamedTemporaryFile"):
        return name
    if (
        last in ("write_text", "write_bytes")
        and isinstance(call.func, ast.Attribute)
        and not (_dotted(call.func.value).split(".")[-1] == "durable")
    ):  # Path.write_text, not durable.write_text
        return name
    return None


def test_every_file_is_written_through_the_durable_module():
    """A file under its final name is whole: only the elmo_fast.durable package opens files for writing,
    saves tensors or renames files; every other module writes through it (a file opened there and
    written elsewhere, as a pending HDF5 output, is fine: durable made it and commits it)."""
    found = []
    writers = set(_durable_modules())
    # a package of several modules: the rule below must not be skipping a module that is not there
    assert {"elmo_fast.durable.file_writers", "elmo_fast.durable.commit_steps"} <= writers
    for name, path in _modules().items():
        # run_lock creates its lock file in place (a lock must keep its inode; it is not an output)
        if name in writers or name == "elmo_fast.run_lock":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and (what := _writes(node)):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {what}")
    assert not found, "writes outside elmo_fast.durable:\n" + "\n".join(found)


def test_the_write_detector_finds_writes():
    def calls(source: str) -> list[str | None]:
        return [_writes(n) for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call)]

    assert calls("open(p, 'w')") == ["open(..., 'w')"] and calls("open(p)") == [None]
    assert calls("h5py.File(p, 'r')") == [None] and calls("h5py.File(p, mode='a')") == ["h5py.File(..., 'a')"]
    assert calls("torch.save(x, p)") == ["torch.save"] and calls("Path(p).write_text(t)")[0] == "?.write_text"
    assert calls("os.open(p, os.O_CREAT | os.O_EXCL)")[0] == "os.open with ['O_CREAT']"
    assert calls("shutil.copyfile(a, b)") == ["shutil.copyfile"] and calls("shutil.copyfileobj(a, b)") == [None]
    assert calls("os.open(p, os.O_RDONLY)")[0] is None and calls("os.replace(a, b)") == ["os.replace"]
    assert calls("durable.write_text(p, t)") == [None] and calls("write_text(p, t)") == [None]


def test_package_doors_load_nothing_eagerly():
    """``import elmo_fast`` (and ``elmo_fast.compat``) bind names on first use: the allennlp import path's
    .pth hook imports elmo_fast at every interpreter start where it is asked for, so the door must be light."""
    import ast as _ast

    for door in (PACKAGE / "__init__.py", PACKAGE / "compat" / "__init__.py", PACKAGE / "ray" / "__init__.py"):
        tree = _ast.parse(door.read_text())
        eager = [
            n
            for n in tree.body
            if isinstance(n, (_ast.Import, _ast.ImportFrom))
            and not (isinstance(n, _ast.ImportFrom) and n.module == "__future__")
            and not all(a.name.split(".")[0] == "importlib" for a in n.names)
        ]
        assert not eager, f"{door} imports at load time: {[_ast.unparse(n) for n in eager]}"


def test_compatibility_fronts_hold_no_model_code():
    """A front translates to the core: no torch.nn layers of its own (Linear, LSTM, Conv1d, Embedding ...)."""
    layers = {"Linear", "LSTM", "LSTMCell", "Conv1d", "Embedding", "GRU", "Highway"}
    for path in sorted((PACKAGE / "compat").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in layers:
                if isinstance(node.func.value, ast.Name) and node.func.value.id in ("nn", "torch"):
                    raise AssertionError(f"{path}: builds a {node.func.attr} layer; fronts translate to the core")


def test_no_test_folder_shadows_a_library():
    """tests/ is on sys.path (tests/conftest.py): a folder named like a library the tests import (tests/ray/)
    would be found as a namespace package of that name wherever the library is not installed."""
    tests = REPO / "tests"
    imported = set()
    for path in [*tests.rglob("*.py"), *(REPO / "docs").glob("*.md"), REPO / "README.md"]:
        imported |= set(re.findall(r"^\s*(?:from|import) (\w+)", path.read_text(encoding="utf-8"), re.M))
    folders = {p.name for p in tests.iterdir() if p.is_dir() and not (p / "__init__.py").exists()}
    clash = sorted(folders & imported)
    assert not clash, f"tests/ folders named like imported libraries: {clash}"


_IMPORT_EACH_FIRST = r"""
import importlib, os, sys, traceback
# the libraries the package imports, imported once before the forks where installed: each child then imports
# only elmo_fast's own modules, in a second or less
for library in os.environ["LIBRARIES"].split():
    try:
        importlib.import_module(library)
    except Exception:
        pass
def child(name):
    code = 0
    try:
        __import__(name)
    except ModuleNotFoundError as e:  # an optional extra this install lacks is not this test's business
        if (e.name or "").split(".")[0] == "elmo_fast":
            traceback.print_exc()
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush(); sys.stderr.flush()
    os._exit(code)
failed, running, waiting = [], {}, list(sys.argv[1:])
while waiting or running:  # a child per module, as many at once as there are CPUs
    while waiting and len(running) < (os.cpu_count() or 1):
        name = waiting.pop()
        pid = os.fork()
        if pid == 0:
            child(name)
        running[pid] = name
    pid, status = os.wait()
    if status:
        failed.append(running[pid])
    del running[pid]
print("FAILED:", " ".join(failed))
"""


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork (each module in a fresh child)")
def test_every_module_imports_when_it_is_the_first_one_imported():
    """Each module of the package that another imports, imported first in an interpreter that has imported none
    of them (a forked child per module): an order of imports that only works when another module came first is an import cycle
    the static graph above cannot see (a package's ``__init__`` that runs code calling back into a module still
    being imported: ``elmo_fast.verification.selfcheck_cases`` -> ``elmo_fast.bilm`` -> the first-use check)."""
    import os
    import sys

    # a module can only be found half-imported if some module imports it (a package's __init__ included)
    imported = set().union(*_graph().values())
    names = sorted(n for n in _modules() if n in imported and not n.endswith("__main__"))
    libraries = set()
    for path in _modules().values():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                libraries.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                libraries.add(node.module)
    libraries = sorted(
        m for m in libraries if m.split(".")[0] not in sys.stdlib_module_names | {"elmo_fast", "flair"}
    )  # (flair is left to the children: importing it runs allennlp's import path, which elmo_fast may stand in for)
    proc = cli_process.run(
        [sys.executable, "-c", _IMPORT_EACH_FIRST, *names],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        env={**os.environ, "LIBRARIES": " ".join(libraries)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    failed = proc.stdout.strip().splitlines()[-1].removeprefix("FAILED:").split()
    assert not failed, f"modules that fail when imported first: {failed}\n{proc.stderr[-3000:]}"
