"""The efccl package without its C++ core (as where only efccl.torch was built): `import efccl`
works and needs no torch; the core's names raise ImportError saying why; efccl.torch needs torch."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

SOURCE = os.path.join(os.environ.get("EFCCL_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", "..")),
                      "python", "efccl")

PROBE = r"""
import sys
import efccl
assert "torch" not in sys.modules, "import efccl imported torch"
try:
    efccl.validate
except ImportError as e:
    assert "efccl._efccl" in str(e), e
else:
    raise AssertionError("efccl.validate did not raise without the core")
try:
    efccl.no_such_name
except AttributeError:
    pass
else:
    raise AssertionError("an unknown name did not raise AttributeError")
print("ok")
"""


class PackageWithoutCoreTest(unittest.TestCase):
    def test_import_without_core(self):
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copytree(SOURCE, os.path.join(tmp, "efccl"),
                            ignore=shutil.ignore_patterns("_efccl*", "__pycache__"))
            env = dict(os.environ, PYTHONPATH=tmp)
            out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                                 cwd=tmp, timeout=60)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertEqual(out.stdout.strip(), "ok")


if __name__ == "__main__":
    unittest.main()
