#!/usr/bin/env bash
# The balancer's GPU checks (issue 18 items 3 and 6), on one machine, in under 8 minutes:
#   1. runtime_balanced_transfer_test (CPU): balanced programs verified on the host executor;
#   2. runtime_balance_test (GPU 0): balanced all-to-all-v, batch_isend_irecv-like groups,
#      ncclAlltoAll and lone pairs, eager and captured, in one process and across two, with
#      relays and the host path asserted from the statistics;
#   3. torchrun --nproc_per_node 2 and 4, ranks on GPU 0 under MPS, ProcessGroupNCCL under
#      LD_PRELOAD=build/lib/libefccl.so: torch_collectives.py's all-to-all and point-to-point
#      checks (skewed uneven all_to_all_single, eager and in a CUDA graph) with the balancer
#      planning on nimble-h100 (EFCCL_BALANCE_TOPOLOGY) and EFCCL_DEBUG=INFO
#      EFCCL_DEBUG_SUBSYS=BALANCE: the log must show multi-path plans;
#   4. with 2-4 GPUs: balance_bench — a lone pair GPU 0 -> GPU 1 with the balancer off and on
#      (algbw), and a skewed all-to-all-v off/on with measured against predicted time
#      (NCCL_NVLS_ENABLE=0).
# Run from the repository root with build/ in place; it needs build/lib/libefccl.so and
# build/bin/{runtime_balance_test,runtime_balanced_transfer_test,balance_bench}.
#
#   tests/runtime/run_gpu_balance.sh [--python /opt/torch/.venv/bin/python]
#
# Prints PASS/FAIL per step with its numbers and a summary; exit status 0 when all passed.
set -uo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo"
python="${PYTHON:-/opt/torch/.venv/bin/python}"
if [[ "${1:-}" == "--python" ]]; then python="$2"; fi
[[ -x "$python" ]] || python="$(command -v python3)"
library="$repo/build/lib/libefccl.so"
budget=460
started=$(date +%s)
logs="$(mktemp -d /tmp/efccl-balance-checks.XXXXXX)"
summary=()
failures=0

elapsed() { echo $(( $(date +%s) - started )); }
say() { printf '%s\n' "$*"; }

say "efccl balancer GPU checks — $(date -u '+%Y-%m-%d %H:%M UTC'), repo $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo '?'), logs in $logs"
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/  GPU /'
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
for f in "$library" build/bin/runtime_balance_test build/bin/runtime_balanced_transfer_test build/bin/balance_bench; do
  if [[ ! -e "$f" ]]; then
    say "FAIL setup: $f is missing (ninja -C build efccl runtime_balance_test runtime_balanced_transfer_test balance_bench)"
    exit 1
  fi
done

# Processes sharing a GPU want MPS (without it their kernels time-slice: correct, slow).
if command -v nvidia-cuda-mps-control > /dev/null; then
  if pgrep -x nvidia-cuda-mps-control > /dev/null || pgrep -x nvidia-cuda-mps-server > /dev/null; then
    say "MPS: a daemon is already running; using it"
  else
    export CUDA_MPS_PIPE_DIRECTORY="$logs/mps-pipe" CUDA_MPS_LOG_DIRECTORY="$logs/mps-log"
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    if nvidia-cuda-mps-control -d; then
      trap 'echo quit | CUDA_MPS_PIPE_DIRECTORY="$CUDA_MPS_PIPE_DIRECTORY" nvidia-cuda-mps-control > /dev/null 2>&1' EXIT
      say "MPS: private daemon started"
    else
      unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
      say "MPS: the daemon did not start; ranks sharing the GPU time-slice (slow)"
    fi
  fi
fi
unset LD_PRELOAD EFCCL_BALANCE EFCCL_BALANCE_TOPOLOGY EFCCL_BALANCE_FORCE EFCCL_BALANCE_STATS \
  EFCCL_BALANCE_MIN_BYTES EFCCL_DEBUG EFCCL_DEBUG_SUBSYS NCCL_DEBUG
export OMP_NUM_THREADS=1

# run_step NAME LIMIT COMMAND...: output shown and logged; PASS/FAIL with its time. A step
# whose log has a line "NUMBERS: ..." shows it in the summary.
run_step() {
  local name="$1" limit="$2"; shift 2
  local left=$(( budget - $(elapsed) ))
  if (( left < 20 )); then
    summary+=("NOT RUN  $name (the time budget is spent)"); failures=$((failures + 1)); return 1
  fi
  (( limit > left )) && limit=$left
  local log="$logs/$(echo "$name" | tr -c 'A-Za-z0-9' '_').log"
  say ""; say "=== $name (limit ${limit} s) ==="
  local t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" > "$log" 2>&1
  local rc=$?
  tail -n 40 "$log"
  local took=$(( $(date +%s) - t0 ))
  local detail
  detail="$(grep -h '^NUMBERS: \|^SUMMARY rank 0: \|^\[  PASSED  \]\|tests, listed below' "$log" | tail -2 | tr '\n' ' ')"
  if (( rc == 0 )); then
    summary+=("PASS     $name (${took} s) $detail")
  else
    local why="exit status $rc"
    (( rc == 124 || rc == 137 )) && why="killed at its ${limit} s limit"
    summary+=("FAIL     $name (${took} s, $why) $detail")
    failures=$((failures + 1))
  fi
  return $rc
}

