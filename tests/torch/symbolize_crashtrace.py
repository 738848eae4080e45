#!/usr/bin/env python3
"""Names the frames of crashtrace backtraces (tests/torch/crashtrace.c) in a log.

    python3 tests/torch/symbolize_crashtrace.py LOG [LOG ...]

Prints each "=== crashtrace" block of the logs again, every frame "#N <object>+0x<offset>" followed
by what addr2line says of <offset> - 1 in <object> (function, file:line, inlined callers), where
the object has symbols (the efccl.torch extension built with -g by run_gpu_checks.sh
--crash-trace, libefccl.so when built with them). Frames addr2line cannot name keep crashtrace's
own text. Needs binutils' addr2line; without it, says so and prints the blocks unchanged.
"""

import os
import re
import shutil
import subprocess
import sys

FRAME = re.compile(r"^\s*#(\d+) (\S+)\+0x([0-9a-fA-F]+) \((.*)\)\s*$")


def name_frame(addr2line, path, offset, cache):
    key = (path, offset)
    if key in cache:
        return cache[key]
    names = []
    if addr2line and os.path.isfile(path) and offset > 0:
        try:
            out = subprocess.run(
                [addr2line, "-f", "-C", "-i", "-e", path, hex(offset - 1)],
                capture_output=True, text=True, timeout=30, check=False).stdout.splitlines()
        except (OSError, subprocess.TimeoutExpired):
            out = []
        # Pairs of lines: function, file:line (the innermost inlined function first).
        for function, where in zip(out[0::2], out[1::2]):
            if function != "??" or not where.startswith("??"):
                names.append(f"{function} at {where}")
    cache[key] = names
    return names


def main(paths):
    addr2line = shutil.which("addr2line")
    if not addr2line:
        print("symbolize_crashtrace: addr2line not found (binutils); frames stay as printed")
    cache = {}
    found = False
    for log in paths:
        try:
            lines = open(log, errors="replace").read().splitlines()
        except OSError as e:
            print(f"symbolize_crashtrace: {log}: {e}")
            continue
        inside = False
        for line in lines:
            if line.startswith("=== crashtrace: pid"):
                inside = True
                found = True
                print(f"[{os.path.basename(log)}] {line}")
                continue
            if not inside:
                continue
            if line.startswith("=== crashtrace: end"):
                inside = False
                print(line)
                continue
            m = FRAME.match(line)
            if not m:
                print(line)
                continue
            number, path, offset, text = m.group(1), m.group(2), int(m.group(3), 16), m.group(4)
            names = name_frame(addr2line, path, offset, cache)
            short = os.path.basename(path)
            if names:
                print(f"  #{number} {short}+0x{offset:x}: " + "; inlined in ".join(names))
            else:
                print(f"  #{number} {short}+0x{offset:x} ({text})")
    if not found:
        print("symbolize_crashtrace: no crashtrace block in " + ", ".join(paths))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
