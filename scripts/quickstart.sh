#!/usr/bin/env bash
# The quick start's main job: install dependencies, build, then run every example program and
# every MSCCL corpus file on the host executor over a datatype/operator matrix, printing a
# verdict table. Exit status 0 only when every run passed.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
cmake -S . -B build >/dev/null
cmake --build build -j"$(nproc)"

files=(examples/ef/*.json)
corpus="${EFCCL_MSCCL_XML_DIR:-../shared/msccl-xml}"
if [ -d "$corpus" ]; then
  files+=("$corpus"/*.xml)
else
  echo "quickstart: no MSCCL corpus at $corpus (set EFCCL_MSCCL_XML_DIR); examples only"
fi
echo
build/bin/efccl check "${files[@]}"
