"""examples/gc3: every GC3 paper program compiles, validates, passes the host executor (from
Python and through `efccl run-host` on the saved file), and survives MSCCL XML export/import."""

import os
import subprocess
import sys
import tempfile
import unittest

import efccl

SOURCE_DIR = os.environ.get("EFCCL_SOURCE_DIR",
                            os.path.join(os.path.dirname(__file__), "..", ".."))
EXAMPLES = os.path.join(SOURCE_DIR, "examples", "gc3")
CLI = os.environ.get("EFCCL_CLI", os.path.join(SOURCE_DIR, "build", "bin", "efccl"))
sys.path.insert(0, EXAMPLES)

import alltonext  # noqa: E402
import fig1a_ring_allreduce  # noqa: E402
import fig8a_ring_allgather  # noqa: E402
import fig10a_two_step_alltoall  # noqa: E402
import hierarchical_allreduce  # noqa: E402

# (name, builder, expected collective); several shapes per program.
CASES = [
    ("fig1a ring 4", lambda: fig1a_ring_allreduce.ring_allreduce(4), "allreduce"),
    ("fig1a ring 3, 2 channels, 2 instances",
     lambda: fig1a_ring_allreduce.ring_allreduce(3, 2, 2), "allreduce"),
    ("fig1a ring 8 LL128", lambda: fig1a_ring_allreduce.ring_allreduce(8, protocol="LL128"),
     "allreduce"),
    ("fig8a allgather 4", lambda: fig8a_ring_allgather.ring_allgather(4), "allgather"),
    ("fig8a allgather 5 in-place, 2 chunks",
     lambda: fig8a_ring_allgather.ring_allgather(5, 2, 1, True), "allgather"),
    ("fig10a alltoall 2x4", lambda: fig10a_two_step_alltoall.two_step_alltoall(2, 4), "alltoall"),
    ("fig10a alltoall 3x2, 2 instances",
     lambda: fig10a_two_step_alltoall.two_step_alltoall(3, 2, 2), "alltoall"),
    ("hierarchical allreduce 2x4",
     lambda: hierarchical_allreduce.hierarchical_allreduce(2, 4), "allreduce"),
    ("hierarchical allreduce 3x3, 2 instances",
     lambda: hierarchical_allreduce.hierarchical_allreduce(3, 3, 2), "allreduce"),
    ("alltonext 2x4", lambda: alltonext.alltonext(2, 4), "custom"),
    ("alltonext 3x4 LL", lambda: alltonext.alltonext(3, 4, protocol="LL"), "custom"),
]


def modes(program):
    return [m for m in (False, True) if (program.inplace if m else program.outofplace)]


class Gc3ExamplesTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.tmp.cleanup()

    def check_runs(self, program, label):
        self.assertEqual(efccl.validate(program), [], label)
        self.assertTrue(modes(program), label)
        for inplace in modes(program):
            for dtype, op in [("float", "sum"), ("half", "max"), ("int32", "prod")]:
                for count in (program.count_granularity, program.count_granularity * 5):
                    passed, message = efccl.run_host(program, count=count, dtype=dtype, op=op,
                                                     inplace=inplace, seed=7)
                    self.assertTrue(passed, f"{label} {dtype} {op} inplace={inplace}: {message}")
        # Small slots: chunks are tiled and pipelined over several iterations.
        passed, message = efccl.run_host(program, count=program.count_granularity * 64,
                                         slot_bytes=16)
        self.assertTrue(passed, f"{label} tiled: {message}")

    def test_examples(self):
        for i, (label, build, collective) in enumerate(CASES):
            with self.subTest(label):
                program = build().compile()
                self.assertEqual(program.collective, collective)
                self.check_runs(program, label)

                path = os.path.join(self.tmp.name, f"p{i}.json")
                program.save(path)
                self.assertEqual(efccl.load(path), program)
                run = subprocess.run([CLI, "run-host", path], capture_output=True, text=True)
                self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
                self.assertTrue(run.stdout.startswith("PASS"), run.stdout)

                if collective == "custom":
                    continue  # MSCCL XML cannot state postconditions
                xml = program.to_msccl_xml()
                imported = efccl.loads(xml, "example.xml")
                self.assertEqual((imported.collective, imported.nranks, imported.nchunksperloop),
                                 (program.collective, program.nranks, program.nchunksperloop))
                self.check_runs(imported, label + " (from XML)")
                xml_path = os.path.join(self.tmp.name, f"p{i}.xml")
                program.save(xml_path)
                self.assertTrue(efccl.run_host(efccl.load(xml_path))[0])

    def test_scripts_print_programs(self):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        scripts = [("fig1a_ring_allreduce.py", ["4"]), ("fig8a_ring_allgather.py", ["3"]),
                   ("fig10a_two_step_alltoall.py", ["2", "2"]),
                   ("hierarchical_allreduce.py", ["2", "2"]), ("alltonext.py", ["2", "2"])]
        for script, args in scripts:
            with self.subTest(script):
                for fmt in ([], ["--json"]):
                    run = subprocess.run([sys.executable, os.path.join(EXAMPLES, script), *args,
                                          *fmt], capture_output=True, text=True, env=env)
                    self.assertEqual(run.returncode, 0, run.stderr)
                    program = efccl.loads(run.stdout)
                    self.assertTrue(efccl.run_host(program)[0], script)
                    if not fmt and script != "alltonext.py":
                        self.assertTrue(run.stdout.lstrip().startswith("<algo"))


if __name__ == "__main__":
    unittest.main()
