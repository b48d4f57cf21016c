#!/usr/bin/env bash
# Proves elmo-fast's install paths, each in fresh virtual environments and followed by a smoke test,
# and times them:
#
#   a) pip install .                          build isolation: what a user types first
#   b) python -m build --wheel, then the wheel installed into another fresh venv; there,
#      pip wheel . too, and that wheel installed over it
#   c) pip install --no-build-isolation -e .  the developers' path (README, .ci/run)
#   d) python -m build --sdist, then pip install of the sdist: what `pip install elmo-fast` does
#      with a source release from PyPI
#   n) pip install . in a fresh venv WITHOUT torch: the build fetches the newest torch (from PyPI on
#      Linux a CUDA build, several GB; where nvcc is on PATH without the CUDA headers next to it, the
#      CUDA toolkit check must fall back to the CPU extension). Not run by default: slow.
#
#   bash tools/check_install.sh            # a b c d
#   bash tools/check_install.sh a n        # some of them
#
# Every venv gets $TORCH_SPEC (default torch==2.13.0, the release the tests run on; set it to the torch
# you use, e.g. torch==2.11.0, with PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cu130 for a CUDA
# build) first, as the README says; the builds must then use that torch (no second torch in the build
# environment).
# The smoke test runs outside the source tree: `import elmo_fast; ops.require_extension()`, then
# `elmo-fast random-model tiny` and `elmo-fast embed --backend fast` of two sentences.
# Env: PYTHON (python3), TORCH_SPEC, CHECK_INSTALL_DIR (default: a new temp dir, removed at the end
# unless KEEP=1). Everything runs under nice. Builds of elmo-fast use --no-cache-dir: pip would keep
# (and, for an sdist at the same path, reuse) the wheels it built. Exit status: the number of failed paths.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
unset PYTHONPATH VIRTUAL_ENV CONDA_PREFIX PIP_NO_BUILD_ISOLATION
WORK="${CHECK_INSTALL_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/elmo-fast-check-install.XXXXXX")}"
mkdir -p "$WORK"
if [ "${KEEP:-0}" != 1 ] && [ -z "${CHECK_INSTALL_DIR:-}" ]; then
  trap 'rm -rf "$WORK"' EXIT
fi
paths=("$@")
[ "${#paths[@]}" -eq 0 ] && paths=(a b c d)

now() { date +%s.%N; }
since() { awk -v s="$1" -v e="$(now)" 'BEGIN { printf "%.1f", e - s }'; }
log() { echo "=== $*"; }
declare -A RESULT

# timed LABEL CMD...: runs CMD (output to $WORK/LABEL.log), prints its time; fails with its log tail.
timed() {
  local label="$1" start rc
  shift
  start=$(now)
  nice "$@" >"$WORK/$label.log" 2>&1
  rc=$?
  log "$label: $(since "$start")s (exit $rc): $*"
  if [ $rc -ne 0 ]; then
    tail -n 30 "$WORK/$label.log" | sed 's/^/    /'
  fi
  return $rc
}

# fresh_venv DIR: a new venv with $TORCH_SPEC (and EXTRA packages) installed.
fresh_venv() {
  local dir="$1"
  shift
  rm -rf "$dir"
  timed "$(basename "$dir")-venv" "$PYTHON" -m venv "$dir" &&
    timed "$(basename "$dir")-torch" "$dir/bin/pip" install -q "$TORCH_SPEC" "$@"
}

# build_report LOG: what the build said about torch and CUDA, and whether it installed a torch.
build_report() {
  grep -hE "^ *elmo-fast( build)?: " "$1" | sed 's/^ *//; s/^/    build said: /' | sort -u
  if grep -qE "Collecting torch|Processing .*torch-[0-9].*\.whl|Downloading torch-" "$1"; then
    echo "    NOTE: a torch was installed during this step (see $1)"
  fi
}

# smoke VENV EXPECTED_DIR: the smoke test, from a directory outside the source tree; EXPECTED_DIR is
# where elmo_fast must be imported from (site-packages, or the source tree for -e).
smoke() {
  local venv="$1" expect="$2" dir
  dir="$(mktemp -d "$WORK/smoke.XXXXXX")"
  (
    cd "$dir" || exit 1
    "$venv/bin/python" - "$expect" <<'EOF' || exit 1
import os, sys
import elmo_fast
from elmo_fast.bilm import ops
ops.require_extension()
where = os.path.dirname(os.path.realpath(elmo_fast.__file__))
expect = os.path.realpath(sys.argv[1])
assert where.startswith(expect), f"elmo_fast imported from {where}, expected under {expect}"
from elmo_fast import _extension_info
info = _extension_info.build_info()
print(f"    smoke: elmo_fast {elmo_fast.__version__} from {where}; _C loads (CUDA kernels: {ops.HAS_CUDA_KERNELS}); "
      f"built against torch {getattr(info, 'TORCH_VERSION', '?')}, running torch {__import__('torch').__version__}")
EOF
    out="$("$venv/bin/elmo-fast" random-model tiny "$dir/model" 2>&1)" || { echo "$out"; exit 1; }
    printf 'The cat sat on the mat .\nELMo gives every token a vector that depends on its sentence .\n' >"$dir/in.txt"
    "$venv/bin/elmo-fast" embed "$dir/in.txt" "$dir/out.hdf5" --all --backend fast --quiet \
      --options "$dir/model/options.json" --weights "$dir/model/weights.hdf5" || exit 1
    "$venv/bin/python" -c "
import h5py, sys
with h5py.File(sys.argv[1]) as f:
    shapes = [f[k].shape for k in ('0', '1')]
assert shapes[0][:2] == (3, 7) and shapes[1][:2] == (3, 12), shapes
print('    smoke: elmo-fast embed --backend fast: 2 sentences ->', shapes)" "$dir/out.hdf5" || exit 1
  )
}

