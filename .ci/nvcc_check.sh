#!/usr/bin/env bash
# Compile-only check of the CUDA sources, for machines with nvcc but no GPU (and even a CPU build
# of torch), so that neither a CUDA kernel nor its host binding can land with a compile error
# although the CUDA extension is never linked here:
#   * every .cu is compiled by nvcc for sm_80 and sm_90 with the flags torch's CUDAExtension uses
#     (ptxas warns about register spills and local memory);
#   * every .cpp under a cuda/ folder (the bindings: ATen, c10/cuda, TORCH_LIBRARY_IMPL(.., CUDA,
#     ..)) is syntax-checked by the host compiler against torch's headers and the CUDA headers,
#     with ELMO_FAST_WITH_CUDA defined as setup.py defines it.
#
#   bash .ci/nvcc_check.sh              # every csrc/**/*.cu and csrc/**/cuda/*.cpp
#   bash .ci/nvcc_check.sh a.cu b.cpp   # these files (.cu -> nvcc, .cpp -> host syntax check)
#   bash .ci/nvcc_check.sh dir/         # the CUDA sources under dir
#
# Needs the project's venv active (torch's headers and flags come from the installed torch).
# Runs up to NVCC_CHECK_JOBS (default: nproc) compiles at once.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ "$#" -eq 0 ]; then
  set -- "$ROOT/csrc"
fi

files=()
for target in "$@"; do
  if [ -d "$target" ]; then
    while IFS= read -r -d '' f; do files+=("$f"); done < <(
      find "$target" -type f \( -name '*.cu' -o \( -name '*.cpp' -path '*/cuda/*' \) \) -print0 | sort -z)
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
CXX="${CXX:-g++}"
if ! command -v "$NVCC" >/dev/null 2>&1; then
  echo "nvcc check: ${#files[@]} CUDA source(s) but '$NVCC' is not on PATH" >&2
  exit 1
fi
# The CUDA headers of the toolkit that nvcc belongs to (bin/nvcc -> include/).
CUDA_INCLUDE="${CUDA_INCLUDE:-$(cd "$(dirname "$(command -v "$NVCC")")/.." && pwd)/include}"
if [ ! -f "$CUDA_INCLUDE/cuda_runtime_api.h" ]; then
  CUDA_INCLUDE=/usr/local/cuda/include
fi

# Torch's include dirs, Python's, the nvcc defines CUDAExtension adds (COMMON_NVCC_FLAGS) and the
# C++ ABI torch was built with, all read from the installed torch. Lines: "I <dir>", "N <flag>"
# (nvcc only), "D <flag>" (both).
if ! torch_flags="$(python - <<'EOF'
import sysconfig

import torch
from torch.utils import cpp_extension

for path in cpp_extension.include_paths() + [sysconfig.get_paths()["include"]]:
    print("I " + path)
for flag in cpp_extension.COMMON_NVCC_FLAGS:
    print("N " + flag)
print(f"D -D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}")
EOF
)"; then
  echo "nvcc check: cannot import torch; activate the project's venv first" >&2
  exit 1
fi
include_flags=()
nvcc_only=()
common_defs=()
while IFS= read -r line; do
  case "$line" in
    "I "*) include_flags+=(-isystem "${line#I }") ;;
    "N "*) nvcc_only+=("${line#N }") ;;
    "D "*) common_defs+=("${line#D }") ;;
  esac
done <<<"$torch_flags"

common=(
  # C++20 as setup.py: torch 2.13's headers need it (under c++17 they only pass as GCC extensions).
  -std=c++20
  "${include_flags[@]}"
  -I "$ROOT/csrc"
  "${common_defs[@]}"
  # torch's CPU wheel ships c10/cuda headers but not the generated c10/cuda/impl/cuda_cmake_macros.h.
  -DC10_CUDA_NO_CMAKE_CONFIGURE_FILE
  -DTORCH_API_INCLUDE_EXTENSION_H
  -DTORCH_EXTENSION_NAME=_C
  -DELMO_FAST_WITH_CUDA
)
# shellcheck disable=SC2054  # arch=...,code=... is one nvcc argument
nvcc_flags=(
  -c -O3 -lineinfo
  -gencode arch=compute_80,code=sm_80
  -gencode arch=compute_90,code=sm_90
  -Xptxas -warn-spills -Xptxas -warn-lmem-usage
  -Xcompiler -fPIC
  "${nvcc_only[@]}"
  "${common[@]}"
)
cxx_flags=(
  -fsyntax-only -Wall -Wextra -Wno-unused-parameter
  "${common[@]}"
  -isystem "$CUDA_INCLUDE"
)

echo "nvcc check: $("$NVCC" --version | grep -o "release [0-9.]*, V[0-9.]*" || true); $("$CXX" --version | head -n1)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# check INDEX FILE: compiles one file, writes its log to $tmp/INDEX.log and its status to $tmp/INDEX.rc.
check() {
  local i="$1" f="$2" start=$SECONDS rc=0
  case "$f" in
    *.cu) "$NVCC" "${nvcc_flags[@]}" "$f" -o "$tmp/$i.o" >"$tmp/$i.log" 2>&1 || rc=$? ;;
    *.cpp) "$CXX" "${cxx_flags[@]}" "$f" >"$tmp/$i.log" 2>&1 || rc=$? ;;
    *) echo "not a .cu or .cpp file" >"$tmp/$i.log"; rc=2 ;;
  esac
  echo "$rc $((SECONDS - start))" >"$tmp/$i.rc"
}

jobs_max="${NVCC_CHECK_JOBS:-$(nproc 2>/dev/null || echo 2)}"
start_all=$SECONDS
for i in "${!files[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do
    wait -n || true
  done
  check "$i" "${files[$i]}" &
done
wait

failed=0
for i in "${!files[@]}"; do
  f="${files[$i]}"
  read -r rc secs <"$tmp/$i.rc"
  tool=$([ "${f##*.}" = cu ] && echo "nvcc" || echo "$CXX -fsyntax-only")
  if [ "$rc" -eq 0 ]; then
    echo "nvcc check: ok   $f ($tool, ${secs}s)"
    cat "$tmp/$i.log"  # warnings, if any
  else
    echo "nvcc check: FAIL $f ($tool, exit $rc)" >&2
    cat "$tmp/$i.log" >&2
    failed=$((failed + 1))
  fi
done
if [ "$failed" -ne 0 ]; then
  echo "nvcc check: $failed of ${#files[@]} CUDA source(s) failed to compile" >&2
  exit 1
fi
echo "nvcc check: all ${#files[@]} CUDA source(s) compile (.cu for sm_80 and sm_90, .cpp syntax) in $((SECONDS - start_all))s"
