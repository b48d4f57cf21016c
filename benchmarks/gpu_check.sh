#!/usr/bin/env bash
# The GPU check: ONE script for a machine with an NVIDIA GPU, run from the repository root.
#
#   bash benchmarks/gpu_check.sh
#
# Phases (each with a time budget; a failing phase does not stop the next ones, except that
# nothing after the build runs without a build):
#   device     nvidia-smi, nvcc, torch and the GPU it sees
#   build      ELMO_FAST_CUDA_ARCHS=9.0 pip install --no-build-isolation -e . (falls back to
#              setup.py build_ext --inplace), then checks that the CUDA kernels are in
#   tests      pytest tests/test_cuda.py (and tests/test_fast_model.py when present)
#   sanitizer  compute-sanitizer memcheck and racecheck on benchmarks/sanitizer_case.py
#   bench      benchmarks/bench_gpu.py (reference vs fast fp32 / tf32 / bf16, original shapes)
# then a summary. Logs, bench.json, bench.md and summary.txt go to $OUT (or ./gpu_check_out).
# The whole run keeps within GPU_CHECK_BUDGET seconds (default 540): each phase gets at most
# what is left. The bilm-tf golden tests need the fixture: copy the workspace's shared/fixtures
# into ./shared/fixtures (or set ELMO_FAST_FIXTURE_DIR); without it they skip, saying so.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PY="${PYTHON:-python3}"
OUT_DIR="${OUT:-$PWD/gpu_check_out}"
mkdir -p "$OUT_DIR"
BUDGET="${GPU_CHECK_BUDGET:-540}"
DEADLINE=$((SECONDS + BUDGET))
export PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
if [ -z "${ELMO_FAST_FIXTURE_DIR:-}" ] && [ -d shared/fixtures/bilm_tf_tiny ]; then
  export ELMO_FAST_FIXTURE_DIR="$PWD/shared/fixtures/bilm_tf_tiny"
fi

declare -a PHASES=()
declare -A STATUS=() TOOK=()

banner() { printf '\n==================== %s ====================\n' "$*"; }

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

device_info() {
  nvidia-smi || echo "nvidia-smi failed"
  nvcc --version | tail -n 2 || echo "no nvcc on PATH"
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

build() {
  local jobs
  jobs="$(nproc 2>/dev/null || echo 8)"
  export ELMO_FAST_CUDA_ARCHS="${ELMO_FAST_CUDA_ARCHS:-9.0}" MAX_JOBS="${MAX_JOBS:-$jobs}"
  # No package index on the GPU machines: everything must already be installed.
  if ! PIP_NO_INDEX=1 "$PY" -m pip install --no-build-isolation -e .; then
    echo "pip install -e . failed; trying setup.py build_ext --inplace"
    "$PY" setup.py build_ext --inplace -j "$MAX_JOBS"
  fi
  "$PY" - <<'EOF'
import os, sys
sys.path.insert(0, os.getcwd())
from elmo_fast.bilm import ops
ops.require_cuda_kernels()
print(f"elmo_fast._C loaded from {ops._C.__file__}: CUDA kernels in")
EOF
}

tests() {
  local files=(tests/test_cuda.py)
  [ -f tests/test_fast_model.py ] && files+=(tests/test_fast_model.py)
  "$PY" -m pytest -q -rs --durations=10 -p no:cacheprovider "${files[@]}"
}

sanitizer() {
  local rc=0
  echo "--- memcheck"
  compute-sanitizer --tool memcheck --error-exitcode 1 --leak-check no --report-api-errors no \
    "$PY" benchmarks/sanitizer_case.py || rc=$?
  echo "--- racecheck (shared memory of char_cnn)"
  compute-sanitizer --tool racecheck --error-exitcode 1 --report-api-errors no \
    "$PY" benchmarks/sanitizer_case.py || rc=$?
  return "$rc"
}

export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PY
export -f device_info build tests sanitizer

phase device 60 device_info
if [ "${STATUS[device]}" != ok ]; then
  skip build "no usable GPU"
else
  phase build 300 build
fi
if [ "${STATUS[build]}" = ok ]; then
  phase tests 300 tests
  phase sanitizer 240 sanitizer
  phase bench 240 "$PY" benchmarks/bench_gpu.py --out "$OUT_DIR"
else
  skip tests "no build"
  skip sanitizer "no build"
  skip bench "no build"
fi

banner "summary"
{
  echo "gpu_check on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1 || echo '?'), $(date -u +%FT%TZ)"
  for name in "${PHASES[@]}"; do
    printf '  %-10s %-28s %5ss\n' "$name" "${STATUS[$name]}" "${TOOK[$name]}"
  done
  if [ -f "$OUT_DIR/tests.log" ]; then
    echo "  tests: $(grep -E '^(FAILED|ERROR)|[0-9]+ (passed|failed)' "$OUT_DIR/tests.log" | tail -n 1)"
  fi
  if [ -f "$OUT_DIR/sanitizer.log" ]; then
    echo "  sanitizer: $(grep -E 'ERROR SUMMARY' "$OUT_DIR/sanitizer.log" | tr '\n' ' ')"
  fi
} | tee "$OUT_DIR/summary.txt"
if [ -f "$OUT_DIR/tests.log" ] && grep -qE '^FAILED|^ERROR' "$OUT_DIR/tests.log"; then
  echo "failed tests:"
  grep -E '^FAILED|^ERROR' "$OUT_DIR/tests.log" | head -n 30 | tee -a "$OUT_DIR/summary.txt"
fi
[ -f "$OUT_DIR/bench.md" ] && tail -n 20 "$OUT_DIR/bench.md"
for name in "${PHASES[@]}"; do
  [ "${STATUS[$name]}" = ok ] || exit 1
done
exit 0
