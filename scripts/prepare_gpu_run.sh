#!/usr/bin/env bash
# Build elmo-fast's CUDA extension for a GPU machine, on any machine with the CUDA toolkit (no GPU
# needed), so that the GPU machine compiles nothing:
#
#   bash scripts/prepare_gpu_run.sh [--torch VERSION] [--cuda X.Y] [--python PYTHON] [--archs "9.0"]
#                                   [--venv DIR] [--rehearse]
#
# The flags describe the GPU machine: its torch release and that torch's CUDA version, its Python, and its
# GPUs' compute capabilities. `python scripts/prebuilt_extension.py describe`, run on the GPU machine,
# prints them. Defaults: torch 2.11.0 for CUDA 13.0 (PyPI's build), python3.12, archs 9.0 (H100, H200).
#
# 1. a venv (ignored by git: .venv-gpu-py312/ for Python 3.12) with that torch (a CUDA build: several GB,
#    downloaded once, then kept), numpy, h5py, tqdm, pytest and hypothesis (the same venv can rehearse
#    gpu_check.sh here: --rehearse);
# 2. elmo_fast._C built in it with the CUDA kernels for those archs, incrementally in build/gpu-prebuilt/
#    (a rebuild after a small change takes seconds);
# 3. the .so and its _build_info.py recorded in prebuilt/ (ignored by git) with prebuilt/manifest.json: the
#    torch, CUDA, C++ ABI and Python ABI it was built against and a digest of csrc/, setup.py and
#    build_support/ (scripts/prebuilt_extension.py); then loaded here (torch.ops.load_library), its
#    CUDA kernels and training ops checked, and its cubins listed (cuobjdump);
# 4. the bilm-tf golden fixture copied into prebuilt/fixtures/ when it is found (ELMO_FAST_FIXTURE_DIR, else
#    ../shared/fixtures/bilm_tf_tiny; docs/layout.md, Tests), so that the golden tests run on the GPU too;
# 5. what to do next printed: copy prebuilt/ into the GPU machine's checkout of the same commit (scp,
#    rsync, a shared disk), run tools/gpu_check.sh there. It installs prebuilt/'s extension when the GPU
#    machine's torch and Python ABI match (it prints both) and builds there only when they do not.
#
#   --rehearse   then also runs gpu_check.sh on a clean copy of the checkout (the files git tracks, and
#                prebuilt/) with the venv's Python, on this machine's CPU (gpu_check.sh --rehearsal): the
#                prebuilt extension checked, installed and loaded with the GPU machine's torch, the doctor
#                on the CPU, every test selection collected (their CUDA cases skip).
#
# Environment: GPU_TORCH_VERSION, GPU_TORCH_CUDA, ELMO_FAST_GPU_PYTHON, ELMO_FAST_CUDA_ARCHS, ELMO_FAST_GPU_VENV
# (the flags' defaults; an existing venv is reused), MAX_JOBS (nproc), PREPARE_NICE (10: the build runs under
# nice), CUDA_HOME (/usr/local/cuda).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$PWD"
REHEARSE=0
TORCH_VERSION="${GPU_TORCH_VERSION:-2.11.0}"
TORCH_CUDA="${GPU_TORCH_CUDA:-13.0}"
PYBASE="${ELMO_FAST_GPU_PYTHON:-}"
VENV="${ELMO_FAST_GPU_VENV:-}"
ARCHS="${ELMO_FAST_CUDA_ARCHS:-9.0}"
usage() { sed -n '2,/^set -euo pipefail/p' "${BASH_SOURCE[0]}" | grep '^#' | sed 's/^# \{0,1\}//'; }
bad_option() { echo "prepare_gpu_run.sh: $1 (--help lists the options)" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --torch | --cuda | --python | --archs | --venv)
      [ $# -ge 2 ] || bad_option "$1 needs a value"
      case "$1" in
        --torch) TORCH_VERSION="$2" ;;
        --cuda) TORCH_CUDA="$2" ;;
        --python) PYBASE="$2" ;;
        --archs) ARCHS="$2" ;;
        --venv) VENV="$2" ;;
      esac
      shift
      ;;
    --rehearse) REHEARSE=1 ;;
    -h | --help) usage; exit 0 ;;
    *) bad_option "unknown option $1" ;;
  esac
  shift
