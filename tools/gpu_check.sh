#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU, is elmo-fast's CUDA path right, and how fast is it?
# Run from a checkout of the repository:
#
#     bash tools/gpu_check.sh [--budget SECONDS] [--phases LIST] [--out DIR] [--python PYTHON]
#                             [--dry-run] [--rehearsal[=emulated]]
#
# What the machine needs: an NVIDIA driver, a Python with a CUDA build of torch, numpy, h5py, tqdm,
# pytest and hypothesis (nvcc only to build there; compute-sanitizer for the sanitizer phase).
#
# The extension: either built on the GPU machine (the `extension` phase builds it when there is no
# prebuilt one that fits: `pip install --no-build-isolation -e .`, about 5 minutes), or built anywhere
# with the CUDA toolkit, no GPU needed, and copied over:
#     bash scripts/prepare_gpu_run.sh --torch 2.11.0 --cuda 13.0 --archs 9.0   # on the build machine
#     rsync -a prebuilt/ GPU_HOST:elmo-fast/prebuilt/                          # scp -r, or any copy
#     ssh GPU_HOST 'cd elmo-fast && bash tools/gpu_check.sh'
# (`python scripts/prebuilt_extension.py describe`, run on the GPU machine, prints the first line's flags
# for it; the GPU machine's checkout must be the same commit: the prebuilt extension records a digest of
# the sources it was built from and is used only where they match.)
#
# Phases, in order (most telling first; each with a cap; a phase that fails or reaches its cap never stops
# the next ones nor the summary; the phases after `extension` are skipped only when no extension loads):
#   device      nvidia-smi, nvcc, compute-sanitizer, Python, torch and the GPU it sees          20 s
#   extension   prebuilt/'s extension when it fits this machine (scripts/prebuilt_extension.py
#               check: torch release and CUDA, C++ ABI, Python ABI, sources; both sides printed),
#               installed into elmo_fast/ and loaded; else built here (pip install -e ., 330 s)   30 s
#   doctor      `elmo-fast doctor --device cuda`: every op against its plain-PyTorch reference,
#               fp32/bf16, gradients, the whole model in fp32/tf32/bf16/fp16: one table of errors
#               against bounds                                                                   60 s
#   kernels     pytest, CUDA cases only: every forward and backward kernel against its reference
#               (tests/bilm/test_{highway,char_cnn,lstm,bilm}_cuda.py)                            120 s
#   model       pytest: the bilm-tf golden fixture, the fast model on CUDA vs the reference (tiny,
#               small, original), CUDA graphs, host-planned forwards, bf16/tf32/fp16 bounds, a
#               training step's gradients                                                        110 s
#   bench       benchmarks/bench_gpu.py, preset original: reference vs fast fp32 / tf32 / bf16 and the
#               model (eager, CUDA graphs, bf16) at batch 1, 64, 256 (CUDA events, peak memory),
#               one training step (reference, fast fp32)                                         130 s
#   sanitizer   compute-sanitizer memcheck and racecheck on .ci/sanitizer_case.py (skipped
#               without compute-sanitizer)                                                       100 s
#   more_tests  the other CUDA tests (tests/*/test_*_cuda.py; the self-check's fallback to each
#               op's reference on CUDA tensors)                                                  100 s
#   build       (only when named) build here even when a prebuilt extension fits                 330 s
#
# Options (each also read from the environment variable in brackets):
#   --budget SECONDS  [GPU_CHECK_BUDGET] keep the whole run within SECONDS: each phase gets at most what is
#                     left less 10 s for the summary, and a phase with under 15 s left is skipped (default:
#                     no budget, each phase its cap: about 11 minutes when nothing is built)
#   --phases LIST     [GPU_CHECK_PHASES] a comma list of the phases above (default: all but build; extension
#                     runs in any case, unless build is named: the others need an extension), e.g.
#                     device,extension,doctor,kernels,model,bench for the core in under 8 minutes
#   --out DIR         [GPU_CHECK_OUT] where each phase's log, bench.json and summary.txt go (./gpu_check_out)
#   --python PYTHON   [PYTHON] the interpreter to check (python3)
#   --dry-run         [GPU_CHECK_DRY_RUN=1] print each phase's commands, run nothing
#   --rehearsal       [GPU_CHECK_REHEARSAL=1] run every phase on this machine's CPU, no GPU needed: the
#                     doctor on the CPU, the CUDA cases skip (their selection is still collected), no build
#   --rehearsal=emulated  the same, with the emulated cases of the selected tests instead (tests/cuda_emulation:
#                     the CUDA kernels compiled for the CPU)
# At its cap a phase gets SIGINT (pytest then prints what it ran), then SIGKILL 15 s later. Exit status: 0
# when every phase ran and passed, 1 otherwise, 2 for a bad option. The summary at the end
# (tools/gpu_check_summary.py) holds the figures: the doctor's verdict, the test counts and failures, the
# benchmark against the H100 targets (BENCHMARKS.md, GPU).
#
# Other environment: ELMO_FAST_SELFCHECK (strict here: a kernel that fails its first-use check raises
# instead of falling back, so no test and no timing can pass on the reference path), ELMO_FAST_FIXTURE_DIR
# (the bilm-tf golden fixture, docs/layout.md, Tests; default prebuilt/fixtures/bilm_tf_tiny, else the tests'
# own default, ../shared/fixtures/bilm_tf_tiny).
set -uo pipefail
usage() { sed -n '2,/^set -uo pipefail/p' "${BASH_SOURCE[0]}" | grep '^#' | sed 's/^# \{0,1\}//'; }