site_packages() { "$1/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])"; }

# check_wheel WHEEL: its files: the extension, the build record, every module and data file
# (*.json, *.hdf5, *.txt) of elmo_fast/, nothing else at the top level.
check_wheel() {
  "$PYTHON" - "$1" "$ROOT" <<'EOF'
import os, sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
root = sys.argv[2]
top = sorted({n.split("/")[0] for n in names})
expected = {os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(os.path.join(root, "elmo_fast"))
            for f in fs if f.endswith((".py", ".json", ".hdf5", ".txt")) and "__pycache__" not in d}
missing = sorted(expected - set(names))
ext = [n for n in names if n.startswith("elmo_fast/_C.") and n.endswith(".so")]
print(f"    wheel: {os.path.basename(sys.argv[1])}, {len(names)} files, top level {top}, extension {ext}")
assert ext, "no elmo_fast/_C*.so in the wheel"
assert "elmo_fast/_build_info.py" in names, "no elmo_fast/_build_info.py in the wheel"
assert not missing, f"modules missing from the wheel: {missing}"
assert all(t == "elmo_fast" or t.endswith(".dist-info") for t in top), top
EOF
}

run_a() {
  local v="$WORK/venv-a"
  fresh_venv "$v" || return 1
  timed a-pip-install-dot "$v/bin/pip" install -v --no-cache-dir "$ROOT" || return 1
  build_report "$WORK/a-pip-install-dot.log"
  smoke "$v" "$(site_packages "$v")"
}

run_b() {
  local builder="$WORK/venv-b-builder" target="$WORK/venv-b-target" wheel
  fresh_venv "$builder" build || return 1
  rm -rf "$WORK/dist-b"
  # Activated, as a user would: python -m build's own throwaway venv then finds this torch.
  timed b-python-m-build-wheel env VIRTUAL_ENV="$builder" PATH="$builder/bin:$PATH" \
    "$builder/bin/python" -m build --wheel --outdir "$WORK/dist-b" "$ROOT" || return 1
  build_report "$WORK/b-python-m-build-wheel.log"
  wheel="$(ls "$WORK"/dist-b/*.whl)" && check_wheel "$wheel" || return 1
  fresh_venv "$target" || return 1
  timed b-install-wheel "$target/bin/pip" install "$wheel" || return 1
  smoke "$target" "$(site_packages "$target")" || return 1
  rm -rf "$WORK/dist-b-pip"
  timed b-pip-wheel "$target/bin/pip" wheel -v --no-cache-dir --no-deps -w "$WORK/dist-b-pip" "$ROOT" || return 1
  build_report "$WORK/b-pip-wheel.log"
  wheel="$(ls "$WORK"/dist-b-pip/*.whl)" && check_wheel "$wheel" || return 1
  timed b-install-pip-wheel "$target/bin/pip" install --force-reinstall --no-deps "$wheel" || return 1
  smoke "$target" "$(site_packages "$target")"
}

run_c() {
  local v="$WORK/venv-c"
  fresh_venv "$v" setuptools wheel ninja || return 1
  timed c-pip-install-editable "$v/bin/pip" install -v --no-build-isolation -e "$ROOT" || return 1
  build_report "$WORK/c-pip-install-editable.log"
  smoke "$v" "$ROOT/elmo_fast"
}

run_d() {
  local builder="$WORK/venv-d" sdist
  fresh_venv "$builder" build || return 1
  rm -rf "$WORK/dist-d"
  timed d-python-m-build-sdist "$builder/bin/python" -m build --sdist --outdir "$WORK/dist-d" "$ROOT" || return 1
  sdist="$(ls "$WORK"/dist-d/*.tar.gz)" || return 1
  echo "    sdist: $(basename "$sdist"), $(tar tzf "$sdist" | wc -l) files"
  timed d-pip-install-sdist "$builder/bin/pip" install -v --no-cache-dir "$sdist" || return 1
  build_report "$WORK/d-pip-install-sdist.log"
  smoke "$builder" "$(site_packages "$builder")"
}

run_n() {
  local v="$WORK/venv-n"
  rm -rf "$v"
  timed venv-n-venv "$PYTHON" -m venv "$v" || return 1
  timed n-pip-install-dot-without-torch "$v/bin/pip" install -v --no-cache-dir "$ROOT" || return 1
  build_report "$WORK/n-pip-install-dot-without-torch.log"
  smoke "$v" "$(site_packages "$v")"
}

log "$("$PYTHON" --version), $TORCH_SPEC, work dir $WORK, source $ROOT"
failed=0
for p in "${paths[@]}"; do
  case "$p" in a | b | c | d | n) ;; *) echo "unknown path '$p' (a, b, c, d or n)" >&2; exit 64 ;; esac
  start=$(now)
  log "path $p: start"
  if "run_$p"; then RESULT[$p]="passed"; else RESULT[$p]="FAILED"; failed=$((failed + 1)); fi
  RESULT[$p]="${RESULT[$p]} in $(since "$start")s"
  log "path $p: ${RESULT[$p]}"
done
log "summary:"
for p in "${paths[@]}"; do
  case "$p" in
    a) what="pip install . (isolation)" ;;
    b) what="python -m build --wheel + pip wheel ., installed in a fresh venv" ;;
    c) what="pip install --no-build-isolation -e ." ;;
    d) what="python -m build --sdist + pip install of the sdist" ;;
    n) what="pip install . without torch installed (the build fetches one)" ;;
  esac
  printf '    %s) %-66s %s (fresh venvs and torch installs included)\n' "$p" "$what" "${RESULT[$p]}"
done
exit "$failed"
