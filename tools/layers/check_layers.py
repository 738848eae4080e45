#!/usr/bin/env python3
"""Fails when an #include points against the layer order (docs/design.md, "Layers").

Top-level layers, lowest first; a file may include headers of its own layer and of the layers
listed as below it:
  common                      Status, logger, hash
  ef_format                   program model, JSON/XML, validation, compiler, algorithm library
  topology                    the machine as a graph (no CUDA), presets, NCCL XML, detection
  interpreter/host            the reference executor and the timing model
  net                         sockets and the bootstrap (no CUDA)
  interpreter/device          the CUDA interpreter
  runtime                     the NCCL API, in its own one-way sub-layers (below)
Inside runtime/src: api -> comm -> fallback -> enqueue -> launch -> select -> base (a sub-layer
includes itself and those to its right).

Also fails when a source file of runtime/, net/ or interpreter/ exceeds the line budget.
Usage: check_layers.py [REPO_ROOT]   (exit 0: clean; 1: violations, each printed)
"""
import os
import re
import sys

LAYERS = {  # layer -> layers it may include (besides itself)
    "common": set(),
    "ef_format": {"common"},
    "topology": {"common", "ef_format"},
    "interpreter/host": {"common", "ef_format", "topology"},
    "net": {"common"},
    "interpreter/device": {"common", "ef_format", "topology", "interpreter/host"},
    "runtime": {"common", "ef_format", "topology", "interpreter/host", "interpreter/device",
                "net"},
}
RUNTIME_ORDER = ["api", "comm", "fallback", "enqueue", "launch", "select", "base"]
# Public include prefixes and the layer that owns them.
PUBLIC = [
    ("efccl/common/", "common"),
    ("efccl/ef/", "ef_format"),
    ("efccl/compiler/", "ef_format"),
    ("efccl/algorithms/", "ef_format"),
    ("efccl/topology/", "topology"),
    ("efccl/balance/", "topology"),
    ("efccl/host/", "interpreter/host"),
    ("efccl/device/", "interpreter/device"),
    ("efccl/net/", "net"),
    ("efccl/runtime/", "runtime"),
    ("efccl/mprun/", "tools"),
]
SOURCE_EXTENSIONS = (".h", ".cc", ".cu", ".cuh")
MAX_LINES = 800
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def layer_of(path):
    """The top-level layer of a repository-relative path (None: not layered)."""
    for layer in ("interpreter/host", "interpreter/device"):
        if path.startswith(layer + "/"):
            return layer
    top = path.split("/", 1)[0]
    if top == "ef_format":
        return "ef_format"
    return top if top in LAYERS else None


def runtime_sublayer(path):
    """api, comm, ... for runtime/src/<sub>/...; None elsewhere."""
    parts = path.split("/")
    if len(parts) >= 4 and parts[0] == "runtime" and parts[1] == "src":
        return parts[2] if parts[2] in RUNTIME_ORDER else None
    return None


def check_file(root, path, problems):
    layer = layer_of(path)
    sub = runtime_sublayer(path)
    with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
        lines = f.readlines()
    if layer in ("runtime", "net", "topology", "interpreter/host", "interpreter/device") and len(lines) > MAX_LINES:
        problems.append(f"{path}: {len(lines)} lines, more than the {MAX_LINES} a source file may have")
    for number, line in enumerate(lines, 1):
        m = INCLUDE.match(line)
        if not m:
            continue
        target = m.group(1)
        where = f"{path}:{number}: #include \"{target}\""
        owner = next((l for prefix, l in PUBLIC if target.startswith(prefix)), None)
        if owner is not None:
            if owner != layer and owner not in LAYERS.get(layer, set()):
                problems.append(f"{where}: layer {layer} may not include layer {owner}")
            continue
        first = target.split("/", 1)[0]
        if layer == "runtime" and first in RUNTIME_ORDER:
            if sub is None:
                continue  # runtime/include or tests: may use every sub-layer
            if RUNTIME_ORDER.index(first) < RUNTIME_ORDER.index(sub):
                problems.append(f"{where}: runtime/{sub} may not include runtime/{first} "
                                f"(order: {' -> '.join(RUNTIME_ORDER)})")


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), "..", ".."))
    problems = []
    for top in ("common", "ef_format", "topology", "interpreter", "net", "runtime"):
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames.sort()
            for name in sorted(filenames):
                if name.endswith(SOURCE_EXTENSIONS):
                    rel = os.path.relpath(os.path.join(dirpath, name), root)
                    check_file(root, rel, problems)
    for p in problems:
        print(p)
    if problems:
        print(f"check_layers: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print("check_layers: every include follows the layer order")
    return 0


if __name__ == "__main__":
    sys.exit(main())
