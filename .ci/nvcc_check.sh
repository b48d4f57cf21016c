#!/usr/bin/env bash
# Compile-only check of the CUDA sources, for machines with nvcc but no GPU (and even a CPU build
# of torch): every .cu is compiled for sm_80 and sm_90 with the flags torch's CUDAExtension would
# use, so a CUDA syntax or template error fails CI although the CUDA extension is never linked here.
#
#   bash .ci/nvcc_check.sh              # every csrc/**/*.cu
#   bash .ci/nvcc_check.sh a.cu dir/    # these files / every .cu under these dirs
#
# Needs the project's venv active (torch's headers and flags come from the installed torch).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ "$#" -eq 0 ]; then
  set -- "$ROOT/csrc"
fi

files=()
for target in "$@"; do
  if [ -d "$target" ]; then
    while IFS= read -r -d '' f; do files+=("$f"); done < <(find "$target" -type f -name '*.cu' -print0 | sort -z)
  elif [ -f "$target" ]; then
    files+=("$target")
  else
    echo "nvcc check: no such file or directory: $target" >&2
    exit 2
  fi
done
if [ "${#files[@]}" -eq 0 ]; then
  echo "nvcc check: no CUDA sources"
  exit 0
fi

NVCC="${NVCC:-nvcc}"
if ! command -v "$NVCC" >/dev/null 2>&1; then
  echo "nvcc check: ${#files[@]} CUDA source(s) but '$NVCC' is not on PATH" >&2
  exit 1
fi

# Torch's include dirs, Python's, the nvcc defines CUDAExtension adds (COMMON_NVCC_FLAGS) and the
# C++ ABI torch was built with, all read from the installed torch.
if ! torch_flags="$(python - <<'EOF'
import sysconfig

import torch
from torch.utils import cpp_extension

flags = []
for path in cpp_extension.include_paths() + [sysconfig.get_paths()["include"]]:
    flags += ["-isystem", path]
flags += cpp_extension.COMMON_NVCC_FLAGS
flags.append(f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}")
print("\n".join(flags))
EOF
)"; then
  echo "nvcc check: cannot import torch; activate the project's venv first" >&2
  exit 1
fi
mapfile -t torch_flags <<<"$torch_flags"

flags=(
  # C++20 as setup.py: torch 2.13's headers need it (under c++17 they only pass as GCC extensions).
  -c -std=c++20 -O3 -lineinfo
  -gencode arch=compute_80,code=sm_80
  -gencode arch=compute_90,code=sm_90
  -Xcompiler -fPIC
  "${torch_flags[@]}"
  -I "$ROOT/csrc"
  # torch's CPU wheel ships c10/cuda headers but not the generated c10/cuda/impl/cuda_cmake_macros.h.
  -DC10_CUDA_NO_CMAKE_CONFIGURE_FILE
  -DTORCH_API_INCLUDE_EXTENSION_H
  -DTORCH_EXTENSION_NAME=_C
  -DELMO_FAST_WITH_CUDA
)

echo "nvcc check: $("$NVCC" --version | grep -o "release [0-9.]*, V[0-9.]*" || true)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
failed=0
for f in "${files[@]}"; do
  start=$SECONDS
  if "$NVCC" "${flags[@]}" "$f" -o "$tmp/out.o" 2>"$tmp/log"; then
    echo "nvcc check: ok   $f ($((SECONDS - start))s)"
    cat "$tmp/log"  # warnings, if any
  else
    echo "nvcc check: FAIL $f" >&2
    cat "$tmp/log" >&2
    failed=$((failed + 1))
  fi
done
if [ "$failed" -ne 0 ]; then
  echo "nvcc check: $failed of ${#files[@]} CUDA source(s) failed to compile" >&2
  exit 1
fi
echo "nvcc check: all ${#files[@]} CUDA source(s) compile for sm_80 and sm_90"
