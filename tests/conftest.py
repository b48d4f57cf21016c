import json
import os
import sys
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

# The CPU kernels' calibration (elmo_fast.bilm.cpu_tuning) picks kernels by timing them: the suite runs
# the kernels' defaults, the same in every process and on every machine, and writes nothing under the
# user's cache. tests/bilm/test_calibration.py turns it on where it tests it; subprocesses inherit this.
os.environ.setdefault("ELMO_FAST_CALIBRATION", "off")

# The first-use self-check (elmo_fast.bilm.selfcheck) falls back to an op's reference twin when its kernel
# fails on a GPU: in the tests, that would let a wrong CUDA kernel pass every test through the twin. Strict
# here, so that it fails them instead, naming the op (set before any test module imports elmo_fast).
os.environ.setdefault("ELMO_FAST_SELFCHECK", "strict")

# Fixtures the rooms share, defined beside their helpers (imported after the settings above: they import
# elmo_fast): the CUDA kernels' targets ("cuda", "emulated"), the ops run on a target's kernels, allocations
# poisoned with NaN, the mini biLM of the gradchecks.
from bilm_cases import mini  # noqa: E402,F401
from cuda_targets import cuda_target, emulated_target, ops_on, target  # noqa: E402,F401
from grad_checks import poisoned_allocations  # noqa: E402,F401

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
        pytest.skip(f"bilm-tf fixture not found at {FIXTURE_DIR} (it lives in the workspace's shared/ folder)")
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
