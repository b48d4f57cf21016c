"""elmo-fast's allennlp import path (elmo_fast.as_allennlp, ELMO_FAST_AS_ALLENNLP=1): opt-in, never over a
real allennlp, ELMo's path only, the official models' URLs made local; the classes behind it against
allennlp 0.9 itself (tests/support/allennlp09_peer.py) and allennlp 2.10.1's helpers."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import sys
import warnings

import cli_process
import numpy as np
import pytest
import torch
from peers import PEERS, allennlp_elmo
from repo_paths import REPO, SUPPORT
from shim_runs import child_env, last_json, require_no_real_allennlp, run_python

from elmo_fast.compat.allennlp09 import PACKAGES, PROVIDED
from elmo_fast.compat.allennlp09.commands_elmo import ElmoEmbedder
from elmo_fast.compat.allennlp09.elmo_indexer import ELMoCharacterMapper, ELMoTokenCharactersIndexer
from elmo_fast.compat.allennlp09.file_utils import cached_path, url_to_filename
from elmo_fast.compat.allennlp09.modules_elmo import Elmo, _ElmoBiLm, _ElmoCharacterEncoder, batch_to_ids
from elmo_fast.compat.allennlp09.nn_util import add_sentence_boundary_token_ids, remove_sentence_boundaries
from elmo_fast.errors import DownloadError, ElmoFastError
from elmo_fast.pretrained import official

PEER_SCRIPT = SUPPORT / "allennlp09_peer.py"
TOL = 1e-5


@pytest.fixture(scope="module")
def no_real_allennlp():
    require_no_real_allennlp()


# ---- opt-in, and never over a real allennlp ---------------------------------------------------------


@pytest.mark.slow
def test_nothing_named_allennlp_without_activation(no_real_allennlp):
    out = last_json(
        run_python("""
        import json, sys, importlib.util
        import elmo_fast
        from elmo_fast import ElmoEmbedder  # the whole API, loaded
        import elmo_fast.compat, elmo_fast.compat.allennlp09.finder
        try:
            import allennlp
            found = True
        except ImportError:
            found = False
        print(json.dumps([found, any(m == 'allennlp' or m.startswith('allennlp.') for m in sys.modules),
                          importlib.util.find_spec('allennlp') is not None]))
    """)
    )
    assert out == [False, False, False]


@pytest.mark.parametrize("value", ["", "0"])
def test_the_variable_set_to_nothing_or_0_activates_nothing(no_real_allennlp, value):
    proc = run_python("import sys; import allennlp", env=child_env(ELMO_FAST_AS_ALLENNLP=value), check=False)
    assert proc.returncode == 1 and "No module named 'allennlp'" in proc.stderr


@pytest.mark.slow
def test_activation_is_light_and_serves_elmos_path(no_real_allennlp):
    """Both ways (the import line, and the variable through the .pth hook) set it up without importing torch;
    every provided module imports and holds its names; the rest of allennlp is an ImportError saying why."""
    code = """
        import json, sys
        {activate}
        light = 'torch' not in sys.modules
        import importlib
        from elmo_fast.compat.allennlp09 import PROVIDED
        names = {{m: sorted(n for n in names if not hasattr(importlib.import_module(m), n)) for m, names in PROVIDED.items()}}
        missing = {{m: n for m, n in names.items() if n}}
        import allennlp, importlib.util
        errors = []
        for bad in ('allennlp.models', 'allennlp.training.trainer', 'allennlp.commands.train'):
            try:
                importlib.import_module(bad)
                errors.append(None)
            except ModuleNotFoundError as e:
                errors.append([e.name, str(e)])
        specs = [importlib.util.find_spec(m) is None for m in ('allennlp.models', 'allennlp.commands.train')]
        try:
            from allennlp.common import Params
            attr = None
        except ImportError as e:
            attr = str(e)
        try:
            allennlp.common.checks.check_for_gpu
            attr2 = None
        except AttributeError as e:
            attr2 = str(e)
        print(json.dumps([light, missing, allennlp.__version__, allennlp.ELMO_FAST_STAND_IN, errors, attr, attr2,
                          specs]))
    """
    for activate, env in (("import elmo_fast.as_allennlp", child_env()), ("", child_env(ELMO_FAST_AS_ALLENNLP="1"))):
        light, missing, version, stand_in, errors, attr, attr2, specs = last_json(
            run_python(code.format(activate=activate), env=env)
        )
        assert light and not missing and version == "0.9.0+elmo_fast" and stand_in
        # a module not provided is not there: find_spec answers None, importing it is the usual error
        assert specs == [True, True]
        for (name, message), wanted in zip(errors, ("allennlp.models", "allennlp.training", "allennlp.commands.train")):
            assert name == wanted and message == f"No module named {wanted!r}"
        assert "cannot import name 'Params'" in attr
        assert "check_for_gpu is not provided" in attr2


@pytest.mark.peers
@pytest.mark.slow
def test_a_real_allennlp_is_never_shadowed(no_real_allennlp):
    """With allennlp 2.10.1 importable, activating says so in one line and changes nothing; the same when it
    was imported first."""
    site = PEERS / "site"
    if not (site / "allennlp").is_dir():
        pytest.skip("allennlp 2.10.1 is not in .peers/site: bash tests/install_peers.sh")
    code = """
        import json, sys, warnings
        sys.path.insert(0, {tests!r})
        import peers
        sys.meta_path.append(peers._finder)  # stand-ins for allennlp 2.10's imports off ELMo's path (spaCy, ...)
        {first}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            import elmo_fast.as_allennlp as shim
        import allennlp, allennlp.version
        print(json.dumps([shim.is_active(), getattr(allennlp, 'ELMO_FAST_STAND_IN', False),
                          allennlp.version.VERSION, [str(w.message) for w in caught]]))
    """
    for first in ("", "import allennlp"):
        proc = run_python(code.format(first=first, tests=str(SUPPORT)), env=child_env(PYTHONPATH=str(site)))
        active, stand_in, version, caught = last_json(proc)
        assert not active and not stand_in and version == "2.10.1"
        assert len(caught) == 1 and "a real allennlp is installed" in caught[0] and "\n" not in caught[0]
    # through the variable: one line on stderr at start, and allennlp is the real one
    proc = run_python(
        """
        import importlib.util, sys
        from elmo_fast.compat.allennlp09.finder import is_active
        print(is_active(), importlib.util.find_spec('allennlp').origin)
    """,
        env=child_env(PYTHONPATH=str(site), ELMO_FAST_AS_ALLENNLP="1"),
    )
    active, origin = proc.stdout.split()
    assert active == "False" and origin.startswith(str(site))
    assert len([line for line in proc.stderr.splitlines() if "RealAllennlpWarning" in line]) == 1


def _real_allennlp_site():
    site = PEERS / "site"
    if not (site / "allennlp").is_dir():
        pytest.skip("allennlp 2.10.1 is not in .peers/site: bash tests/install_peers.sh")
    return site


@pytest.mark.slow
def test_a_real_allennlp_that_becomes_importable_later_wins(no_real_allennlp):
    """Active with no allennlp around; then a real one becomes importable (a folder put on sys.path, as a
    notebook's install does): `import allennlp` imports it, with one line saying so, every time the finder
    is asked (not only at activation)."""
    site = _real_allennlp_site()
    code = """
        import json, sys, warnings
        sys.path.insert(0, {tests!r})
        import peers
        sys.meta_path.append(peers._finder)  # stand-ins for allennlp 2.10's imports off ELMo's path (spaCy, ...)
        import importlib.util
        import elmo_fast.as_allennlp as shim
        active = shim.is_active()
        sys.path.insert(0, {site!r})
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            spec = importlib.util.find_spec('allennlp')
            import allennlp, allennlp.version
        print(json.dumps([active, shim.is_active(), spec.origin, getattr(allennlp, 'ELMO_FAST_STAND_IN', False),
                          allennlp.version.VERSION, [str(w.message) for w in caught]]))
    """
    was, still, origin, stand_in, version, caught = last_json(
        run_python(code.format(tests=str(SUPPORT), site=str(site)))
    )
    assert was and still  # the finder stays: it defers to the real one
    assert origin.startswith(str(site)) and not stand_in and version == "2.10.1"
    assert len(caught) == 1 and "a real allennlp is importable now" in caught[0] and "it is imported" in caught[0]


@pytest.mark.slow
def test_stand_in_modules_imported_first_stay_until_deactivated(no_real_allennlp):
    """The stand-in's modules imported, then a real allennlp becomes importable: the imported modules stay
    the stand-in's for the process (Python keeps imported modules; a real allennlp.commands under the
    stand-in's package would be worse), one line says so and how to switch; after deactivate(), `import
    allennlp` is the real one."""
    site = _real_allennlp_site()
    code = """
        import json, sys, warnings
        sys.path.insert(0, {tests!r})
        import peers
        sys.meta_path.append(peers._finder)
        import elmo_fast.as_allennlp as shim
        import allennlp
        sys.path.insert(0, {site!r})
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            import allennlp.commands.elmo
        before = [allennlp.ELMO_FAST_STAND_IN, allennlp.commands.elmo.ELMO_FAST_STAND_IN]
        shim.deactivate()
        import allennlp, allennlp.version
        print(json.dumps([before, getattr(allennlp, 'ELMO_FAST_STAND_IN', False), allennlp.version.VERSION,
                          [str(w.message) for w in caught]]))
    """
    before, stand_in, version, caught = last_json(run_python(code.format(tests=str(SUPPORT), site=str(site))))
    assert before == [True, True] and not stand_in and version == "2.10.1"
    assert len(caught) == 1 and "stand-in was imported first in this process: its modules stay" in caught[0]
    assert "deactivate()" in caught[0]


@pytest.mark.slow
def test_only_asking_activates_it(no_real_allennlp, tmp_path):
    """hasattr / getattr / dir on elmo_fast, pkgutil.walk_packages and pydoc walking the package, and
    pytest --doctest-modules importing its every module, leave allennlp unserved; `import
    elmo_fast.as_allennlp` serves it (after a tool imported the module: activate())."""
    out = last_json(
        run_python(
            """
        import io, json, pkgutil, pydoc, sys, importlib.util
        import elmo_fast
        from elmo_fast.compat.allennlp09.finder import is_active
        steps = []
        steps.append(['hasattr', hasattr(elmo_fast, 'as_allennlp'), is_active()])
        steps.append(['dir', 'as_allennlp' in dir(elmo_fast), is_active()])
        walked = [m.name for m in pkgutil.walk_packages(elmo_fast.__path__, 'elmo_fast.', onerror=lambda n: None)]
        steps.append(['walk_packages', 'elmo_fast.as_allennlp' in walked, is_active()])
        pydoc.render_doc('elmo_fast.as_allennlp')  # imports the module, to read it
        steps.append(['pydoc', 'elmo_fast.as_allennlp' in sys.modules, is_active()])
        print(json.dumps([steps, importlib.util.find_spec('allennlp') is None]))
    """
        )
    )
    steps, no_allennlp = out
    assert (
        steps
        == [
            ["hasattr", False, False],
            ["dir", False, False],
            ["walk_packages", True, False],
            ["pydoc", True, False],
        ]
        and no_allennlp
    )
    proc = run_python(
        "import elmo_fast.as_allennlp as shim, allennlp; print(shim.is_active(), allennlp.ELMO_FAST_STAND_IN)"
    )
    assert proc.stdout.split() == ["True", "True"]
    # pytest --doctest-modules on the package's module: imported, not active
    (tmp_path / "probe.py").write_text(
        "import json, os, sys\n"
        "def pytest_sessionfinish(session):\n"
        "    from elmo_fast.compat.allennlp09.finder import is_active\n"
        "    with open(os.environ['PROBE_OUT'], 'w') as f:\n"
        "        json.dump(['elmo_fast.as_allennlp' in sys.modules, is_active()], f)\n"
    )
    env = child_env(PYTHONPATH=str(tmp_path), PROBE_OUT=str(tmp_path / "probe.json"))
    module = REPO / "elmo_fast" / "as_allennlp.py"
    proc = cli_process.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "probe",
            "-p",
            "no:cacheprovider",
            "--doctest-modules",
            "-c",
            os.devnull,
            "--rootdir",
            str(tmp_path),
            str(module),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode in (0, 5), proc.stdout + proc.stderr  # 5: no doctests in it
    assert json.loads((tmp_path / "probe.json").read_text()) == [True, False]


def test_the_pth_hook_is_installed():
    import site
    import sysconfig

    folders = {sysconfig.get_paths()["purelib"], *site.getsitepackages()}
    hooks = [
        os.path.join(f, "elmo_fast_as_allennlp.pth")
        for f in folders
        if os.path.isfile(os.path.join(f, "elmo_fast_as_allennlp.pth"))
    ]
    assert hooks, f"elmo_fast_as_allennlp.pth is not in {sorted(folders)}: reinstall elmo-fast"
    line = open(hooks[0]).read()
    assert line.startswith("import ") and line.count("\n") == 1 and "ELMO_FAST_AS_ALLENNLP" in line


def test_provided_table_is_consistent():
    for module, names in PROVIDED.items():
        parent = module.rsplit(".", 1)[0]
        assert "." not in module or parent in PROVIDED, f"{module}'s package {parent} is not provided"
        for target in names.values():
            mod, _, attr = target.partition(":")
            assert mod.startswith("elmo_fast") and attr
    assert {"allennlp", "allennlp.commands", "allennlp.modules", "allennlp.data.token_indexers"} <= PACKAGES


# ---- model files: paths, URLs of the official models, allennlp's cache ------------------------------


def test_cached_path_of_local_files_and_errors(tmp_path):
    f = tmp_path / "options.json"
    f.write_text("{}")
    assert cached_path(f) == str(f) and cached_path(str(f)) == str(f)
    with pytest.raises(FileNotFoundError, match="not found"):
        cached_path(tmp_path / "missing.json")
    with pytest.raises(DownloadError, match="s3://"):
        cached_path("s3://bucket/x.hdf5")


def _official_url(name: str, role: str, old: bool = True) -> str:
    base = (
        "https://s3-us-west-2.amazonaws.com/allennlp/models/elmo/"
        if old
        else "https://allennlp.s3.amazonaws.com/models/elmo/"
    )
    return base + official.MODELS[name][0 if role == "options" else 1]


def test_official_urls_come_from_the_cache(tmp_path, monkeypatch, random_models):
    options, weights = random_models("tiny")
    monkeypatch.setenv("ELMO_FAST_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("ELMO_FAST_BASE_URL", "http://127.0.0.1:9")  # never the network
    target_o, target_w = official.cached_files("original")
    target_o.parent.mkdir(parents=True)
    target_o.write_bytes(open(options, "rb").read())
    target_w.write_bytes(open(weights, "rb").read())
    assert cached_path(_official_url("original", "options")) == str(target_o)
    assert cached_path(_official_url("original", "weights", old=False)) == str(target_w)
    # allennlp's DEFAULT_*_FILE are 'original's: the 0.9 embedder with no arguments loads it from the cache
    ee = ElmoEmbedder()
    assert ee.options_file == str(target_o) and ee.embed_sentence(["a"]).shape == (3, 1, ee.output_dim)


def test_offline_the_error_names_the_file_and_where_to_put_it(tmp_path, monkeypatch):
    monkeypatch.setenv("ELMO_FAST_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("ELMO_FAST_BASE_URL", "http://127.0.0.1:9")  # refused at once: "offline"
    monkeypatch.setenv("ALLENNLP_CACHE_ROOT", str(tmp_path / "allennlp"))
    url = _official_url("small", "weights")
    with pytest.raises(DownloadError) as e:
        ElmoEmbedder(_official_url("small", "options"), url)
    message = str(e.value)
    o, w = official.cached_files("small")
    assert "\n" not in message and str(o) in message and str(w) in message and "'small'" in message
    with pytest.raises(DownloadError) as e:
        cached_path("http://127.0.0.1:9/my/own/weights.hdf5")
    assert "offline, put the file at" in str(e.value) and str(tmp_path / "cache") in str(e.value)


def test_files_allennlp_downloaded_are_used(tmp_path, monkeypatch, random_models):
    """A model allennlp 0.9 downloaded before (~/.allennlp/cache/sha256(url).sha256(etag)) is used offline."""
    options, weights = random_models("tiny")
    monkeypatch.setenv("ELMO_FAST_CACHE", str(tmp_path / "empty"))
    monkeypatch.setenv("ELMO_FAST_BASE_URL", "http://127.0.0.1:9")
    cache = tmp_path / "allennlp_cache"
    cache.mkdir()
    urls = {"options": _official_url("pubmed", "options"), "weights": _official_url("pubmed", "weights")}
    for role, source in (("options", options), ("weights", weights)):
        name = url_to_filename(urls[role], '"etag-1"')
        assert name == hashlib.sha256(urls[role].encode()).hexdigest() + "." + hashlib.sha256(b'"etag-1"').hexdigest()
        (cache / name).write_bytes(open(source, "rb").read())
        (cache / (name + ".json")).write_text(json.dumps({"url": urls[role], "etag": '"etag-1"'}))
    assert cached_path(urls["options"], cache_dir=cache) == str(cache / url_to_filename(urls["options"], '"etag-1"'))
    monkeypatch.setattr("elmo_fast.compat.allennlp09.file_utils.CACHE_DIRECTORY", str(cache))
    ee = ElmoEmbedder(urls["options"], urls["weights"])
    assert ee.embed_sentence(["x", "y"]).shape[1] == 2


def test_environment_sets_precision_and_backend(monkeypatch, random_models):
    options, weights = random_models("tiny")
    monkeypatch.setenv("ELMO_FAST_PRECISION", "bf16")
    assert ElmoEmbedder(options, weights).elmo_bilm.precision.name == "bf16"
    monkeypatch.setenv("ELMO_FAST_PRECISION", "fp64")
    with pytest.raises(ElmoFastError, match="ELMO_FAST_PRECISION='fp64'"):
        ElmoEmbedder(options, weights)
    monkeypatch.delenv("ELMO_FAST_PRECISION")
    monkeypatch.setenv("ELMO_FAST_BACKEND", "reference")
    assert _ElmoBiLm(options, weights).backend == "reference"


# ---- allennlp 0.9's numbers: the same call sequence through allennlp 0.9 and the stand-in ------------


def _words(rng: np.random.Generator, n: int) -> list[str]:
    letters = list("abcdefghijklmnopqrstuvwxyzäöü.,'")
    return ["".join(rng.choice(letters, size=rng.integers(1, 9))) for _ in range(n)]


def _sequence(seed: int) -> list:
    """Steps as flair, seqvec and bio_embeddings drive the embedder: a dummy sentence first, batches that
    grow and shrink (rows whose states carry or start), an empty sentence alone and inside a batch,
    length 1, lazily grouped sentences, then an Elmo of its own."""
    rng = np.random.default_rng(seed)
    sentence = lambda n: _words(rng, n)  # noqa: E731
    return [
        ["embed_sentence", ["hello"]],
        ["embed_batch", [sentence(5), sentence(1), sentence(12)]],
        ["embed_batch", [sentence(7)]],
        ["embed_batch", [sentence(3), [], sentence(9), sentence(2), sentence(6)]],
        ["embed_sentence", []],
        ["embed_batch", [sentence(4), sentence(4)]],
        ["embed_sentences", [sentence(int(n)) for n in rng.integers(1, 15, size=7)], 3],
        ["elmo", [sentence(3), sentence(8), sentence(1)], 2, None],
        ["elmo", [sentence(5), sentence(2)], 1, [0.5, -1.0, 2.0]],
    ]


def _run_peer(tmp_path, job: dict) -> dict:
    if not (PEERS / "allennlp-0.9" / "allennlp").is_dir():
        pytest.skip("allennlp 0.9 is not in .peers/allennlp-0.9: bash tests/install_peers.sh")
    (tmp_path / "job.json").write_text(json.dumps(job))
    proc = cli_process.run(
        [sys.executable, str(PEER_SCRIPT), str(tmp_path / "job.json"), str(tmp_path / "out.npz")],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(np.load(tmp_path / "out.npz"))


def _run_ours(embedder: ElmoEmbedder, steps: list, options, weights) -> dict:
    out = {}
    for i, (op, *args) in enumerate(steps):
        if op == "embed_sentence":
            arrays = [embedder.embed_sentence(args[0])]
        elif op == "embed_batch":
            arrays = embedder.embed_batch(args[0])
        elif op == "embed_sentences":
            arrays = list(embedder.embed_sentences(args[0], args[1]))
        elif op == "elmo":
            torch.manual_seed(0)
            elmo = Elmo(options, weights, args[1], dropout=0.0, scalar_mix_parameters=args[2])
            with torch.no_grad():
                result = elmo(batch_to_ids(args[0]))
            arrays = [r.numpy() for r in result["elmo_representations"]] + [result["mask"].numpy()]
        else:
            raise AssertionError(op)
        out.update({f"s{i}_{k}": a for k, a in enumerate(arrays)})
    return out


def _compare(ours: dict, theirs: dict) -> float:
    assert sorted(ours) == sorted(theirs)
    worst = 0.0
    for key, a in ours.items():
        b = theirs[key]
        if b.size == 0:  # an empty sentence: 0.9 gives float64 (3, 0, 1024) whatever the model
            assert a.size == 0 and a.shape[:2] == b.shape[:2] and a.dtype == np.float32, key
            continue
        assert a.shape == b.shape, key
        if key.endswith(("_2", "_1")) and a.dtype != np.float32:  # Elmo's mask: long, as 0.9's
            assert a.dtype == b.dtype == np.int64 and (a == b).all(), key
            continue
        worst = max(worst, float(np.abs(a - b).max()))
    return worst


@pytest.mark.parametrize("preset,clips", [("tiny", False), ("small", True)])
@pytest.mark.peers
@pytest.mark.slow
def test_stateful_sequence_gives_allennlp_09s_numbers(tmp_path, random_models, preset, clips):
    options, weights = random_models(preset, exercise_clips=clips)
    steps = _sequence(seed=hash(preset) % 1000)
    theirs = _run_peer(tmp_path, {"options": str(options), "weights": str(weights), "steps": steps})
    ours = _run_ours(ElmoEmbedder(options, weights), steps, options, weights)
    assert _compare(ours, theirs) <= TOL


@pytest.mark.peers
@pytest.mark.slow
def test_embed_file_gives_allennlp_09s_file(tmp_path, random_models):
    """0.9's embed_file: input order, batches of batch_size, the states flowing through: the same datasets."""
    import h5py

    options, weights = random_models("tiny")
    rng = np.random.default_rng(5)
    lines = [" ".join(_words(rng, int(n))) for n in rng.integers(1, 12, size=11)]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(lines) + "\n")
    steps = [["embed_sentence", ["hello"]], ["embed_file", str(corpus), "all", 3]]
    _run_peer(tmp_path, {"options": str(options), "weights": str(weights), "steps": steps})
    ee = ElmoEmbedder(options, weights)
    ee.embed_sentence(["hello"])
    ee.embed_file(open(corpus, encoding="utf-8"), str(tmp_path / "ours.h5"), "all", 3)
    with h5py.File(str(corpus) + ".h5", "r") as theirs, h5py.File(tmp_path / "ours.h5", "r") as ours:
        assert sorted(theirs) == sorted(ours)
        assert json.loads(theirs["sentence_to_index"][0]) == json.loads(ours["sentence_to_index"][0])
        for key in theirs:
            if key != "sentence_to_index":
                assert np.abs(theirs[key][...] - ours[key][...]).max() <= TOL


@pytest.mark.peers
@pytest.mark.slow
def test_an_embedder_allennlp_09_pickled_unpickles_and_carries_on(tmp_path, random_models, no_real_allennlp):
    """A pickle of allennlp 0.9's ElmoEmbedder (what a flair model saved before flair 0.12 holds) loads into
    elmo-fast's, its weights and carried states included: the calls after it give 0.9's numbers."""
    options, weights = random_models("small", exercise_clips=True)
    steps = _sequence(seed=11)[:7]
    theirs = _run_peer(
        tmp_path,
        {
            "options": str(options),
            "weights": str(weights),
            "steps": steps,
            "pickle_after": 2,
            "pickle_to": str(tmp_path / "ee.pkl"),
        },
    )
    (tmp_path / "rest.json").write_text(json.dumps(steps[3:]))
    ours = last_json(
        run_python(f"""
        import json, pickle
        import elmo_fast.as_allennlp
        with open({str(tmp_path / "ee.pkl")!r}, 'rb') as f:
            ee = pickle.load(f)
        out = {{}}
        for i, (op, *args) in enumerate(json.load(open({str(tmp_path / "rest.json")!r})), start=3):
            arrays = ([ee.embed_sentence(args[0])] if op == 'embed_sentence' else ee.embed_batch(args[0])
                      if op == 'embed_batch' else list(ee.embed_sentences(args[0], args[1])))
            out.update({{f's{{i}}_{{k}}': a.tolist() for k, a in enumerate(arrays)}})
        print(json.dumps([type(ee).__module__, type(ee.elmo_bilm).__name__, ee.cuda_device, out]))
    """)
    )
    module, bilm_class, cuda_device, arrays = ours
    assert module == "elmo_fast.compat.allennlp09.commands_elmo" and bilm_class == "_ElmoBiLm" and cuda_device == -1
    rest = {
        k: np.asarray(v, dtype=np.float32).reshape(theirs[k].shape if theirs[k].size else (-1,))
        for k, v in arrays.items()
    }
    assert (
        _compare({k: v for k, v in rest.items() if theirs[k].size}, {k: theirs[k] for k in rest if theirs[k].size})
        <= TOL
    )


def test_our_embedder_pickles_and_unpickles_with_its_states(random_models):
    options, weights = random_models("tiny")
    ee = ElmoEmbedder(options, weights)
    ee.embed_batch([["a", "b"], ["c"]])
    copy = pickle.loads(pickle.dumps(ee))
    batch = [["d", "e", "f"], ["g"]]
    # the states carried (without them the vectors differ by ~0.1); within the fp32 bar, not bitwise: where the
    # calibration chose BLAS for few rows, its rounding may differ in the last bits from one call to another (its
    # blocking follows the shapes and the memory it is handed), as tests/bilm/test_properties.py says
    for a, b in zip(ee.embed_batch(batch), copy.embed_batch(batch)):
        assert a.shape == b.shape and np.abs(a - b).max() <= TOL


def test_oom_reaches_the_caller_as_the_runtime_error_fallbacks_catch(random_models, monkeypatch):
    """seqvec and bio_embeddings catch RuntimeError around embed_batch to retry smaller, then on the CPU."""
    options, weights = random_models("tiny")
    ee = ElmoEmbedder(options, weights)

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(type(ee.elmo_bilm), "forward", out_of_memory)
    with pytest.raises(RuntimeError, match="out of memory"):
        ee.embed_batch([["a"] * 5])


# ---- the other classes of ELMo's path, against allennlp 2.10.1's (the same code as 0.9's) -------------


@pytest.mark.peers
def test_character_mapper_and_indexer_match_allennlp():
    allennlp_elmo()
    from allennlp.data.token_indexers import elmo_indexer as theirs

    words = ["hello", "<S>", "</S>", "ümlaut", "x" * 70, "", "@@PADDING@@", "\ud800bad"]
    mapper, their_mapper = ELMoCharacterMapper({"@@PADDING@@": 0}), theirs.ELMoCharacterMapper({"@@PADDING@@": 0})
    for word in words:
        assert mapper.convert_word_to_char_ids(word) == their_mapper.convert_word_to_char_ids(word), word
    assert (
        ELMoCharacterMapper.beginning_of_sentence_characters
        == theirs.ELMoCharacterMapper.beginning_of_sentence_characters
    )
    assert ELMoCharacterMapper.end_of_sentence_characters == theirs.ELMoCharacterMapper.end_of_sentence_characters
    indexer = ELMoTokenCharactersIndexer()
    ids = indexer.tokens_to_indices(["the", "cat"], None, "chars")
    assert ids == {"chars": [their_mapper.convert_word_to_char_ids(w) for w in ("the", "cat")]}
    padded = indexer.as_padded_tensor(ids, {"chars": 4}, {})["chars"]
    assert padded.shape == (4, 50) and padded[2:].eq(0).all() and padded[0].tolist() == ids["chars"][0]
    assert pickle.loads(pickle.dumps(indexer)) == indexer


@pytest.mark.peers
def test_sentence_boundaries_match_allennlp():
    allennlp_elmo()
    from allennlp.nn import util as theirs

    gen = torch.Generator().manual_seed(3)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    ids = torch.randint(1, 50, (3, 4), generator=gen) * mask
    vectors = torch.rand(3, 4, 5, generator=gen) * mask.unsqueeze(-1)
    for tensor, begin, end in (
        (ids, 98, 99),
        (vectors, torch.rand(5, generator=gen) + 0.1, torch.rand(5, generator=gen) + 0.1),
    ):
        out, new_mask = add_sentence_boundary_token_ids(tensor, mask.long(), begin, end)
        ref, ref_mask = theirs.add_sentence_boundary_token_ids(tensor, mask, begin, end)
        assert torch.equal(out, ref) and torch.equal(new_mask, ref_mask.long()) and new_mask.dtype == torch.long
        back, back_mask = remove_sentence_boundaries(out, new_mask)
        assert torch.equal(back, tensor) and torch.equal(back_mask, mask)


@pytest.mark.peers
def test_character_encoder_matches_allennlp(random_models):
    module = allennlp_elmo()
    options, weights = random_models("small", exercise_clips=True)
    ids = batch_to_ids([["a", "bb", "ccc"], ["d"], []])
    ours = _ElmoCharacterEncoder(options, weights)(ids)
    theirs = module._ElmoCharacterEncoder(str(options), str(weights))(ids)
    assert torch.equal(ours["mask"], theirs["mask"].long())
    assert (ours["token_embedding"] - theirs["token_embedding"]).abs().max() <= TOL
    assert (
        ours["mask"].dtype == torch.long
        and _ElmoCharacterEncoder(options, weights).get_output_dim() == theirs["token_embedding"].shape[-1]
    )


def test_unpickling_holders_refuse_to_be_built():
    from elmo_fast.compat.allennlp09.pickled import ElmoLstm

    with pytest.raises(ElmoFastError, match="to unpickle objects saved with allennlp 0.9 only"):
        ElmoLstm(16, 16, 32, 2)


def test_stateful_biLM_and_elmo_masks_are_long(random_models):
    options, weights = random_models("tiny")
    bilm = _ElmoBiLm(options, weights)
    assert bilm.stateful and bilm(batch_to_ids([["a"]]))["mask"].dtype == torch.long
    elmo = Elmo(options, weights, 1, dropout=0.0)
    assert elmo._elmo_lstm.stateful and elmo(batch_to_ids([["a", "b"]]))["mask"].dtype == torch.long
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Elmo(None, None, 1, module=bilm).get_output_dim() == bilm.get_output_dim()
