#!/usr/bin/env bash
# The GPU check: ONE script for a machine with an NVIDIA GPU, run from the repository root.
#
#   bash benchmarks/gpu_check.sh                                   # every phase
#   GPU_CHECK_PHASES=sanitizer,bench bash benchmarks/gpu_check.sh  # some phases, on an earlier build
#
# Phases (each with a time budget; a failing phase does not stop the next ones, except that
# nothing after the build runs without a build):
#   device     nvidia-smi, nvcc, torch and the GPU it sees
#   build      ELMO_FAST_CUDA_ARCHS=9.0 pip install --no-build-isolation -e . (falls back to
#              setup.py build_ext --inplace), then checks that the CUDA kernels and the CUDA
#              training ops are in. Left out of GPU_CHECK_PHASES: only that check, on the
#              extension already built in this tree
#   tests      first `elmo-fast doctor` (the build, then every op against its reference twin on
#              the CPU and the GPU in fp32, bf16 and gradients, and the whole model: a table of
#              errors against bounds), then pytest: tests/test_cuda.py (forward kernels, the fast
#              model on cuda, the golden fixture, the CUDA OOM split, embed_file on CUDA vs CPU,
#              CUDA graphs, no host sync), tests/test_cuda_backward.py (the training ops),
#              tests/test_fast_model.py, tests/test_model_caches.py
#   sanitizer  compute-sanitizer memcheck, racecheck and synccheck on benchmarks/sanitizer_case.py
#   bench      benchmarks/bench_gpu.py (reference vs fast fp32 / tf32 / bf16 ops, the model with and
#              without CUDA graphs, a training step fast vs reference; original shapes)
# then a summary. Logs, bench.json, bench.md and summary.txt go to $OUT (or ./gpu_check_out).
# The run keeps within GPU_CHECK_BUDGET seconds (default 570, for a 600 s command limit): each
# phase gets at most what is left. All phases take longer than that on a fresh machine, so run
# the default phases first (device, build, tests) and then, on the same machine and tree (the build
# kept), GPU_CHECK_PHASES=sanitizer,bench. GPU_CHECK_DRY_RUN=1 prints each phase's command
# instead of running it (to check the script itself anywhere).
# The bilm-tf golden tests need the fixture: copy the workspace's shared/fixtures into
# ./shared/fixtures (or set ELMO_FAST_FIXTURE_DIR); without it they skip, saying so.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PY="${PYTHON:-python3}"
OUT_DIR="${OUT:-$PWD/gpu_check_out}"
mkdir -p "$OUT_DIR"
BUDGET="${GPU_CHECK_BUDGET:-570}"
DEADLINE=$((SECONDS + BUDGET))
PHASES_WANTED=",${GPU_CHECK_PHASES:-device,build,tests},"
DRY_RUN="${GPU_CHECK_DRY_RUN:-0}"
export PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
if [ -z "${ELMO_FAST_FIXTURE_DIR:-}" ] && [ -d shared/fixtures/bilm_tf_tiny ]; then
  export ELMO_FAST_FIXTURE_DIR="$PWD/shared/fixtures/bilm_tf_tiny"
fi

declare -a PHASES=()
declare -A STATUS=() TOOK=()

banner() { printf '\n==================== %s ====================\n' "$*"; }

wanted() { [[ "$PHASES_WANTED" == *",$1,"* ]]; }

# phase NAME BUDGET_S CMD...: runs CMD under a timeout of min(BUDGET_S, time left), logs to
# $OUT_DIR/NAME.log (and the terminal), records ok / FAILED (exit N) / TIMEOUT / skipped.
phase() {
  local name="$1" budget="$2"
  shift 2
  PHASES+=("$name")
  local left=$((DEADLINE - SECONDS - 15))
  if [ "$left" -lt 20 ]; then
    STATUS[$name]="skipped (out of time)"
    TOOK[$name]=0
    banner "$name: skipped, ${left}s left"
    return 0
  fi
  if [ "$budget" -gt "$left" ]; then
    budget=$left
  fi
  banner "$name (budget ${budget}s): $*"
  if [ "$DRY_RUN" = 1 ]; then
    STATUS[$name]="ok"
    TOOK[$name]=0
    echo "--- $name: dry run, not run"
    return 0
  fi
  local start=$SECONDS rc=0
  # bash -c: CMD may be one of the functions below (exported), which timeout cannot run itself.
  timeout --signal=TERM --kill-after=10 "$budget" bash -o pipefail -c '"$@"' _ "$@" 2>&1 |
    tee "$OUT_DIR/$name.log" || rc=$?
  TOOK[$name]=$((SECONDS - start))
  case "$rc" in
    0) STATUS[$name]="ok" ;;
    124 | 137) STATUS[$name]="TIMEOUT after ${budget}s" ;;
    *) STATUS[$name]="FAILED (exit $rc)" ;;
  esac
  echo "--- $name: ${STATUS[$name]} in ${TOOK[$name]}s"
  return 0
}

skip() {
  PHASES+=("$1")
  STATUS[$1]="skipped ($2)"
  TOOK[$1]=0
  banner "$1: skipped ($2)"
}