PY="${PYTHON:-python3}"
OUT_DIR="${GPU_CHECK_OUT:-$PWD/gpu_check_out}"
BUDGET="${GPU_CHECK_BUDGET:-}"
PHASES_LIST="${GPU_CHECK_PHASES:-device,extension,doctor,kernels,model,bench,sanitizer,more_tests}"
DRY_RUN="${GPU_CHECK_DRY_RUN:-0}"
REHEARSAL="${GPU_CHECK_REHEARSAL:-0}"
bad_option() { echo "gpu_check.sh: $1 (--help lists the options)" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --budget) [ $# -ge 2 ] || bad_option "--budget needs SECONDS"; BUDGET="$2"; shift ;;
    --budget=*) BUDGET="${1#*=}" ;;
    --phases) [ $# -ge 2 ] || bad_option "--phases needs a comma list"; PHASES_LIST="$2"; shift ;;
    --phases=*) PHASES_LIST="${1#*=}" ;;
    --out) [ $# -ge 2 ] || bad_option "--out needs a folder"; OUT_DIR="$2"; shift ;;
    --out=*) OUT_DIR="${1#*=}" ;;
    --python) [ $# -ge 2 ] || bad_option "--python needs an interpreter"; PY="$2"; shift ;;
    --python=*) PY="${1#*=}" ;;
    --dry-run) DRY_RUN=1 ;;
    --rehearsal) REHEARSAL=1 ;;
    --rehearsal=*) REHEARSAL="${1#*=}" ;;
    -h | --help) usage; exit 0 ;;
    *) bad_option "unknown option $1" ;;
  esac
  shift
done
if [ -n "$BUDGET" ] && ! [[ "$BUDGET" =~ ^[0-9]+$ ]]; then
  bad_option "--budget: expected whole seconds, got '$BUDGET'"
fi
for name in ${PHASES_LIST//,/ }; do
  case "$name" in
    device | extension | doctor | kernels | model | bench | sanitizer | more_tests | build) ;;
    *) bad_option "--phases: unknown phase '$name' (device, extension, doctor, kernels, model, bench, sanitizer, more_tests, build)" ;;
  esac
done
case "$REHEARSAL" in
  0 | 1 | emulated) ;;
  *) bad_option "--rehearsal: expected nothing or =emulated, got '$REHEARSAL'" ;;
esac

