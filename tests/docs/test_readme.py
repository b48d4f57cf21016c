"""README.md and the pages of docs/ stay true: every ```python block runs, and every `elmo-fast ...` command
in a ```bash block is accepted by the argument parser.

The README's quickstarts (each `###` section under `## Quickstarts`) run exactly as printed, as a user
runs them after the README's install: their blocks in order, bash with `bash -e`, python with this
interpreter, in one empty temporary folder, with nothing prepared; only the cache is a fresh empty
folder and the download address a closed port, so that a quickstart that needs the network fails
instead of downloading. A quickstart whose library (ray), extra (the server's) or tool (curl) is missing,
or whose port is taken, skips, saying so.

A block that imports ``elmo_fast.as_allennlp`` runs in a child process (the allennlp import path is per
process), and so does a block that imports ``ray``: its ``ray.init(num_cpus=2)`` joins the test run's one
local Ray (tests/support/ray_local.py) instead of starting one, and its ``ray.shutdown()`` leaves it; each
skips, saying so, when a library it imports (flair, ray, ...) is not installed.

Each python block runs alone, in a namespace of its own (a reader copies one block, not the ones
before it), in a fresh working directory holding what the snippets name: ``options.json`` and
``weights.hdf5`` of a random ``small`` model, ``hun``, a random tiny ELMoForManyLangs model
directory, ``elmo_model``, the same model as an NLPL archive's folder, ``elmo-hub``, a TF-Hub module converted by
``elmo-fast convert`` (tests/fixtures/tf_checkpoints/hub_module), and ``sentences.txt``. It runs offline:
``ELMO_FAST_CACHE`` points at a cache pre-filled with that model under every name
``fetch_model`` knows, and ``ELMO_FAST_BASE_URL`` at a closed local port, so that a snippet that
needs the network fails instead of downloading. A comment ``# np.ndarray (3, 4, D)``,
``# Tensor (...)`` or ``# LongTensor (...)`` on an assignment is checked against the shape of
what was assigned, ``D`` being the model's output width.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import cli_process
import pytest
from repo_paths import REPO as ROOT

README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.M | re.S)
_IMPORTS_RAY = re.compile(r"^\s*(?:from|import) ray\b", re.M)
#: how to install what a block imports, for its skip message (the peers: tests/install_peers.sh)
_INSTALL = {
    "ray": 'pip install "elmo-fast[ray]"',
    "pyarrow": 'pip install "elmo-fast[ray]"',
    "onnx": 'pip install "elmo-fast[onnx]"',
    "onnxruntime": 'pip install "elmo-fast[onnx]"',
}
_SHAPE_COMMENT = re.compile(r"^(?P<name>\w+) = .*#[^#]*?\b(np\.ndarray|Tensor|LongTensor) \((?P<shape>[^)]*)\)")


def _blocks(language: str) -> list[tuple[str, str]]:
    """("FILE:line", text) of each fenced block in that language, README.md and docs/ alike."""
    out = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        where = page.relative_to(ROOT)
        out += [
            (f"{where}:{text[: m.start()].count(chr(10)) + 1}", m.group(2))
            for m in _FENCE.finditer(text)
            if m.group(1) == language
        ]
    return out


def _quickstarts() -> list[tuple[str, list[tuple[str, str, str]]]]:
    """(title, [(language, "README.md:line", text), ...]) of each `###` section under `## Quickstarts`."""
    text = README.read_text(encoding="utf-8")
    start = text.index("\n## Quickstarts\n")
    end = text.find("\n## ", start + 1)
    out = []
    for m in re.finditer(r"^### (.+)$", text[start:end], re.M):
        begin = start + m.start()
        stop = text.find("\n### ", begin + 1)
        stop = end if stop == -1 or stop > end else stop
        blocks = [
            (b.group(1), f"README.md:{text[: begin + b.start()].count(chr(10)) + 1}", b.group(2))
            for b in _FENCE.finditer(text[begin:stop])
        ]
        out.append((m.group(1).strip(), blocks))
    return out


QUICKSTARTS = _quickstarts()
_IN_QUICKSTARTS = {where for _, blocks in QUICKSTARTS for _, where, _ in blocks}
# the quickstarts' python blocks run in their own test (in order, in an empty folder), not in the prepared one
PYTHON = [(line, code) for line, code in _blocks("python") if line not in _IN_QUICKSTARTS]
BASH = _blocks("bash")
#: libraries of a block that make it a peer's test (tests/install_peers.sh installs them)
_PEER_LIBRARIES = {"flair", "seqvec", "allennlp", "bio_embeddings", "elmoformanylangs"}


def _marks(code: str) -> list:
    """A block's markers: ``cluster`` and ``slow`` for Ray's (it joins the run's Ray: see tests/support/markers.py),
    ``peers`` for a peer library's."""
    imported = set(re.findall(r"^\s*(?:from|import) (\w+)", code, re.M))
    ray = [pytest.mark.cluster, pytest.mark.slow] if _IMPORTS_RAY.search(code) else []
    return ray + [pytest.mark.peers] * bool(imported & _PEER_LIBRARIES)


def test_the_readme_has_snippets_to_check():
    assert len(PYTHON) >= 3 and len(BASH) >= 2


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    from elmo_fast.convert.converter import convert
    from elmo_fast.formats.random_models import random_manylangs_model, random_model
    from elmo_fast.pretrained import MODELS

    root = tmp_path_factory.mktemp("readme")
    options, weights = random_model("small", root / "model", seed=1)
    random_manylangs_model("tiny", root / "hun", n_words=200)
    convert(ROOT / "tests" / "fixtures" / "tf_checkpoints" / "hub_module", root / "elmo-hub", log=lambda line: None)
    cache = root / "cache"
    for name in MODELS:  # the names fetch_model looks for, so that fetch_model("original") runs offline
        (cache / name).mkdir(parents=True)
        (cache / name / "options.json").symlink_to(options)
        (cache / name / "weights.hdf5").symlink_to(weights)
    return root, options, weights, cache


@pytest.mark.parametrize("line,code", [pytest.param(line, code, id=line, marks=_marks(code)) for line, code in PYTHON])
@pytest.mark.slow
def test_python_snippet_runs(line, code, workdir, tmp_path, monkeypatch, request):
    import json

    root, options, weights, cache = workdir
    # Ray's blocks run where the run's Ray runs its workers (a task's relative paths lead there), the others here
    here = request.getfixturevalue("ray_workdir") if _IMPORTS_RAY.search(code) else tmp_path
    links = {"options.json": options, "weights.hdf5": weights, "hun": root / "hun", "elmo-hub": root / "elmo-hub"}
    links.update({"elmo_model/options.json": options, "elmo_model/model.hdf5": weights})  # an NLPL archive's folder
    for name, src in links.items():
        if not (here / name).exists():
            (here / name).parent.mkdir(exist_ok=True)
            (here / name).symlink_to(src)
    (here / "sentences.txt").write_text(
        "The cat sat on the mat .\nELMo gives every token a vector .\n", encoding="utf-8"
    )
    monkeypatch.chdir(here)
    monkeypatch.setenv("ELMO_FAST_CACHE", str(cache))
    monkeypatch.setenv("ELMO_FAST_BASE_URL", "http://127.0.0.1:9")  # discard: nothing listens there
    checked = [
        (m["name"], m["shape"], statement) for statement in code.splitlines() if (m := _SHAPE_COMMENT.match(statement))
    ]
    for library in sorted(set(re.findall(r"^\s*(?:from|import) (\w+)", code, re.M)) & set(_INSTALL)):
        import importlib.util

        if importlib.util.find_spec(library) is None:  # an extra's library: skip, naming the extra
            pytest.skip(f"{line} needs {library}, which is not installed ({_INSTALL[library]})")
    if "elmo_fast.as_allennlp" in code or _IMPORTS_RAY.search(code):
        shapes = _run_in_a_child(line, code, [name for name, _, _ in checked], here, request)
    else:
        namespace: dict = {"__name__": "__readme__"}
        exec(compile(code, line, "exec"), namespace)  # noqa: S102  (the page's own code)
        shapes = {name: list(namespace[name].shape) for name, _, _ in checked}
    D = 2 * json.loads(options.read_text())["lstm"]["projection_dim"]
    for name, shape, statement in checked:
        want = tuple(D if d.strip() == "D" else int(d) for d in shape.split(","))
        got = tuple(shapes[name])
        assert got == want, f"{line}: {statement.strip()!r}: {name} has shape {got}"


def _run_in_a_child(line: str, code: str, names: list[str], cwd: Path, request) -> dict:
    """Run a block in a fresh interpreter (in ``cwd``, this test's environment); the shapes of ``names``."""
    import importlib.util
    import json
    import sys

    from shim_runs import child_env, require_no_real_allennlp

    if "elmo_fast.as_allennlp" in code:
        require_no_real_allennlp()
    for library in sorted(set(re.findall(r"^\s*(?:from|import) (\w+)", code, re.M)) - {"elmo_fast"}):
        if importlib.util.find_spec(library) is None:
            how = _INSTALL.get(library, "bash tests/install_peers.sh")
            pytest.skip(f"{line} needs {library}, which is not installed ({how})")
    prelude, env = "", {"RAY_USAGE_STATS_ENABLED": "0"}
    if _IMPORTS_RAY.search(code):  # the run's one local Ray, joined
        from ray_local import JOIN_CODE, address

        prelude, env["RAY_ADDRESS"] = JOIN_CODE, address(request.getfixturevalue("ray_cluster"))
    report = f"\nimport json as _json\nprint(_json.dumps({{n: list(globals()[n].shape) for n in {names!r}}}))\n"
    proc = cli_process.run(
        [sys.executable, "-c", prelude + code + report],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=child_env(**env),
        timeout=600,
    )
    assert proc.returncode == 0, f"{line} failed in a child process:\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _commands(script: str) -> list[list[str]]:
    """The `elmo-fast ...` commands of a shell script (and `torchrun ... -m elmo_fast ...`), as argument
    lists: quotes, comments, line continuations, `&&`/`||`/`;`/`|` between commands and
    redirections handled as a shell does."""
    out = []
    for line in script.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        command: list[str] = []
        redirected = False  # past a redirection, words are file names, not arguments
        for token in [*lexer, ";"]:
            if token in ("&&", "||", ";", "|", "&"):
                if command[:1] == ["elmo-fast"]:
                    out.append(command[1:])
                elif command[:1] == ["torchrun"] and "elmo_fast" in command:  # torchrun [...] -m elmo_fast ARGS
                    at = command.index("elmo_fast")
                    if command[at - 1] == "-m":
                        out.append(command[at + 1 :])
                command, redirected = [], False
            elif token and set(token) <= set("<>&"):
                redirected = True
            elif not redirected:
                command.append(token)
    return out


@pytest.mark.parametrize("line,script", BASH, ids=[line for line, _ in BASH])
def test_shell_commands_parse(line, script):
    from elmo_fast.cli import build_parser

    for args in _commands(script):
        try:
            build_parser().parse_args(args)
        except SystemExit as e:  # --version and --help exit 0 once they have printed: accepted
            if e.code not in (0, None):
                pytest.fail(f"{line}: `elmo-fast {shlex.join(args)}` is refused by the parser (exit {e.code})")


def test_every_elmo_fast_command_is_checked():
    commands = [c for _, script in BASH for c in _commands(script)]
    assert {c[0] for c in commands} >= {"embed", "demo", "train", "vocab"}
    assert _commands(
        "x && elmo-fast embed 'a b.txt' o.h5 --all \\\n  --quiet  # a comment; elmo-fast no\n"
        "elmo-fast models > list.txt | cat"
    ) == [["embed", "a b.txt", "o.h5", "--all", "--quiet"], ["models"]]
    assert _commands("torchrun --standalone --nproc-per-node 2 -m elmo_fast embed a o.h5 --top") == [
        ["embed", "a", "o.h5", "--top"]
    ]
    with pytest.raises(SystemExit):  # the check can fail: a flag the parser does not know
        from elmo_fast.cli import build_parser

        build_parser().parse_args(["embed", "in.txt", "out.h5", "--all", "--no-such-flag"])


def test_the_readme_has_a_quickstart_for_each_kind_of_user():
    assert [title for title, _ in QUICKSTARTS] == ["Python", "Shell", "Proteins", "Server", "Ray"]
    assert all(blocks for _, blocks in QUICKSTARTS)


def _quickstart_needs(title: str, blocks: list[tuple[str, str, str]]) -> str | None:
    """Why this machine cannot run the quickstart as a user would (None: it can)."""
    import importlib.util
    import shutil
    import socket

    code = "\n".join(text for _, _, text in blocks)
    for library in sorted(set(re.findall(r"^\s*(?:from|import) (\w+)", code, re.M)) - {"elmo_fast"}):
        if importlib.util.find_spec(library) is None:
            return f"{library} is not installed ({_INSTALL.get(library, 'pip install ' + library)})"
    if "elmo-fast serve" in code:
        if importlib.util.find_spec("uvicorn") is None:
            return 'the [serve] extra is not installed (pip install "elmo-fast[serve]")'
        if shutil.which("curl") is None:
            return "curl is not installed"
        port = int(re.search(r"--port (\d+)", code).group(1))
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return f"port {port} is taken on this machine"
    return None


@pytest.mark.parametrize("title,blocks", QUICKSTARTS, ids=[title for title, _ in QUICKSTARTS])
@pytest.mark.slow
def test_quickstart_runs_as_printed_in_an_empty_folder(title, blocks, tmp_path):
    import json
    import os
    import sys

    from shim_runs import child_env

    why = _quickstart_needs(title, blocks)
    if why:
        pytest.skip(f"the {title} quickstart: {why}")
    folder = tmp_path / "empty"
    folder.mkdir()
    bin_dir = str(Path(sys.executable).parent)  # the install's `elmo-fast` and `python`, as an activated venv has
    env = child_env(
        PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""),
        ELMO_FAST_CACHE=str(tmp_path / "cache"),  # a first run's empty cache
        ELMO_FAST_BASE_URL="http://127.0.0.1:9",  # discard: nothing listens, nothing downloads
        RAY_USAGE_STATS_ENABLED="0",
    )
    for language, where, code in blocks:
        # the block as printed; then, for the assignments whose comment states a shape, a line reporting them
        checked = [(m["name"], m["shape"], line) for line in code.splitlines() if (m := _SHAPE_COMMENT.match(line))]
        report = f"\nimport json as _j\nprint(_j.dumps({{n: list(globals()[n].shape) for n in {[n for n, _, _ in checked]!r}}}))\n"
        command = ["bash", "-e", "-c", code] if language == "bash" else [sys.executable, "-c", code + report]
        proc = cli_process.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"{where} ({title}) failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
        if language == "python":
            shapes = json.loads(proc.stdout.strip().splitlines()[-1])
            for name, shape, line in checked:
                want = [int(d) for d in shape.split(",")]
                assert shapes[name] == want, f"{where}: {line.strip()!r}: {name} has shape {shapes[name]}"
        for statement in code.splitlines():  # a printed shape the comment states
            m = re.search(r"print\((.*)\)\s*#\s*(\(.*?\))", statement)
            if m and "\n" not in m.group(2):
                assert m.group(2).split(":")[0].strip() in proc.stdout, f"{where}: {statement.strip()!r}"
