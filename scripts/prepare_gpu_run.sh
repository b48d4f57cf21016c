#!/usr/bin/env bash
# Prepare a GPU run HERE, on a machine without a GPU, so that the GPU machine compiles nothing:
#
#   bash scripts/prepare_gpu_run.sh
#
# 1. a Python 3.12 venv (ignored: .venv-gpu-py312/, never carried) with the torch that the GPU machine
#    has (2.11.0, PyPI's CUDA 13.0 build: several GB, downloaded once, then kept), numpy, h5py, tqdm,
#    pytest and hypothesis (the same venv can rehearse gpu_check.sh here: see BENCHMARKS.md, GPU);
# 2. elmo_fast._C built in it with the CUDA kernels for sm_90 (ELMO_FAST_CUDA_ARCHS=9.0, the H100 and
#    H200), incrementally in build/gpu-prebuilt/ (a rebuild after a small change takes a fraction);
# 3. the .so and its _build_info.py recorded in prebuilt/ (ignored) with prebuilt/manifest.json: the
#    torch, CUDA, C++ ABI and Python ABI it was built against and a digest of csrc/, setup.py and
#    build_support/ (scripts/prebuilt_extension.py); then loaded here (torch.ops.load_library), its
#    CUDA kernels and training ops checked, and its cubins listed (cuobjdump);
# 4. the bilm-tf golden fixture copied into prebuilt/fixtures/ (the workspace's shared/ stays behind);
# 5. the run command printed: the device tool's `run` with carry ["prebuilt"] (prebuilt/ travels with
#    the working tree; it must stay within the 64 MiB limit, which is checked here).
# tools/gpu_check.sh installs prebuilt/'s extension when the GPU machine's torch and Python ABI
# match (it prints both) and builds there only when they do not.
#
#   bash scripts/prepare_gpu_run.sh --rehearse
# then also runs gpu_check.sh on a copy of what travels (the tree git would send, prebuilt/) with the venv's
# Python, on this machine's CPU (GPU_CHECK_REHEARSAL=1): the prebuilt extension checked, installed and
# loaded with torch 2.11, the doctor on the CPU, every test selection collected (their CUDA cases skip).
#
# Environment: GPU_TORCH_VERSION (2.11.0), GPU_TORCH_CUDA (13.0: torch.version.cuda must say it),
# ELMO_FAST_GPU_VENV (the venv; an existing one is reused, e.g. another checkout's), ELMO_FAST_GPU_PYTHON
# (a python3.12; default: pyenv's 3.12.*, else python3.12 on PATH), ELMO_FAST_CUDA_ARCHS (9.0),
# MAX_JOBS (nproc), PREPARE_NICE (10: the build runs under nice), CUDA_HOME (/usr/local/cuda).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$PWD"
REHEARSE=0
for arg in "$@"; do
  case "$arg" in
    --rehearse) REHEARSE=1 ;;
    *) echo "usage: bash scripts/prepare_gpu_run.sh [--rehearse]" >&2; exit 2 ;;
  esac
done

TORCH_VERSION="${GPU_TORCH_VERSION:-2.11.0}"
TORCH_CUDA="${GPU_TORCH_CUDA:-13.0}"
VENV="${ELMO_FAST_GPU_VENV:-$ROOT/.venv-gpu-py312}"
ARCHS="${ELMO_FAST_CUDA_ARCHS:-9.0}"
JOBS="${MAX_JOBS:-$(nproc 2>/dev/null || echo 2)}"
NICE="${PREPARE_NICE:-10}"
DEST="$ROOT/prebuilt"
BUILD="$ROOT/build/gpu-prebuilt"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

say() { printf '=== prepare: %s\n' "$*"; }
die() { printf 'prepare_gpu_run: error: %s\n' "$*" >&2; exit 1; }

# --- 1. the venv ---------------------------------------------------------------------------------
if [ ! -x "$VENV/bin/python" ]; then
  PYBASE="${ELMO_FAST_GPU_PYTHON:-}"
  if [ -z "$PYBASE" ]; then
    for candidate in "$HOME"/.pyenv/versions/3.12.*/bin/python3.12 "$(command -v python3.12 || true)"; do
      if [ -n "$candidate" ] && [ -x "$candidate" ]; then PYBASE="$candidate"; break; fi
    done
  fi
  [ -n "$PYBASE" ] || die "no Python 3.12 found (set ELMO_FAST_GPU_PYTHON to a python3.12)"
  say "venv $VENV from $PYBASE"
  "$PYBASE" -m venv "$VENV"
fi
PY="$VENV/bin/python"
"$PY" -c 'import sys; assert sys.version_info[:2] == (3, 12), sys.version' ||
  die "$PY is not Python 3.12 (the GPU machine's); remove $VENV or set ELMO_FAST_GPU_VENV"
have_torch() {
  "$PY" - "$TORCH_VERSION" "$TORCH_CUDA" <<'EOF' 2>/dev/null
import sys, torch
sys.exit(0 if torch.__version__.split("+")[0] == sys.argv[1] and torch.version.cuda == sys.argv[2] else 1)
EOF
}
if ! have_torch; then
  say "installing torch==$TORCH_VERSION (CUDA $TORCH_CUDA build: a download of several GB, once) into $VENV"
  "$PY" -m pip install -q "torch==$TORCH_VERSION" setuptools wheel ninja
fi
"$PY" -m pip install -q numpy h5py tqdm pytest hypothesis setuptools wheel ninja
have_torch || die "$VENV has torch $("$PY" -c 'import torch; print(torch.__version__, torch.version.cuda)'), not $TORCH_VERSION for CUDA $TORCH_CUDA"
say "$("$PY" -c 'import platform, torch; print(f"Python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda})")')"