OUT_DIR="$(mkdir -p "$OUT_DIR" && cd "$OUT_DIR" && pwd)" || bad_option "--out: cannot create $OUT_DIR"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# without a budget, the phases' own caps bound the run (a day here only keeps the arithmetic below simple)
DEADLINE=$((SECONDS + ${BUDGET:-86400}))
PHASES_WANTED=",${PHASES_LIST},"
SCRATCH="$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")"
export PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
export ELMO_FAST_SELFCHECK="${ELMO_FAST_SELFCHECK:-strict}"
if [ -z "${ELMO_FAST_FIXTURE_DIR:-}" ]; then
  # the copy scripts/prepare_gpu_run.sh put in prebuilt/; else the tests' own default (../shared/fixtures)
  if [ -f prebuilt/fixtures/bilm_tf_tiny/lm_weights.hdf5 ]; then
    export ELMO_FAST_FIXTURE_DIR="$PWD/prebuilt/fixtures/bilm_tf_tiny"
  fi
fi
# which cases of the CUDA tests run: on a GPU the "cuda" ones (never the emulator's, which would compile
# it first); in an emulated rehearsal the emulated ones. Their ids start "[cuda" or "[emulated" (-k
# matches substrings of names and of the test functions' attributes: a bare "emulated" would also match
# the @emulated_by_default attribute of nearly every test, and "cuda" the modules' names)
case "$REHEARSAL" in
  emulated) export ELMO_FAST_CUDA_EMULATION=1 CASES="[emulated" ;;
  *) CASES="not [emulated and not emulation" ;;
esac
DEVICE=cuda
[ "$REHEARSAL" = 0 ] || DEVICE=cpu

# The kernels and model phases' tests, most telling first (pytest runs them in this order; -k picks the cases).
KERNEL_TESTS=(
  tests/bilm/test_highway_cuda.py::test_highway_gate
  tests/bilm/test_highway_cuda.py::test_highway
  tests/bilm/test_char_cnn_cuda.py::test_char_cnn
  tests/bilm/test_lstm_cuda.py::test_bilstm_float32
  tests/bilm/test_lstm_cuda.py::test_bilstm_other_dtypes
  tests/bilm/test_highway_cuda.py::test_highway_gate_backward
  tests/bilm/test_char_cnn_cuda.py::test_char_cnn_backward
  tests/bilm/test_char_cnn_cuda.py::test_char_cnn_backward_low_precision
  tests/bilm/test_lstm_cuda.py::test_lstm_layer
  tests/bilm/test_lstm_cuda.py::test_lstm_layer_token_index
  tests/bilm/test_bilm_cuda.py::test_whole_bilm_training_on_the_target_equals_the_reference
  tests/bilm/test_char_cnn_cuda.py::test_char_cnn_other_token_lengths
  tests/bilm/test_char_cnn_cuda.py::test_char_cnn_empty_and_single
  tests/bilm/test_char_cnn_cuda.py::test_char_cnn_non_contiguous
  tests/bilm/test_lstm_cuda.py::test_bilstm_non_contiguous_inputs
  tests/bilm/test_lstm_cuda.py::test_bilstm_lengths_on_cpu
  tests/bilm/test_lstm_cuda.py::test_bilstm_exercises_the_clips
  tests/bilm/test_char_cnn_cuda.py::test_char_cnn_backward_other_token_lengths
  tests/bilm/test_lstm_cuda.py::test_lstm_layer_non_contiguous_gates
)
MODEL_TESTS=(
  tests/bilm/test_bilm_cuda.py::test_golden_bilm_tf_stateful
  tests/bilm/test_bilm_cuda.py::test_golden_bilm_tf_stateful_fast_model
  tests/bilm/test_bilm_cuda.py::test_fast_model_on_cuda_matches_reference
  tests/bilm/test_bilm_cuda.py::test_cuda_graphs_replay_the_eager_forward
  tests/bilm/test_bilm_cuda.py::test_fast_model_forward_from_host_inputs_never_waits_for_the_gpu
  tests/bilm/test_bilm_cuda.py::test_ops_bilm_matches_reference
  tests/bilm/test_bilm_cuda.py::test_bf16_fast_model_on_cuda_error_bound
  tests/bilm/test_bilm_cuda.py::test_low_precision_on_cuda_within_the_stated_bound
  tests/compat/test_compat_cuda.py::test_elmo_gradients_on_cuda_match_cpu
)

