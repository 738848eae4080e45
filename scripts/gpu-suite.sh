#!/usr/bin/env bash
# The GPU test suite, run from the repository root on a machine with GPUs, against a build
# folder configured and built elsewhere (cmake -S . -B build && cmake --build build).
#   scripts/gpu-suite.sh [BUILD_DIR]        logs also go to $OUT when it is set
set -euo pipefail
build="${1:-build}"
log_dir="${OUT:-}"
run() {  # run a command, teeing its output to $OUT/<name>.log when $OUT is set
  local name="$1"; shift
  if [[ -n "$log_dir" ]]; then "$@" 2>&1 | tee "$log_dir/$name.log"; return "${PIPESTATUS[0]}"; fi
  "$@"
}
[[ -n "$log_dir" ]] && mkdir -p "$log_dir"
run gpus nvidia-smi -L
run topology nvidia-smi topo -m
# NVLink SHARP multicast stays off on the lent machines (see the device notes).
export NCCL_NVLS_ENABLE=0
# The tests find examples and the MSCCL corpus here, wherever this copy of the tree lives.
export EFCCL_SOURCE_DIR="${EFCCL_SOURCE_DIR:-$PWD}"
for corpus in shared/msccl-xml ../shared/msccl-xml; do
  if [[ -z "${EFCCL_MSCCL_XML_DIR:-}" && -d "$corpus" ]]; then export EFCCL_MSCCL_XML_DIR="$PWD/$corpus"; fi
done
run ctest ctest --test-dir "$build" -L gpu --output-on-failure --timeout 1200
