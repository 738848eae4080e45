"""MSCCL XML round trip of the GC3 paper programs in examples/gc3.

EfcclSide (always runs): each example compiled by efccl (`efccl compile PROG.py -o X.xml`, and
the MSCCL XML the script prints, which is what MSCCLang's XML() prints) is accepted by our
importer (`efccl import-msccl`) and verifies (`efccl check` on the XML and on the imported
JSON). The custom collective (AllToNext) has no MSCCL XML form; its EF JSON is checked.

MscclToolsSide (skips, saying why, when msccl-tools cannot run here): the same scripts run
under msccl-tools itself (github.com/microsoft/msccl-tools, the MSCCLang compiler), with
`efccl` replaced by `msccl` in their imports, and the XML it prints must import and verify.
msccl-tools is looked up in $MSCCL_TOOLS_DIR (CMake: -DEFCCL_MSCCL_TOOLS_DIR=PATH); the
interpreter that runs it in $MSCCL_TOOLS_PYTHON, else this one, else /usr/bin/python3 (it needs
lxml, humanfriendly, tabulate and z3: Debian's python3-lxml, python3-humanfriendly,
python3-tabulate, python3-z3).

msccl-tools' XML is imported as it prints it, in particular with its two conventions that
MSCCL's original runtime reads (docs/ef-format.md §9): `<algo ... inplace="0|1">` without
`outofplace` (the program is for that one mode), and an in-place allgather whose input lies
inside its output, declared `i_chunks="0"`. The test checks that the programs it runs exercise
both.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

SOURCE_DIR = os.environ.get("EFCCL_SOURCE_DIR",
                            os.path.join(os.path.dirname(__file__), "..", "..", ".."))
EXAMPLES = os.path.join(SOURCE_DIR, "examples", "gc3")
CLI = os.environ.get("EFCCL_CLI", os.path.join(SOURCE_DIR, "build", "bin", "efccl"))

# (script, arguments): several shapes of each paper program.
PROGRAMS = [
    ("fig1a_ring_allreduce.py", ["4"]),
    ("fig1a_ring_allreduce.py", ["3", "--channels", "2", "--protocol", "LL128"]),
    ("fig8a_ring_allgather.py", ["4"]),
    ("fig8a_ring_allgather.py", ["5", "--chunks", "2", "--inplace"]),
    ("fig10a_two_step_alltoall.py", ["2", "4"]),
    ("fig10a_two_step_alltoall.py", ["3", "2", "--protocol", "LL"]),
    ("hierarchical_allreduce.py", ["2", "4"]),
    ("hierarchical_allreduce.py", ["2", "2", "--instances", "2"]),
]
CUSTOM_PROGRAMS = [("alltonext.py", ["2", "4"]), ("alltonext.py", ["3", "2"])]


def run(cmd, **kwargs):
    return subprocess.run(cmd, capture_output=True, text=True, **kwargs)


class Checks:
    def assert_ok(self, result, what):
        self.assertEqual(result.returncode, 0,
                         f"{what}: exit {result.returncode}\n{result.stdout}{result.stderr}")

    def assert_verifies(self, path, what):
        """`efccl check` passes every run (datatypes x ops x modes, tiled too)."""
        check = run([CLI, "check", path])
        self.assert_ok(check, f"{what}: efccl check {path}")
        self.assertRegex(check.stdout, r"\b[1-9]\d* runs passed, 0 failed", check.stdout)

    def assert_imports(self, xml_path, what):
        """`efccl import-msccl` accepts the file; the JSON it writes verifies too."""
        json_path = xml_path[:-4] + ".imported.json"
        self.assert_ok(run([CLI, "import-msccl", xml_path, "-o", json_path]),
                       f"{what}: import-msccl")
        self.assert_verifies(json_path, what + " (imported JSON)")


class EfcclSide(unittest.TestCase, Checks):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gc3_roundtrip_")
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = os.pathsep.join(
            p for p in [EXAMPLES, self.env.get("PYTHONPATH", "")] if p)

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_compiled_xml_imports_and_verifies(self):
        for i, (script, args) in enumerate(PROGRAMS):
            with self.subTest(script=script, args=args):
                what = f"{script} {' '.join(args)}"
                xml = os.path.join(self.tmp, f"c{i}.xml")
                self.assert_ok(run([CLI, "compile", os.path.join(EXAMPLES, script), "-o", xml,
                                    "--", *args], env=self.env), f"{what}: efccl compile")
                self.assert_verifies(xml, what)
                self.assert_imports(xml, what)

    def test_printed_xml_imports_and_verifies(self):
        # What the script prints (XML(), MSCCLang's way to emit a program).
        for i, (script, args) in enumerate(PROGRAMS):
            with self.subTest(script=script, args=args):
                what = f"{script} {' '.join(args)} (printed)"
                printed = run([sys.executable, os.path.join(EXAMPLES, script), *args],
                              env=self.env)
                self.assert_ok(printed, what)
                self.assertTrue(printed.stdout.lstrip().startswith("<algo"), printed.stdout[:200])
                xml = os.path.join(self.tmp, f"p{i}.xml")
                with open(xml, "w") as f:
                    f.write(printed.stdout)
                self.assert_verifies(xml, what)
                self.assert_imports(xml, what)

    def test_custom_collective_is_ef_json(self):
        for i, (script, args) in enumerate(CUSTOM_PROGRAMS):
            with self.subTest(script=script, args=args):
                what = f"{script} {' '.join(args)}"
                out = os.path.join(self.tmp, f"custom{i}.json")
                self.assert_ok(run([CLI, "compile", os.path.join(EXAMPLES, script), "-o", out,
                                    "--", *args], env=self.env), f"{what}: efccl compile")
                self.assert_verifies(out, what)
                refused = run([CLI, "compile", os.path.join(EXAMPLES, script), "-o",
                               out[:-5] + ".xml", "--", *args], env=self.env)
                self.assertNotEqual(refused.returncode, 0)
                self.assertIn("no form for postconditions", refused.stdout + refused.stderr)


def find_msccl_tools():
    """(msccl-tools folder, interpreter) or (None, why not)."""
    root = os.environ.get("MSCCL_TOOLS_DIR", "")
    if not root:
        return None, ("msccl-tools not configured: set MSCCL_TOOLS_DIR (or configure with "
                      "-DEFCCL_MSCCL_TOOLS_DIR=PATH) to a checkout of "
                      "github.com/microsoft/msccl-tools")
    if not os.path.isfile(os.path.join(root, "msccl", "language", "__init__.py")):
        return None, f"MSCCL_TOOLS_DIR={root} holds no msccl/language/__init__.py"
    candidates = [os.environ.get("MSCCL_TOOLS_PYTHON", ""), sys.executable, "/usr/bin/python3",
                  shutil.which("python3") or ""]
    errors = []
    for python in dict.fromkeys(c for c in candidates if c):
        probe = run([python, "-c", "import msccl.language, msccl.topologies"],
                    env=dict(os.environ, PYTHONPATH=root))
        if probe.returncode == 0:
            return root, python
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        errors.append(f"{python}: {last}")
    return None, ("msccl-tools at " + root + " does not import with any interpreter tried (" +
                  "; ".join(errors) + "); it needs lxml, humanfriendly, tabulate and z3")


class MscclToolsSide(unittest.TestCase, Checks):
    def setUp(self):
        self.root, self.python = find_msccl_tools()
        if self.root is None:
            self.skipTest(self.python)
        self.tmp = tempfile.mkdtemp(prefix="gc3_msccl_tools_")
        # The examples, importing msccl instead of efccl (the only change MSCCLang needs).
        for name in os.listdir(EXAMPLES):
            if name.endswith(".py"):
                with open(os.path.join(EXAMPLES, name)) as f:
                    text = f.read()
                text = re.sub(r"^(\s*from\s+)efccl(\.\w+)", r"\1msccl\2", text, flags=re.M)
                with open(os.path.join(self.tmp, name), "w") as f:
                    f.write(text)

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def msccl_xml(self, script, args):
        result = run([self.python, os.path.join(self.tmp, script), *args],
                     env=dict(os.environ, PYTHONPATH=os.pathsep.join([self.tmp, self.root])))
        self.assert_ok(result, f"msccl-tools running {script} {' '.join(args)}")
        self.assertTrue(result.stdout.lstrip().startswith("<algo"), result.stdout[:300])
        return result.stdout

    def problems(self, xml, name):
        """The validator's complaints about `xml` (one per line), [] when it is valid."""
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write(xml)
        result = run([CLI, "validate", path])
        problems = [line for line in result.stderr.splitlines() if line.strip()]
        self.assertEqual(result.returncode == 0, not problems, result.stderr)
        return problems

    def test_msccl_tools_xml_imports_and_verifies(self):
        conventions = set()
        for i, (script, args) in enumerate(PROGRAMS):
            with self.subTest(script=script, args=args):
                what = f"msccl-tools {script} {' '.join(args)}"
                xml = self.msccl_xml(script, args)
                head = xml.split(">", 1)[0]
                if 'outofplace="' not in head:
                    conventions.add("no outofplace")
                if 'coll="allgather"' in head and 'i_chunks="0"' in xml:
                    conventions.add("in-place allgather with i_chunks 0")
                self.assertEqual(self.problems(xml, f"m{i}.xml"), [], what)
                path = os.path.join(self.tmp, f"m{i}.xml")
                self.assert_verifies(path, what)
                self.assert_imports(path, what)
        self.assertEqual(conventions, {"no outofplace", "in-place allgather with i_chunks 0"})

    def test_custom_collective_has_no_msccl_xml_form(self):
        # msccl-tools writes coll="custom" without postconditions; our importer reads it and
        # rejects it as a program (nothing states its result).
        for i, (script, args) in enumerate(CUSTOM_PROGRAMS):
            with self.subTest(script=script, args=args):
                xml = self.msccl_xml(script, args)
                self.assertIn('coll="custom"', xml.split(">", 1)[0])
                path = os.path.join(self.tmp, f"custom{i}.xml")
                with open(path, "w") as f:
                    f.write(xml)
                check = run([CLI, "validate", path])
                self.assertNotEqual(check.returncode, 0)
                self.assertIn("[postcondition]", check.stderr)


if __name__ == "__main__":
    unittest.main()