# more_tests: every file of CUDA tests (each stage's kernels on the "cuda" and "emulated" targets,
# the modules on a GPU), what the build says it holds, the self-check's fallback on CUDA tensors.
MORE_TESTS=(
  tests/bilm/test_highway_cuda.py tests/bilm/test_char_cnn_cuda.py tests/bilm/test_lstm_cuda.py
  tests/bilm/test_ops_cuda.py tests/bilm/test_bilm_cuda.py tests/embedding/test_embedding_cuda.py
  tests/compat/test_compat_cuda.py
  tests/bilm/test_ops.py::test_cpu_only_build_says_how_to_get_cuda
  tests/bilm/test_ops.py::test_require_cuda_kernels_names_each_cause
  tests/bilm/test_ops.py::test_embedder_on_cuda_without_gpu_says_how
  tests/bilm/test_ops.py::test_ops_on_cuda_tensors_without_kernels_say_how
  tests/bilm/test_ops.py::test_cuda_backward_follows_the_build
  tests/bilm/test_ops.py::test_training_uses_the_cuda_ops_only_where_built
  tests/verification/test_first_use.py::test_fallen_back_ops_give_their_twins_values
)

declare -a PHASES=()
declare -A STATUS=() TOOK=()

banner() { printf '\n==================== %s ====================\n' "$*"; }

wanted() { [[ "$PHASES_WANTED" == *",$1,"* ]]; }

# phase NAME BUDGET_S CMD...: runs CMD under a timeout of min(BUDGET_S, time left - 10 s), logs to
# $OUT_DIR/NAME.log (and the terminal), records ok / FAILED (exit N) / TIMEOUT / skipped. Never fails.
phase() {
  local name="$1" budget="$2"
  shift 2
  PHASES+=("$name")
  local left=$((DEADLINE - SECONDS - 10))
  if [ "$left" -lt 15 ]; then
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
    if declare -F "$1" >/dev/null; then declare -f "$1" | sed 's/^/    /'; fi
    echo "--- $name: dry run, not run"
    return 0
  fi
  local start=$SECONDS rc=0
  # bash -c: CMD may be one of the functions below (exported), which timeout cannot run itself.
  timeout --signal=INT --kill-after=15 "$budget" bash -o pipefail -c '"$@"' _ "$@" 2>&1 |
    tee "$OUT_DIR/$name.log" || rc=$?
  TOOK[$name]=$((SECONDS - start))
  case "$rc" in
    0) STATUS[$name]="ok" ;;
    124 | 137) STATUS[$name]="TIMEOUT after ${budget}s" ;;
    130) STATUS[$name]="TIMEOUT after ${budget}s" ;;  # pytest's exit on SIGINT
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

# not_run NAME WHY: a phase this machine cannot run (a tool it lacks); not a failure of the check.
not_run() {
  PHASES+=("$1")
  STATUS[$1]="not run ($2)"
  TOOK[$1]=0
  banner "$1: not run ($2)"
}

# The functions below run in the child bash of phase() (exported with export -f).
# shellcheck disable=SC2329  # invoked indirectly, by name, through phase()
device_info() {
  nvidia-smi || echo "nvidia-smi failed"
  nvcc --version | tail -n 2 || echo "no nvcc on PATH"
  compute-sanitizer --version | tail -n 1 || echo "no compute-sanitizer on PATH"
  echo "CPU: $(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1), $(nproc) cores"
  "$PY" - "$REHEARSAL" <<'EOF'
import platform, sys, sysconfig, torch
print(f"python {platform.python_version()} ({sysconfig.get_config_var('EXT_SUFFIX')}) at {sys.executable}, "
      f"torch {torch.__version__} (CUDA {torch.version.cuda})")
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"GPU: {p.name}, {p.multi_processor_count} SMs, {p.total_memory / 2**30:.1f} GiB, capability {p.major}.{p.minor}")
elif sys.argv[1] != "0":
    print("GPU: none (a rehearsal on the CPU)")