# The functions below run in the child bash of phase() (exported with export -f).
# shellcheck disable=SC2329  # invoked indirectly, by name, through phase()
device_info() {
  nvidia-smi || echo "nvidia-smi failed"
  nvcc --version | tail -n 2 || echo "no nvcc on PATH"
  compute-sanitizer --version | tail -n 1 || echo "no compute-sanitizer on PATH"
  "$PY" - <<'EOF'
import platform, torch
print(f"python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda})")
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"GPU: {p.name}, {p.multi_processor_count} SMs, {p.total_memory / 2**30:.1f} GiB, capability {p.major}.{p.minor}")
else:
    raise SystemExit("torch sees no CUDA GPU")
EOF
}

# shellcheck disable=SC2329
extension_check() {
  "$PY" - <<'EOF'
import os, sys
sys.path.insert(0, os.getcwd())
from elmo_fast.bilm import ops
ops.require_cuda_kernels()
print(f"elmo_fast._C loaded from {ops._C.__file__}: CUDA kernels in; CUDA training ops: {ops.HAS_CUDA_BACKWARD}")
if not ops.HAS_CUDA_BACKWARD:
    raise SystemExit("the CUDA training ops (ops.TRAINING_OPS) are missing from this build")
EOF
}

# shellcheck disable=SC2329
build() {
  local jobs
  jobs="$(nproc 2>/dev/null || echo 8)"
  export ELMO_FAST_CUDA_ARCHS="${ELMO_FAST_CUDA_ARCHS:-9.0}" MAX_JOBS="${MAX_JOBS:-$jobs}"
  # No package index on the GPU machines: everything must already be installed.
  if ! PIP_NO_INDEX=1 "$PY" -m pip install --no-build-isolation -e .; then
    echo "pip install -e . failed; trying setup.py build_ext --inplace"
    "$PY" setup.py build_ext --inplace -j "$MAX_JOBS"
  fi
  extension_check
}

# shellcheck disable=SC2329
tests() {
  local files=(tests/test_cuda.py tests/test_cuda_backward.py)
  local f rc=0
  for f in tests/test_fast_model.py tests/test_model_caches.py; do
    if [ -f "$f" ]; then files+=("$f"); fi
  done
  # The doctor first: one table of every op on every device, whatever the tests below then say.
  echo "--- elmo-fast doctor"
  "$PY" -m elmo_fast doctor || rc=$?
  echo "--- pytest"
  "$PY" -m pytest -q -rs --durations=15 -p no:cacheprovider "${files[@]}" || rc=$?
  return "$rc"
}

# shellcheck disable=SC2329
sanitizer() {
  local rc=0 tool
  # memcheck: out-of-bounds and misaligned accesses (the 16-byte vector accesses too); racecheck:
  # shared memory (char_cnn's staged ids); synccheck: __syncthreads() in divergent code.
  for tool in memcheck racecheck synccheck; do
    echo "--- $tool"
    local extra=()
    [ "$tool" = memcheck ] && extra=(--leak-check no)
    compute-sanitizer --tool "$tool" --error-exitcode 1 --report-api-errors no "${extra[@]}" \
      "$PY" benchmarks/sanitizer_case.py || rc=$?
  done
  return "$rc"
}

export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PY
export -f device_info extension_check build tests sanitizer

if wanted device; then
  phase device 60 device_info
fi
if wanted device && [ "${STATUS[device]}" != ok ]; then
  skip build "no usable GPU"
elif wanted build; then
  phase build 330 build
else
  phase build 60 extension_check  # an earlier run's build, in this tree
fi
for name in tests sanitizer bench; do
  if ! wanted "$name"; then
    continue
  fi
  if [ "${STATUS[build]}" != ok ]; then
    skip "$name" "no build"
    continue
  fi
  case "$name" in
    tests) phase tests 420 tests ;;
    sanitizer) phase sanitizer 240 sanitizer ;;
    bench) phase bench 300 "$PY" benchmarks/bench_gpu.py --out "$OUT_DIR" ;;
  esac
done

banner "summary"
{
  gpu="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1 || true)"
  echo "gpu_check on ${gpu:-?}, $(date -u +%FT%TZ), phases ${PHASES_WANTED//,/ }"
  for name in "${PHASES[@]}"; do
    printf '  %-10s %-28s %5ss\n' "$name" "${STATUS[$name]}" "${TOOK[$name]}"
  done
  if [ -f "$OUT_DIR/tests.log" ] && wanted tests; then
    echo "  doctor: $(grep -E '^(OK|FAIL): ' "$OUT_DIR/tests.log" | head -n 1 || true)"
    echo "  tests: $(grep -E '^(FAILED|ERROR)|[0-9]+ (passed|failed)' "$OUT_DIR/tests.log" | tail -n 1 || true)"
  fi
  if [ -f "$OUT_DIR/sanitizer.log" ] && wanted sanitizer; then
    echo "  sanitizer: $(grep -E 'ERROR SUMMARY' "$OUT_DIR/sanitizer.log" | tr '\n' ' ' || true)"
  fi
} | tee -a "$OUT_DIR/summary.txt"
if wanted tests && [ -f "$OUT_DIR/tests.log" ] && grep -qE '^FAILED|^ERROR' "$OUT_DIR/tests.log"; then
  echo "failed tests:"
  grep -E '^FAILED|^ERROR' "$OUT_DIR/tests.log" | head -n 30 | tee -a "$OUT_DIR/summary.txt"
fi
if wanted bench && [ -f "$OUT_DIR/bench.md" ]; then
  tail -n 30 "$OUT_DIR/bench.md"
fi
for name in "${PHASES[@]}"; do
  [ "${STATUS[$name]}" = ok ] || exit 1
done
exit 0