# 1-2. The tests (the two-process test forks before touching CUDA: a process of its own).
run_step "runtime_balanced_transfer_test (CPU)" 60 build/bin/runtime_balanced_transfer_test
run_step "runtime_balance_test, one process, ranks on GPU 0" 150 \
  env CUDA_VISIBLE_DEVICES=0 build/bin/runtime_balance_test --gtest_filter='-*TwoProcesses*'
run_step "runtime_balance_test, two processes on GPU 0" 120 \
  env CUDA_VISIBLE_DEVICES=0 build/bin/runtime_balance_test --gtest_filter='*TwoProcesses*'
for log in "$logs"/runtime_balance_test*.log; do
  if grep -q '\[  SKIPPED \]' "$log"; then
    summary+=("FAIL     $(basename "$log"): a test SKIPPED (a skip is not a pass)"); failures=$((failures + 1))
  fi
done

# 3. torchrun, ranks on GPU 0, the balancer planning on nimble-h100 (relays and the host path).
# torch_step N [efccl]: ProcessGroupNCCL under LD_PRELOAD, or (efccl) efccl's own backend.
torch_step() {
  local n="$1" backend="${2:-nccl}"
  local log="$logs/torchrun_${backend}_$n.out"
  local how=(env LD_PRELOAD="$library")
  [[ "$backend" == efccl ]] && how=(env PYTHONPATH="$repo/build-torch/python" EFCCL_LIBRARY="$library")
  run_step "torchrun --nproc_per_node $n, ranks on GPU 0, $backend backend, balancer on (nimble-h100)" 150 \
    "${how[@]}" CUDA_VISIBLE_DEVICES=0 EFCCL_BALANCE_TOPOLOGY=preset:nimble-h100 \
      EFCCL_BALANCE_MIN_BYTES=262144 EFCCL_DEBUG=INFO EFCCL_DEBUG_SUBSYS=BALANCE \
      EFCCL_DEBUG_FILE="$log.%p" \
      "$python" -m torch.distributed.run --standalone --nproc_per_node="$n" \
      tests/torch/torch_collectives.py --backend "$backend" --only all_to_all,batch_isend,send/recv
  local plans multi
  plans=$(cat "$log".* 2>/dev/null | grep -c 'balance plan #[0-9]* (.*, new)' || true)
  multi=$(cat "$log".* 2>/dev/null | grep -E -c 'over [2-9] paths' || true)
  say "  BALANCE log: $plans new plan(s), $multi transfer(s) over several paths; for example:"
  cat "$log".* 2>/dev/null | grep -E 'over [2-9] paths' | head -3 | sed 's/^/    /'
  if (( multi > 0 )); then
    summary+=("PASS     torchrun $n ranks ($backend): EFCCL_DEBUG=INFO shows $plans plan(s), $multi multi-path transfer(s)")
  else
    summary+=("FAIL     torchrun $n ranks ($backend): no multi-path plan in the BALANCE log ($log.*)"); failures=$((failures + 1))
  fi
}
torch_step 2
torch_step 4
# efccl's own torch backend, where tests/torch/run_gpu_checks.sh has built it (optional).
if [[ -d build-torch/python/efccl ]]; then
  torch_step 2 efccl
else
  summary+=("NOT RUN  (optional) torch_collectives.py --backend efccl: build-torch/python is absent (tests/torch/run_gpu_checks.sh builds it)")
fi

# 4. Real GPUs: a lone pair and a skewed all-to-all-v, off and on, on the machine's own graph.
if (( gpus >= 2 )); then
  run_step "balance_bench on $gpus GPUs (machine graph), NCCL_NVLS_ENABLE=0" 150 \
    env NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH="$repo/build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
      build/bin/balance_bench --sizes 64M,256M,1G --iters 10 --hot 512M --cold 16M
else
  summary+=("NOT RUN  balance_bench: needs 2-4 GPUs, $gpus here")
fi

say ""
say "==================== SUMMARY ($(elapsed) s) ===================="
printf '%s\n' "${summary[@]}"
say "RESULT: $([[ $failures -eq 0 ]] && echo "ALL PASSED" || echo "$failures step(s) FAILED or NOT RUN")"
exit $(( failures > 0 ))