else:
    raise SystemExit("torch sees no CUDA GPU")
EOF
}

# shellcheck disable=SC2329
extension_check() {
  "$PY" - "$REHEARSAL" <<'EOF'
import os, sys
sys.path.insert(0, os.getcwd())
from elmo_fast.bilm import ops
if sys.argv[1] != "0":  # a rehearsal: whatever extension this tree has
    ops.require_extension()
    import elmo_fast._C as C
    print(f"elmo_fast._C loaded from {C.__file__} (a rehearsal): CUDA kernels {ops.HAS_CUDA_KERNELS}, "
          f"CUDA training ops {ops.HAS_CUDA_BACKWARD}")
    raise SystemExit(0)
ops.require_cuda_kernels()
import elmo_fast._C as C
print(f"elmo_fast._C loaded from {C.__file__}: CUDA kernels in; CUDA training ops: {ops.HAS_CUDA_BACKWARD}")
if not ops.HAS_CUDA_BACKWARD:
    raise SystemExit("the CUDA training ops (ops.TRAINING_OPS) are missing from this build")
EOF
}

# shellcheck disable=SC2329
build() {
  if [ "$REHEARSAL" != 0 ]; then
    echo "a rehearsal builds nothing: the extension already in this tree is checked"
    extension_check
    return
  fi
  local jobs
  jobs="$(nproc 2>/dev/null || echo 8)"
  export ELMO_FAST_CUDA_ARCHS="${ELMO_FAST_CUDA_ARCHS:-9.0}" MAX_JOBS="${MAX_JOBS:-$jobs}"
  # Builds against the torch installed here (installed first) and downloads nothing.
  if ! PIP_NO_INDEX=1 "$PY" -m pip install --no-build-isolation --no-deps -e .; then
    echo "pip install -e . failed; trying setup.py build_ext --inplace"
    "$PY" setup.py build_ext --inplace -j "$MAX_JOBS"
  fi
  extension_check
}

# shellcheck disable=SC2329
extension() {
  if "$PY" scripts/prebuilt_extension.py check; then
    "$PY" scripts/prebuilt_extension.py install && extension_check && return 0
    echo "the prebuilt extension does not load here: building it"
  else
    echo "building the extension here instead"
  fi
  build
}

# shellcheck disable=SC2329
doctor() {
  "$PY" -m elmo_fast doctor --device "$DEVICE"
}

# shellcheck disable=SC2329
run_pytest() {  # ARGS...: the last -k given wins, so callers may narrow "$CASES"
  "$PY" -m pytest -q -rfE --durations=8 -p no:cacheprovider -k "$CASES" "$@"
}

# shellcheck disable=SC2329
model_tests() {
  # the preset "original" last: its float64 references and rounding-error model take the most CPU time
  local rc=0
  run_pytest "$@" -k "$CASES and not original" || rc=$?
  echo "--- the preset original"
  run_pytest "$@" -k "$CASES and original" || rc=$?
  return "$rc"
}

# shellcheck disable=SC2329
sanitizer() {
  local rc=0 tool
  # memcheck: out-of-bounds and misaligned accesses (the 16-byte vector accesses too); racecheck: shared
  # memory (char_cnn's staged ids). No first-use self-check here: its own kernels would run under the tool too.
  for tool in memcheck racecheck; do
    echo "--- $tool"
    local extra=()
    [ "$tool" = memcheck ] && extra=(--leak-check no)
    ELMO_FAST_SELFCHECK=0 timeout --signal=INT --kill-after=10 "${SANITIZER_TOOL_S:-60}" \
      compute-sanitizer --tool "$tool" --error-exitcode 1 --report-api-errors no "${extra[@]}" \
      "$PY" .ci/sanitizer_case.py || rc=$?
  done
  return "$rc"
}