# --- 2. the build ----------------------------------------------------------------------------------
if [ -z "${CUDA_HOME:-}" ] && [ -f /usr/local/cuda/include/cuda_runtime_api.h ]; then
  export CUDA_HOME=/usr/local/cuda
fi
say "building elmo_fast._C for sm ${ARCHS} with $JOBS jobs under nice -n $NICE (CUDA_HOME=${CUDA_HOME:-from nvcc})"
rm -rf "$BUILD/lib"
mkdir -p "$BUILD"
start=$SECONDS
ELMO_FAST_CUDA_ARCHS="$ARCHS" ELMO_FAST_FORCE_CUDA_BUILD=1 MAX_JOBS="$JOBS" \
  nice -n "$NICE" "$PY" setup.py -q build_ext --build-lib "$BUILD/lib" --build-temp "$BUILD/temp" \
  >"$BUILD/build.log" 2>&1 || { tail -n 40 "$BUILD/build.log" >&2; die "the build failed (log: $BUILD/build.log)"; }
took=$((SECONDS - start))
say "built in ${took}s (log: $BUILD/build.log)"

# --- 3. record, load, list ---------------------------------------------------------------------------
"$PY" scripts/prebuilt_extension.py record "$BUILD/lib" --dir "$DEST" --seconds "$took"
so="$(ls "$DEST"/_C*.so)"
"$PY" - "$so" <<'EOF'
import sys, torch
torch.ops.load_library(sys.argv[1])
missing = [op for op in ("char_cnn", "highway_gate", "highway", "bilstm", "char_cnn_backward", "highway_gate_backward",
                         "lstm_layer_forward", "lstm_layer_backward")
           if not torch._C._dispatch_has_kernel_for_dispatch_key(f"elmo_fast::{op}", "CUDA")]
if missing:
    raise SystemExit(f"prepare_gpu_run: {sys.argv[1]} has no CUDA kernel for {missing}")
print(f"=== prepare: loaded {sys.argv[1]} with torch {torch.__version__}: every op has its CUDA kernel")
EOF
CUOBJDUMP="$(command -v cuobjdump || echo "${CUDA_HOME:-/usr/local/cuda}/bin/cuobjdump")"
if [ -x "$CUOBJDUMP" ]; then
  say "cubins and PTX in it: $("$CUOBJDUMP" --list-elf "$so" 2>/dev/null | grep -o 'sm_[0-9a-z]*' | sort | uniq -c | tr '\n' ' ')$("$CUOBJDUMP" --list-ptx "$so" 2>/dev/null | grep -o 'sm_[0-9a-z]*' | sort -u | sed 's/^/ PTX /' | tr '\n' ' ')"
else  # no cuobjdump here: what nvcc was asked for
  say "nvcc targets (no cuobjdump here to list the cubins): $(grep -o 'arch=compute_[0-9a-z]*,code=[a-z]*_[0-9a-z]*' "$BUILD/temp/build.ninja" | sort -u | tr '\n' ' ')"
fi

# --- 4. the golden fixture -----------------------------------------------------------------------------
FIXTURE="${ELMO_FAST_FIXTURE_DIR:-$ROOT/../shared/fixtures/bilm_tf_tiny}"
if [ -f "$FIXTURE/lm_weights.hdf5" ]; then
  rm -rf "$DEST/fixtures"
  mkdir -p "$DEST/fixtures"
  cp -r "$FIXTURE" "$DEST/fixtures/bilm_tf_tiny"
  say "golden fixture copied from $FIXTURE"
else
  say "WARNING: no golden fixture at $FIXTURE (set ELMO_FAST_FIXTURE_DIR): the golden tests will skip"
fi

# --- 5. what travels, and the run command ----------------------------------------------------------------
tree_bytes=$( { git ls-files -z; git ls-files -z --others --exclude-standard; } | xargs -0 -r stat -c %s 2>/dev/null |
  awk '{s += $1} END {print s + 0}')
prebuilt_bytes=$(du -sb "$DEST" | cut -f1)
total=$((tree_bytes + prebuilt_bytes))
say "travels: working tree $((tree_bytes / 1048576)) MiB + prebuilt/ $((prebuilt_bytes / 1048576)) MiB = $((total / 1048576)) MiB (limit 64)"
[ "$total" -lt $((64 * 1048576)) ] || die "more than 64 MiB would travel"
"$PY" scripts/prebuilt_extension.py check --dir "$DEST" >/dev/null || die "prebuilt/ does not check against the venv it was built in"
cat <<EOF
=== prepare: done. The first GPU command (device tool \`run\`; at most 8 minutes of phases):
    command:   bash tools/gpu_check.sh
    carry:     ["prebuilt"]
    timeout_s: 540
  then, only if at least 5 minutes of device time are left, at once (at most 4 minutes):
    command:   GPU_CHECK_PHASES=extension,sanitizer,more_tests GPU_CHECK_BUDGET=230 bash tools/gpu_check.sh
    carry:     ["prebuilt"]
    timeout_s: 250
EOF
if [ "$REHEARSE" = 1 ]; then
  copy="$(mktemp -d "${TMPDIR:-/tmp}/gpu-rehearsal.XXXXXX")"
  { git ls-files -z; git ls-files -z --others --exclude-standard; } | tar --null --ignore-failed-read -T - -cf - |
    tar -xf - -C "$copy"
  cp -r "$DEST" "$copy/prebuilt"
  say "rehearsal in $copy (what travels, prebuilt/ included), with $PY, on the CPU"
  (cd "$copy" && GPU_CHECK_REHEARSAL=1 PYTHON="$PY" OUT="$copy/out" nice -n "$NICE" bash tools/gpu_check.sh) ||
    say "the rehearsal's summary above says which phase failed (bench always does without a GPU)"
  say "rehearsal logs: $copy/out"
fi
