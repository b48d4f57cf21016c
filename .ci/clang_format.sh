#!/usr/bin/env bash
# clang-format over csrc/ (C++ and CUDA sources; the style: csrc/.clang-format, Google's at 120 columns).
#
#   bash .ci/clang_format.sh         # check: lists each file that is not formatted, exit 1 if any
#   bash .ci/clang_format.sh --fix   # format them in place
#
# clang-format comes with the [test] extra (PyPI's clang-format wheel, pinned in setup.py: another release
# formats some lines differently); a clang-format on PATH of another release is refused rather than trusted.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WANT="$(sed -n 's/.*"clang-format==\([0-9.]*\)".*/\1/p' "$ROOT/setup.py")"
if ! command -v clang-format >/dev/null; then
  echo "clang-format: not found; pip install clang-format==$WANT (the [test] extra installs it)" >&2
  exit 2
fi
HAVE="$(clang-format --version | sed -n 's/.*version \([0-9.]*\).*/\1/p')"
if [ "$HAVE" != "$WANT" ]; then
  echo "clang-format: version $HAVE found, $WANT expected (pip install clang-format==$WANT)" >&2
  exit 2
fi
mapfile -d '' files < <(find "$ROOT/csrc" -type f \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) -print0 | sort -z)
if [ "${1:-}" = "--fix" ]; then
  clang-format -i "${files[@]}"
  echo "clang-format: formatted ${#files[@]} files under csrc/"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  if ! clang-format --dry-run --Werror "$f" >/dev/null 2>&1; then
    bad+=("${f#"$ROOT"/}")
  fi
done
if [ "${#bad[@]}" -ne 0 ]; then
  printf 'clang-format: not formatted: %s\n' "${bad[@]}" >&2
  echo "clang-format: run bash .ci/clang_format.sh --fix" >&2
  exit 1
fi
echo "clang-format: ${#files[@]} files under csrc/ formatted"