# shellcheck disable=SC2329
bench() {
  local rc=0
  "$PY" benchmarks/bench_gpu.py --preset original --batches 64,256,1 --budget 0.5 \
    --configs reference,fast-fp32,fast-tf32,fast-bf16,model-fp32,model-graphs,model-bf16 \
    --train-batches 64 --train-configs train-reference,train-fast-fp32 --out "$SCRATCH/bench" || rc=$?
  cp "$SCRATCH/bench/bench.json" "$OUT_DIR/bench.json" 2>/dev/null || true
  return "$rc"
}

export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PY REHEARSAL CASES DEVICE SCRATCH OUT_DIR
export -f device_info extension_check build extension doctor run_pytest model_tests sanitizer bench

if wanted device; then
  phase device 20 device_info
fi
if wanted device && [ "${STATUS[device]}" != ok ] && [ "$DRY_RUN" != 1 ]; then
  skip extension "no usable GPU"
elif wanted build; then
  phase build 330 build
elif [ "$DRY_RUN" = 1 ] || "$PY" scripts/prebuilt_extension.py check >/dev/null 2>&1 || [ "$REHEARSAL" != 0 ]; then
  phase extension 30 extension
else
  phase extension 330 extension  # it builds: the prebuilt extension does not fit this machine
fi
loaded="${STATUS[build]:-${STATUS[extension]:-}}"

# The kernels and model phases' tests, left out of more_tests. --deselect takes node-id prefixes: a parametrized
# test's cases are "name[...]" (the bare name would also take test_highway_gate with test_highway);
# the one test without parameters is named whole.
deselect=()
for t in "${KERNEL_TESTS[@]}" "${MODEL_TESTS[@]}"; do
  case "$t" in
    *::test_golden_bilm_tf_stateful_fast_model) deselect+=(--deselect "$t") ;;
    *) deselect+=(--deselect "$t[") ;;
  esac
done

for name in doctor kernels model bench sanitizer more_tests; do
  wanted "$name" || continue
  if [ "$loaded" != ok ]; then
    skip "$name" "no extension loaded"
    continue
  fi
  case "$name" in
    doctor) phase doctor 60 doctor ;;
    kernels) phase kernels 120 run_pytest "${KERNEL_TESTS[@]}" ;;
    model) phase model 110 model_tests "${MODEL_TESTS[@]}" ;;
    bench) phase bench 130 bench ;;
    sanitizer)
      if [ "$DRY_RUN" != 1 ] && ! command -v compute-sanitizer >/dev/null; then
        not_run sanitizer "no compute-sanitizer on PATH; it comes with the CUDA toolkit"
      else
        phase sanitizer 100 sanitizer
      fi
      ;;
    more_tests) phase more_tests 100 run_pytest "${MORE_TESTS[@]}" "${deselect[@]}" ;;
  esac
done

banner "summary"
{
  gpu="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1 || true)"
  echo "gpu_check on ${gpu:-no GPU}, $(date -u +%FT%TZ), budget ${BUDGET:-none}, phases ${PHASES_WANTED//,/ }$([ "$REHEARSAL" = 0 ] || echo "(rehearsal: $REHEARSAL)")"
  for name in "${PHASES[@]}"; do
    printf '  %-11s %-30s %5ss\n' "$name" "${STATUS[$name]}" "${TOOK[$name]}"
  done
  if [ "$DRY_RUN" != 1 ]; then
    "$PY" tools/gpu_check_summary.py "$OUT_DIR" || echo "  (gpu_check_summary.py failed: the logs above and in $OUT_DIR hold it all)"
  fi
} 2>&1 | tee "$OUT_DIR/summary.txt"
rm -rf "$SCRATCH"
for name in "${PHASES[@]}"; do
  case "${STATUS[$name]}" in
    ok | "not run"*) ;;
    *) exit 1 ;;
  esac
done
exit 0
