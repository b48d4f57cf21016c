#!/usr/bin/env bash
# The CUDA kernels on the CPU emulator under ThreadSanitizer, to find races and missing __syncthreads()
# that the default shuffled schedule may miss. Too slow for CI's test command (a build of its own, every
# CUDA thread a host thread); run it by hand after changing a kernel:
#
#   bash .ci/emulator_tsan.sh            # needs the project's venv active, gcc's libtsan and the CUDA headers
#
# The emulator is built with -fsanitize=thread (tests/cuda_emulation/build.py, ELMO_FAST_EMULATION_TSAN=1)
# and run with ELMO_FAST_EMULATION_SCHEDULE=threads: the threads of a block run at once and
# __syncthreads() is a real barrier, so TSan reports any two accesses to the same memory, one a write,
# that no barrier orders. Two steps:
#   1. the test-only kernel with a missing barrier (elmo_fast_emu_test.neighbour_read(broken=True)) must
#      be reported: this shows the tool is working here;
#   2. every kernel of the project, through one emulated test each (small shapes: under TSan every CUDA
#      thread is a host thread and every access is instrumented), must run without a report; or the
#      tests named as arguments:  bash .ci/emulator_tsan.sh 'tests/bilm/test_highway_cuda.py::test_x[emulated-...]' ...
# Python and torch are not instrumented: TSan sees the kernels' and bindings' accesses only.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

TSAN_LIB="$(gcc -print-file-name=libtsan.so)"
if [ ! -f "$TSAN_LIB" ]; then
  echo "emulator tsan: gcc has no libtsan.so here ($TSAN_LIB); install libtsan (e.g. apt-get install libtsan2)" >&2
  exit 2
fi
export ELMO_FAST_EMULATION_TSAN=1 ELMO_FAST_EMULATION_SCHEDULE=threads OMP_NUM_THREADS=1
export TSAN_OPTIONS="exitcode=66 report_signal_unsafe=0 ${TSAN_OPTIONS:-}"
# A kernel with a large memory-mapping entropy makes older TSan runtimes fail at start ("unexpected memory
# mapping"): without address-space randomization they run.
run() { setarch "$(uname -m)" -R env LD_PRELOAD="$TSAN_LIB" "$@"; }

echo "=== emulator tsan: build (a first build takes a few minutes)"
# The python that builds and loads the library runs with the TSan runtime preloaded; the compiler must not.
run python -c "import os, sys; os.environ.pop('LD_PRELOAD'); sys.path.insert(0, 'tests')
from cuda_emulation.build import load_emulation; load_emulation()"

echo "=== emulator tsan: 1. a missing __syncthreads() must be reported"
rc=0
run python - <<'EOF' >/tmp/emulator_tsan_race.log 2>&1 || rc=$?
import sys
sys.path.insert(0, "tests")
import torch
from cuda_emulation.build import load_emulation
load_emulation()
torch.ops.elmo_fast_emu_test.neighbour_read(True)
EOF
if [ "$rc" -ne 66 ] || ! grep -q "WARNING: ThreadSanitizer: data race" /tmp/emulator_tsan_race.log; then
  cat /tmp/emulator_tsan_race.log >&2
  echo "=== emulator tsan: FAILED: the broken kernel's race was not reported (exit $rc)" >&2
  exit 1
fi
grep -m1 -A3 "WARNING: ThreadSanitizer: data race" /tmp/emulator_tsan_race.log
echo "=== emulator tsan: reported, as it must be"

echo "=== emulator tsan: 2. the project's kernels must run without a report"
if [ "$#" -eq 0 ]; then
  set -- \
    "tests/bilm/test_highway_cuda.py::test_highway_gate[emulated-7-16-sliced-torch.float32]" \
    "tests/bilm/test_highway_cuda.py::test_highway_gate[emulated-129-257-sliced-torch.bfloat16]" \
    "tests/bilm/test_highway_cuda.py::test_highway_gate_backward[emulated-7-16-contiguous-torch.bfloat16]" \
    "tests/bilm/test_char_cnn_cuda.py::test_char_cnn_other_token_lengths[emulated-65]" \
    "tests/bilm/test_char_cnn_cuda.py::test_char_cnn_other_token_lengths[emulated-513]" \
    "tests/bilm/test_char_cnn_cuda.py::test_char_cnn_backward_other_token_lengths[emulated-7]" \
    "tests/bilm/test_lstm_cuda.py::test_bilstm_float32[emulated-states-clips-unsorted_with_empty_rows]" \
    "tests/bilm/test_lstm_cuda.py::test_lstm_layer_token_index[emulated-repeated-torch.float32]" \
    "tests/bilm/test_cuda_emulator.py::test_plans_upload_without_pinned_memory_under_capture[1000]"
fi
rc=0
ELMO_FAST_CUDA_EMULATION=1 run python -m pytest -q -p no:cacheprovider "$@" || rc=$?
if [ "$rc" -ne 0 ]; then
  echo "=== emulator tsan: FAILED (exit $rc; 66: ThreadSanitizer reports above)" >&2
  exit 1
fi
echo "=== emulator tsan: no race in the kernels"
