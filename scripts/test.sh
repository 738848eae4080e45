#!/usr/bin/env bash
# Runs the test suite of an existing build (scripts/quickstart.sh builds one). GPU tests carry
# the ctest label `gpu` and skip, saying why, on machines without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d build ] || { cmake -S . -B build >/dev/null && cmake --build build -j"$(nproc)"; }
cmake --build build -j"$(nproc)"
ctest --test-dir build --output-on-failure -j"$(nproc)" "$@"