done
# the Python version the GPU machine runs, from the interpreter's name (python3.12, /path/to/python3.12)
PY_VERSION="$(basename "${PYBASE:-python3.12}" | sed -n 's/^python\(3\.[0-9][0-9]*\)$/\1/p')"
[ -n "$PY_VERSION" ] || bad_option "--python: expected an interpreter named python3.X (a name or a path), got '$PYBASE'"
VENV="${VENV:-$ROOT/.venv-gpu-py${PY_VERSION/./}}"
JOBS="${MAX_JOBS:-$(nproc 2>/dev/null || echo 2)}"
NICE="${PREPARE_NICE:-10}"
DEST="$ROOT/prebuilt"
BUILD="$ROOT/build/gpu-prebuilt"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

say() { printf '=== prepare: %s\n' "$*"; }
die() { printf 'prepare_gpu_run: error: %s\n' "$*" >&2; exit 1; }

# --- 1. the venv ---------------------------------------------------------------------------------
if [ ! -x "$VENV/bin/python" ]; then
  if [[ "$PYBASE" != */* ]]; then  # a name: pyenv's, else the one on PATH
    name="${PYBASE:-python$PY_VERSION}"
    PYBASE=""
    for candidate in "$HOME"/.pyenv/versions/"$PY_VERSION".*/bin/"$name" "$(command -v "$name" || true)"; do
      if [ -n "$candidate" ] && [ -x "$candidate" ]; then PYBASE="$candidate"; break; fi
    done
  fi
  [ -n "$PYBASE" ] && [ -x "$PYBASE" ] || die "no Python $PY_VERSION found (--python /path/to/python$PY_VERSION)"
  say "venv $VENV from $PYBASE"
  "$PYBASE" -m venv "$VENV"
fi
PY="$VENV/bin/python"
"$PY" -c 'import sys; sys.exit("{}.{}".format(*sys.version_info[:2]) != sys.argv[1])' "$PY_VERSION" ||
  die "$PY is not Python $PY_VERSION (the GPU machine's); remove $VENV or pass --venv"
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

# --- 5. what to do next ----------------------------------------------------------------------------------
"$PY" scripts/prebuilt_extension.py check --dir "$DEST" >/dev/null || die "prebuilt/ does not check against the venv it was built in"
say "prebuilt/ holds $(du -sh "$DEST" | cut -f1)"
cat <<EOF
=== prepare: done. On the GPU machine, in a checkout of this commit ($(git rev-parse --short HEAD 2>/dev/null || echo "?")),
    with a Python that has torch $TORCH_VERSION for CUDA $TORCH_CUDA, numpy, h5py, tqdm, pytest and hypothesis:
  copy prebuilt/ there, e.g.   rsync -a prebuilt/ GPU_HOST:elmo-fast/prebuilt/   (or scp -r, a shared disk)
  then run                     bash tools/gpu_check.sh   (--budget SECONDS to keep the run within a time)
EOF
if [ "$REHEARSE" = 1 ]; then
  copy="$(mktemp -d "${TMPDIR:-/tmp}/gpu-rehearsal.XXXXXX")"
  { git ls-files -z; git ls-files -z --others --exclude-standard; } | tar --null --ignore-failed-read -T - -cf - |
    tar -xf - -C "$copy"
  cp -r "$DEST" "$copy/prebuilt"
  say "rehearsal in $copy (a clean copy of the checkout, prebuilt/ included), with $PY, on the CPU"
  (cd "$copy" && nice -n "$NICE" bash tools/gpu_check.sh --rehearsal --python "$PY" --out "$copy/out") ||
    say "the rehearsal's summary above says which phase failed (bench always does without a GPU)"
  say "rehearsal logs: $copy/out"
fi
