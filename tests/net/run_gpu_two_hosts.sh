#!/usr/bin/env bash
# Communicators spanning hosts on one GPU machine (issue 20's acceptance): processes claim hosts
# of their own through NCCL_HOSTID, so their ranks meet only through efccl's network connections
# (the socket proxies, pinned host memory at both ends), every rank on GPU 0 under a private MPS
# daemon. Runs, in this order:
#   1. the GPU tests: build/bin/runtime_multihost_test (every collective and send/recv exact,
#      LL, LL128, 2 x 2 ranks through the hierarchical programs, a peer killed mid-transfer) and
#      build/bin/runtime_network_links_gpu_test;
#   2. EFCCL_DEBUG=INFO evidence: the network connections of a 2-host all_reduce (NET lines);
#   3. nccl-tests (MPI=1 against build/mpishim; binaries in nccl-tests/build or nccl-tests):
#      efccl-mprun -n 2 --hosts 2 and -n 4 --hosts 2 over all nine collectives,
#      `-d all -c 1 -b 8 -e 256M -f 8 -g 1 -n 2 -w 1`, NCCL_TESTS_DEVICE=0, #wrong summarised;
#   4. tests/torch/torch_collectives.py under LD_PRELOAD=libefccl.so, 2 processes as 2 hosts.
# Prints a PASS/FAIL summary; finishes within about 8 minutes (what would not fit is NOT RUN);
# leaves nothing running (the MPS daemon is told to quit, every step runs under a time limit).
#
#   tests/net/run_gpu_two_hosts.sh [--python PATH] [--steps LIST]   (from anywhere; works in the repo root)
#
# --steps LIST runs only the named steps, comma-separated, of: tests, debug, nccl-tests, torch
# (default: all four). A step left out is reported as NOT RUN (and the result is not ALL PASSED).
#
# Environment: NCCL_TESTS_DIR (default: nccl-tests/build, else nccl-tests), PYTHON.
# Exit status 0 when every step passed. Logs stay in the directory printed at the start.
set -uo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo" || exit 1
python="${PYTHON:-/opt/torch/.venv/bin/python}"
[[ -x "$python" ]] || python="$(command -v python3 || echo python3)"
steps="tests,debug,nccl-tests,torch"
while (( $# )); do
  case "$1" in
    --python) [[ $# -ge 2 ]] || { echo "--python needs a path" >&2; exit 2; }; python="$2"; shift 2 ;;
    --steps) [[ $# -ge 2 ]] || { echo "--steps needs a list" >&2; exit 2; }; steps="$2"; shift 2 ;;
    *) echo "unknown argument '$1' (usage: $0 [--python PATH] [--steps tests,debug,nccl-tests,torch])" >&2; exit 2 ;;
  esac
done
for s in ${steps//,/ }; do
  case "$s" in tests|debug|nccl-tests|torch) ;; *) echo "unknown step '$s' in --steps (tests, debug, nccl-tests, torch)" >&2; exit 2 ;; esac
done
wanted() { [[ ",$steps," == *",$1,"* ]]; }
budget=465  # seconds for everything (the limit is 8 minutes)
started=$(date +%s)
logs="$(mktemp -d /tmp/efccl-two-hosts.XXXXXX)"
summary=()
failures=0
for s in tests debug nccl-tests torch; do
  wanted "$s" || { summary+=("NOT RUN  step '$s' (left out by --steps)"); failures=$((failures + 1)); }
done
mprun="$repo/build/bin/efccl-mprun"
library="$repo/build/lib/libefccl.so"

elapsed() { echo $(( $(date +%s) - started )); }
say() { printf '%s\n' "$*"; }

say "efccl across two hosts on one GPU — $(date -u '+%Y-%m-%d %H:%M UTC'), repo $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo '?')"
say "logs: $logs"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/GPU: /'
for f in "$mprun" "$library" "$repo/build/bin/runtime_multihost_test"; do
  if [[ ! -e "$f" ]]; then
    say "FAIL setup: $f is missing (ninja -C build efccl efccl_mprun efccl_mpishim runtime_multihost_test runtime_network_links_gpu_test)"
    exit 1
  fi
done

# A private MPS daemon: processes sharing the GPU run side by side instead of time-slicing.
mps_started=0
stop_mps() {
  if (( mps_started )); then
    echo quit | nvidia-cuda-mps-control > /dev/null 2>&1
    for _ in $(seq 50); do
      pgrep -u "$(id -u)" -x nvidia-cuda-mps-server > /dev/null 2>&1 || break
      sleep 0.1
    done
    mps_started=0
  fi
}
trap stop_mps EXIT
trap 'stop_mps; exit 130' INT TERM
if command -v nvidia-cuda-mps-control > /dev/null; then
  if pgrep -x nvidia-cuda-mps-control > /dev/null; then
    say "MPS: a daemon is already running; using it"
  else
    export CUDA_MPS_PIPE_DIRECTORY="$logs/mps-pipe" CUDA_MPS_LOG_DIRECTORY="$logs/mps-log"
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    if nvidia-cuda-mps-control -d; then
      mps_started=1
      say "MPS: private daemon started (pipe $CUDA_MPS_PIPE_DIRECTORY)"
    else
      unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
      say "MPS: the daemon did not start; the processes will time-slice the GPU (slow)"
    fi
  fi
else
  say "MPS: nvidia-cuda-mps-control not found; the processes will time-slice the GPU (slow)"
fi
unset LD_PRELOAD NCCL_HOSTID EFCCL_TIMEOUT_MS EFCCL_DEBUG NCCL_DEBUG NCCL_PROTO
export OMP_NUM_THREADS=1

# run_step NAME LIMIT COMMAND...: runs COMMAND (output shown and logged) within LIMIT seconds
# and the budget; sets step_log, step_rc, step_took and step_why for the checks that follow.
run_step() {
  local name="$1" limit="$2"; shift 2
  local left=$(( budget - $(elapsed) ))
  if (( left < 20 )); then
    summary+=("NOT RUN  $name (the time budget is spent)"); failures=$((failures + 1)); return 1
  fi
  (( limit > left )) && limit=$left
  step_log="$logs/$(echo "$name" | tr -c 'A-Za-z0-9' '_' | cut -c1-80).log"
  say ""; say "=== $name (limit ${limit} s) ==="
  local t0
  t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" > "$step_log" 2>&1
  local rc=$?
  tail -n 25 "$step_log"
  step_took=$(( $(date +%s) - t0 ))
  step_rc=$rc
  if (( rc == 124 || rc == 137 )); then step_why="killed at its ${limit} s limit"; else step_why="exit status $rc"; fi
  return $rc
}
record() {  # record PASS|FAIL NAME DETAIL
  summary+=("$(printf '%-8s %s (%s s)%s' "$1" "$2" "$step_took" "${3:+ — $3}")")
  [[ "$1" == PASS ]] || failures=$((failures + 1))
}

# 1. The GPU tests (a skipped test is not a pass).
gtest_step() {  # gtest_step NAME LIMIT BINARY
  local name="$1" limit="$2" binary="$3"
  if [[ ! -x "$binary" ]]; then
    summary+=("FAIL     $name (missing: $binary)"); failures=$((failures + 1)); return
  fi
  run_step "$name" "$limit" "$binary"
  local passed skipped
  passed=$(grep -h -o -E '^\[  PASSED  \] [0-9]+ tests?' "$step_log" | grep -o -E '[0-9]+' | tail -1)
  skipped=$(grep -h -o -E '^\[  SKIPPED \] [0-9]+ tests?' "$step_log" | grep -o -E '[0-9]+' | tail -1)
  if (( step_rc == 0 && ${skipped:-0} == 0 )); then
    record PASS "$name" "${passed:-0} passed"
  else
    record FAIL "$name" "$step_why, ${passed:-0} passed, ${skipped:-0} skipped; $(grep -h -E '^\[  FAILED  \] [A-Z]|check failed' "$step_log" | head -4 | tr '\n' ' ')"
  fi
}
if wanted tests; then
  gtest_step "GPU tests: runtime_multihost_test (2 and 4 processes as 2 hosts on GPU 0)" 180 \
    "$repo/build/bin/runtime_multihost_test"
  grep -h "the peer's death surfaced" "$step_log" 2>/dev/null | sed 's/^/  /'
  gtest_step "GPU tests: runtime_network_links_gpu_test" 60 "$repo/build/bin/runtime_network_links_gpu_test"
fi

# nccl-tests.
tests_dir="${NCCL_TESTS_DIR:-}"
if [[ -z "$tests_dir" ]]; then
  for d in "$repo/nccl-tests/build" "$repo/nccl-tests"; do
    [[ -x "$d/all_reduce_perf" ]] && { tests_dir="$d"; break; }
  done
fi
nccl_env=(env LD_LIBRARY_PATH="$repo/build/mpishim/lib:$repo/build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
          NCCL_TESTS_DEVICE=0)

if wanted debug; then
# 2. The network connections, as EFCCL_DEBUG=INFO shows them (INIT and NET).
name="EFCCL_DEBUG=INFO: the network connections of 2 processes as 2 hosts"
if [[ -n "$tests_dir" ]]; then
  run_step "$name" 60 "${nccl_env[@]}" EFCCL_DEBUG=INFO EFCCL_DEBUG_SUBSYS=INIT,NET,TUNING \
    "$mprun" -n 2 --hosts 2 --timeout 55 -- "$tests_dir/all_reduce_perf" -b 8M -e 8M -g 1 -n 2 -w 1 -c 1
else
  run_step "$name" 60 env EFCCL_DEBUG=INFO EFCCL_DEBUG_SUBSYS=INIT,NET,TUNING \
    "$repo/build/bin/runtime_multihost_test" --gtest_filter='*OneRankPerHost'
fi
net_lines=$(grep -c 'via NET/Socket' "$step_log" 2>/dev/null); net_lines=${net_lines:-0}
say "--- evidence (NET lines: $net_lines):"
grep -h -E 'nNodes 2|spans 2 hosts|via NET/Socket|network connections:' "$step_log" | head -12 | sed 's/^/  /'
if (( step_rc == 0 && net_lines > 0 )) && grep -q 'nNodes 2' "$step_log"; then
  record PASS "$name" "$net_lines 'via NET/Socket' lines, nNodes 2"
else
  record FAIL "$name" "$step_why, $net_lines NET lines"
fi
fi  # debug

if wanted nccl-tests; then
# 3. nccl-tests: all nine collectives, 2 and 4 processes as 2 hosts.
colls=(all_reduce reduce_scatter all_gather broadcast reduce alltoall gather scatter sendrecv)
if [[ -z "$tests_dir" ]]; then
  summary+=("FAIL     nccl-tests: no all_reduce_perf in nccl-tests/build or nccl-tests (NCCL_TESTS_DIR)")
  failures=$((failures + 1))
else
  for n in 2 4; do
    for c in "${colls[@]}"; do
      name="nccl-tests $c, efccl-mprun -n $n --hosts 2"
      run_step "$name" 75 "${nccl_env[@]}" "$mprun" -n "$n" --hosts 2 --timeout 70 -- \
        "$tests_dir/${c}_perf" -d all -c 1 -b 8 -e 256M -f 8 -g 1 -n 2 -w 1
      rc=$step_rc
      # nccl-tests' verdict: "Out of bounds values : N OK|FAILED"; rows: count the data rows.
      oob=$(grep -h -o 'Out of bounds values : [0-9]*' "$step_log" | tail -1 | grep -o '[0-9]*$')
      rows=$(grep -c -E '^\[0\] +[0-9]+ +[0-9]+ +[a-z0-9_]+ ' "$step_log")
      if (( rc == 0 )) && [[ "${oob:-x}" == 0 ]]; then
        record PASS "$name" "#wrong 0 over $rows rows"
      else
        record FAIL "$name" "$step_why, #wrong ${oob:-unknown} over $rows rows"
        say "--- $c -n $n failed; its log: $step_log"
      fi
    done
  done
fi
fi  # nccl-tests

if wanted torch; then
# 4. The torch script under LD_PRELOAD, 2 processes as 2 hosts (efccl-mprun sets RANK,
# WORLD_SIZE, LOCAL_RANK (0 on each host: GPU 0), MASTER_ADDR/PORT and NCCL_HOSTID per rank).
name="torch_collectives.py under LD_PRELOAD, efccl-mprun -n 2 --hosts 2"
if run_step "$name" 150 "$mprun" -n 2 --hosts 2 --timeout 145 -- \
    env LD_PRELOAD="$library" "$python" tests/torch/torch_collectives.py; then
  record PASS "$name" "$(grep -h 'SUMMARY' "$step_log" | tail -1)"
else
  record FAIL "$name" "$step_why; $(grep -h -E 'SUMMARY|FAIL ' "$step_log" | head -3 | tr '\n' ' ')"
fi
fi  # torch

stop_mps
leftover=$(pgrep -u "$(id -u)" -f -x '.*(_perf|runtime_multihost_test|torch_collectives.py).*' 2>/dev/null | wc -l)
say ""
say "==================== SUMMARY ($(elapsed) s in all) ===================="
printf '%s\n' "${summary[@]}"
say "processes left running by this script: $leftover"
say "RESULT: $([[ $failures -eq 0 ]] && echo "ALL PASSED" || echo "$failures step(s) FAILED or NOT RUN")"
exit $(( failures > 0 ))
