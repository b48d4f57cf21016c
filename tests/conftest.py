import atexit
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

# The tests sit in room folders (tests/<room>/test_*.py, rooted like elmo_fast/'s rooms); what they share
# (case builders, tolerances, peers, fault injection, the CUDA targets) lives in tests/support/, imported
# by module name (`from tolerances import TOL`): on sys.path for every test and its subprocesses' -c code.
# tests/ itself holds the package of the CUDA kernels' CPU emulator (`from cuda_emulation.build import ...`).
# So a room folder must not take the name of a library the tests import: tests/ray/ would be a namespace
# package `ray` where Ray is not installed (the Ray tests are in tests/cluster/; tests/docs/test_architecture.py).
TESTS = Path(__file__).resolve().parent
SUPPORT = TESTS / "support"
for _path in (TESTS, SUPPORT):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

# The suite runs what a user runs: no setting a user does not have (tests/docs/test_suite_defaults.py fails
# otherwise). A test that needs a fixed kernel choice or a strict self-check asks for it itself (the
# calibration_off and selfcheck_mode fixtures, or a subprocess's environment). Only where files are kept is the
# suite's own, as it is each user's: a cache folder of this session (the CPU calibration measures and stores
# there once, as on a fresh machine, and every test and subprocess after it reads it), removed at the end.
_CACHE = tempfile.mkdtemp(prefix="elmo-fast-test-cache-")
os.environ["ELMO_FAST_CACHE"] = _CACHE
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)

# Fixtures the rooms share, defined beside their helpers (imported after the cache is set: they import
# elmo_fast): the CUDA kernels' targets ("cuda", "emulated"), the ops run on a target's kernels, allocations
# poisoned with NaN, the mini biLM of the gradchecks, exported ONNX graphs, the self-check's mode and the
# calibration off for a test.
from bilm_cases import mini  # noqa: E402,F401
from cuda_targets import cuda_target, emulated_target, ops_on, target  # noqa: E402,F401
from grad_checks import poisoned_allocations  # noqa: E402,F401
from kernel_settings import calibration_off, selfcheck_mode  # noqa: E402,F401
from onnx_graphs import onnx_graphs  # noqa: E402,F401


def pytest_configure(config):
    # tests that take minutes on a 2-CPU machine (the 'original' preset through an export): they run by
    # default; `-m "not slow"` leaves them out of a quick run
    config.addinivalue_line("markers", "slow: minutes on a small machine; deselect with -m 'not slow'")


# The run's one local Ray (tests/cluster, docs/ray.md's examples), and the markers that fixtures and parameters
# imply (cuda, emulator, cluster: tests/support/markers.py; pyproject.toml registers every marker).
from markers import pytest_collection_modifyitems  # noqa: E402,F401
from ray_local import ray_cluster, ray_workdir  # noqa: E402,F401

#: The real tiny biLM trained by bilm-tf, with its outputs (read from ../shared, never copied here;
#: ELMO_FAST_FIXTURE_DIR points elsewhere, e.g. on a GPU machine that gets only the repository).
FIXTURE_DIR = Path(
    os.environ.get("ELMO_FAST_FIXTURE_DIR")
    or Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "bilm_tf_tiny"
)


@pytest.fixture(scope="session")
def bilm_tf_tiny() -> Path:
    if not (FIXTURE_DIR / "lm_weights.hdf5").exists():
        pytest.skip(
            f"the bilm-tf golden fixture is not at {FIXTURE_DIR} (it is kept outside the repository: "
            "set ELMO_FAST_FIXTURE_DIR to its folder; docs/layout.md, Tests)"
        )
    return FIXTURE_DIR


@pytest.fixture(scope="session")
def tiny_files(bilm_tf_tiny):
    """(options, weights) of the bilm-tf tiny model."""
    return bilm_tf_tiny / "options.json", bilm_tf_tiny / "lm_weights.hdf5"


@pytest.fixture(scope="session")
def fixture_sentences(bilm_tf_tiny) -> list[list[str]]:
    """3 lists of 10 sentences (strings)."""
    return json.loads((bilm_tf_tiny / "sentences.json").read_text())


@pytest.fixture(scope="session")
def random_models(tmp_path_factory):
    """Random-weight models by (preset, exercise_clips), written once per session."""
    from elmo_fast.formats.random_models import random_model

    cache: dict = {}

    def get(preset: str, exercise_clips: bool = False, seed: int = 0):
        key = (preset, exercise_clips, seed)
        if key not in cache:
            cache[key] = random_model(
                preset,
                tmp_path_factory.mktemp(f"{preset}_{int(exercise_clips)}_{seed}"),
                seed=seed,
                exercise_clips=exercise_clips,
            )
        return cache[key]

    return get
