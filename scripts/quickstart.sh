#!/usr/bin/env bash
# The quick start's main job: install dependencies, build, then run every example program (and
# every MSCCL corpus file, when there is a corpus) on the host executor over a datatype/operator
# matrix, printing a verdict table. Exit status 0 only when every run passed.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
# The MSCCL corpus (not in the repository): checked below, and its tests run, when there is one.
corpus="${EFCCL_MSCCL_XML_DIR:-../shared/msccl-xml}"
corpus_option=()
if [ -d "$corpus" ]; then corpus_option=(-DEFCCL_MSCCL_XML_DIR="$(realpath "$corpus")"); fi
cmake -S . -B build "${corpus_option[@]}" >/dev/null
cmake --build build -j"$(nproc)"

files=(examples/ef/*.json)
if [ -d "$corpus" ]; then
  files+=("$corpus"/*.xml)
else
  echo "quickstart: no MSCCL corpus at $corpus (set EFCCL_MSCCL_XML_DIR=DIR to check one); examples only"
fi
echo
build/bin/efccl check "${files[@]}"
