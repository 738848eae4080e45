#!/usr/bin/env bash
# Builds efccl.torch (the PyTorch backend) on its own, against the torch of a Python and a
# libefccl.so built elsewhere, into BUILD_DIR/python (use it with PYTHONPATH=BUILD_DIR/python).
#
#   python/torch_backend/build.sh [--python PY] [--library LIBEFCCL] [--build-dir DIR] [--jobs N]
#                                 [--debug-symbols]
#
# Defaults: python3, build/lib/libefccl.so, build-torch, all cores, an optimised build without
# symbols. --debug-symbols builds RelWithDebInfo with line tables (-O2 -g1), so that addr2line
# names the extension's frames in a crash backtrace (tests/torch/symbolize_crashtrace.py).
# CMake and Ninja are taken from PATH, else from beside PY (a virtual environment's bin/); without
# Ninja, make.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
python=python3
library="$repo/build/lib/libefccl.so"
build_dir="$repo/build-torch"
jobs="$(nproc)"
build_type=(-DCMAKE_BUILD_TYPE=Release)
while [[ $# -gt 0 ]]; do
  case "$1" in
    --python) python="$2"; shift 2 ;;
    --library) library="$2"; shift 2 ;;
    --build-dir) build_dir="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --debug-symbols)
      build_type=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG")
      shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "build.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
python="$(command -v "$python" || true)"
[[ -x "$python" ]] || { echo "build.sh: no Python interpreter '$python'" >&2; exit 2; }
[[ -f "$library" ]] || echo "build.sh: note: $library does not exist (EFCCL_LIBRARY can point elsewhere at run time)" >&2
library="$(cd "$(dirname "$library")" 2>/dev/null && pwd)/$(basename "$library")"
bindir="$(dirname "$python")"
find_tool() { command -v "$1" 2>/dev/null || { [[ -x "$bindir/$1" ]] && echo "$bindir/$1"; } || true; }
cmake="$(find_tool cmake)"
[[ -n "$cmake" ]] || { echo "build.sh: cmake not found in PATH or $bindir" >&2; exit 2; }
ninja="$(find_tool ninja)"
generator=()
if [[ -n "$ninja" ]]; then generator=(-G Ninja -DCMAKE_MAKE_PROGRAM="$ninja"); fi
if [[ -f "$build_dir/CMakeCache.txt" ]] && ! grep -q "CMAKE_HOME_DIRECTORY:INTERNAL=$repo/python/torch_backend" "$build_dir/CMakeCache.txt"; then
  echo "build.sh: $build_dir holds another build; choose another --build-dir" >&2; exit 2
fi
"$cmake" -S "$repo/python/torch_backend" -B "$build_dir" "${generator[@]}" \
  "${build_type[@]}" -DEFCCL_TORCH_PYTHON="$python" -DEFCCL_LIBRARY="$library"
"$cmake" --build "$build_dir" -j "$jobs"
echo "build.sh: efccl.torch built: PYTHONPATH=$build_dir/python (libefccl.so: $library)"
