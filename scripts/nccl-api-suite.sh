#!/usr/bin/env bash
# The NCCL API suite, run from the repository root on a GPU machine against a carried build
# folder: the gpu-labelled runtime tests, then (when nccl-tests/build exists in the repository
# root) every nccl-tests binary under LD_PRELOAD=libefccl.so and, for comparison, on the real
# NCCL. Logs go to $OUT (or ./nccl-api-suite-logs).
#   scripts/nccl-api-suite.sh [BUILD_DIR]     default: build
# Environment: NCCL_TESTS_ARGS (default "-g <all GPUs, at most 2> -b 8 -e 1G -f 4 -d all -o all -c 1"),
#   REAL_NCCL_LIB (the real libnccl.so.2's folder), SKIP_RUNTIME_TESTS=1, SKIP_NCCL_TESTS=1.
set -uo pipefail
build="${1:-build}"
log_dir="${OUT:-$PWD/nccl-api-suite-logs}"
mkdir -p "$log_dir"
status=0
note() { echo "== $*" | tee -a "$log_dir/summary.log"; }
run() {  # name, command...: output to the terminal and $log_dir/<name>.log; failures are counted
  local name="$1"; shift
  "$@" > >(tee "$log_dir/$name.log") 2>&1
  local rc=$?
  note "$name: exit $rc"
  [[ $rc -ne 0 ]] && status=1
  return 0
}

export NCCL_NVLS_ENABLE=0  # NVLink SHARP multicast stays off on the lent machines
lib="$PWD/$build/lib/libefccl.so"
[[ -f "$lib" ]] || { echo "no $lib: build the efccl target first" >&2; exit 2; }
nvidia-smi -L > "$log_dir/gpus.log" 2>&1 || true
ngpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || echo 0)

# 1. The runtime's own tests (gpu label; the cpu ones too, they are quick).
if [[ "${SKIP_RUNTIME_TESTS:-0}" != 1 ]]; then
  run runtime-tests-cpu ctest --test-dir "$build" -L cpu -R '^Runtime' --output-on-failure --timeout 600
  run runtime-tests-gpu ctest --test-dir "$build" -L gpu -R '^(AllShapes/)?Runtime' --output-on-failure --timeout 1800
fi

# 2. nccl-tests, efccl (LD_PRELOAD) against the real NCCL, same GPUs, same arguments.
tests_dir="$PWD/nccl-tests/build"
if [[ "${SKIP_NCCL_TESTS:-0}" != 1 && -d "$tests_dir" ]]; then
  real_nccl="${REAL_NCCL_LIB:-/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib}"
  g=$(( ngpus < 2 ? (ngpus < 1 ? 1 : ngpus) : 2 ))
  # nccl-tests' -d and -o take a name or "all" (every datatype / every operator, premulsum too).
  args="${NCCL_TESTS_ARGS:--g $g -b 8 -e 1G -f 4 -d all -o all -c 1}"
  for t in all_reduce all_gather reduce_scatter broadcast reduce alltoall gather scatter sendrecv; do
    bin="$tests_dir/${t}_perf"
    if [[ ! -x "$bin" ]]; then note "$t: $bin missing, skipped"; continue; fi
    # shellcheck disable=SC2086
    run "nccl-tests-$t-efccl" env LD_LIBRARY_PATH="$real_nccl:${LD_LIBRARY_PATH:-}" \
      LD_PRELOAD="$lib" EFCCL_DEBUG="${EFCCL_DEBUG:-WARN}" "$bin" $args
    # shellcheck disable=SC2086
    run "nccl-tests-$t-nccl" env LD_LIBRARY_PATH="$real_nccl:${LD_LIBRARY_PATH:-}" "$bin" $args
  done
  # One line per run: nccl-tests' own verdicts.
  grep -H -E "Out of bounds values|Avg bus bandwidth" "$log_dir"/nccl-tests-*.log \
    | tee "$log_dir/nccl-tests-summary.log" || true
  if grep -l "FAILED" "$log_dir"/nccl-tests-*-efccl.log > /dev/null 2>&1; then status=1; fi
elif [[ "${SKIP_NCCL_TESTS:-0}" != 1 ]]; then
  note "no $tests_dir: nccl-tests skipped (build NVIDIA/nccl-tests there to run them)"
fi
note "overall: $([[ $status -eq 0 ]] && echo PASS || echo FAIL)"
exit $status
