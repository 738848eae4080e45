#!/usr/bin/env python3
"""tools/layers/check_layers.py: a clean tree passes; includes against the order, and oversized
sources, are each reported with file, line and rule."""
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
CHECKER = os.path.join(HERE, "..", "..", "tools", "layers", "check_layers.py")


def write(root, path, text):
    full = os.path.join(root, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w") as f:
        f.write(text)


def run(root):
    p = subprocess.run([sys.executable, CHECKER, root], capture_output=True, text=True)
    return p.returncode, p.stdout


class CheckLayers(unittest.TestCase):
    def tree(self):
        d = tempfile.TemporaryDirectory()
        self.addCleanup(d.cleanup)
        write(d.name, "common/include/efccl/common/status.h", "#pragma once\n")
        write(d.name, "ef_format/src/program.cc", '#include "efccl/common/status.h"\n')
        write(d.name, "net/src/socket.cc", '#include "efccl/common/log.h"\n')
        write(d.name, "runtime/src/launch/call.h", '#include "select/tuning.h"\n#include "base/x.h"\n')
        write(d.name, "runtime/src/api/api.cc",
              '#include "launch/call.h"\n#include "efccl/net/bootstrap.h"\n')
        return d.name

    def test_a_clean_tree_passes(self):
        code, out = run(self.tree())
        self.assertEqual(code, 0, out)

    def test_an_upward_include_between_top_level_layers_fails(self):
        root = self.tree()
        write(root, "ef_format/src/bad.cc", '#include "efccl/host/executor.h"\n')
        write(root, "net/src/bad.cc", '\n#include "efccl/device/device_executor.h"\n')
        code, out = run(root)
        self.assertEqual(code, 1)
        self.assertIn("ef_format/src/bad.cc:1", out)
        self.assertIn("layer ef_format may not include layer interpreter/host", out)
        self.assertIn("net/src/bad.cc:2", out)

    def test_an_upward_include_between_runtime_sublayers_fails(self):
        root = self.tree()
        write(root, "runtime/src/select/tuning.h", '#include "launch/call.h"\n')
        write(root, "runtime/src/launch/batch.cc", '#include "enqueue/clique.h"\n')
        code, out = run(root)
        self.assertEqual(code, 1)
        self.assertIn("runtime/select may not include runtime/launch", out)
        self.assertIn("runtime/launch may not include runtime/enqueue", out)

    def test_an_oversized_source_fails(self):
        root = self.tree()
        write(root, "net/src/huge.cc", "//\n" * 801)
        write(root, "net/src/fine.cc", "//\n" * 800)
        code, out = run(root)
        self.assertEqual(code, 1)
        self.assertIn("net/src/huge.cc: 801 lines", out)
        self.assertNotIn("fine.cc", out)


if __name__ == "__main__":
    unittest.main()
