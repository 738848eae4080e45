"""efccl._efccl: programs, JSON / MSCCL XML, validation, the host executor, the algorithm
library and the raw chunk API (ProgramBuilder)."""

import json
import os
import tempfile
import unittest

import efccl
from efccl import Buffer


class AlgorithmLibraryTest(unittest.TestCase):
    def test_list_algorithms(self):
        algos = {a["name"]: a for a in efccl.list_algorithms()}
        self.assertIn("ring_allreduce", algos)
        self.assertEqual(algos["ring_allreduce"]["collective"], "allreduce")
        self.assertTrue(all(a["description"] for a in algos.values()))

    def test_generate_validate_run(self):
        p = efccl.generate_algorithm("ring_allreduce", 4, channels=2)
        self.assertEqual((p.collective, p.nranks, p.nchannels), ("allreduce", 4, 2))
        self.assertEqual(efccl.validate(p), [])
        passed, message = efccl.run_host(p)
        self.assertTrue(passed, message)
        self.assertTrue(message.startswith("PASS"))
        for dtype, op in [("half", "max"), ("int32", "prod"), ("bfloat16", "avg")]:
            passed, message = efccl.run_host(p, dtype=dtype, op=op, count=p.count_granularity * 7)
            self.assertTrue(passed, message)

    def test_unknown_algorithm_lists_known_ones(self):
        with self.assertRaises(efccl.Error) as cm:
            efccl.generate_algorithm("no_such_algorithm", 4)
        self.assertIn("ring_allreduce", str(cm.exception))

    def test_bad_arguments(self):
        p = efccl.generate_algorithm("ring_allgather", 3)
        with self.assertRaisesRegex(efccl.Error, "datatype"):
            efccl.run_host(p, dtype="float7")
        with self.assertRaisesRegex(efccl.Error, "protocol"):
            efccl.generate_algorithm("ring_allgather", 3, protocol="Fast")


class ProgramFormatsTest(unittest.TestCase):
    def setUp(self):
        self.program = efccl.generate_algorithm("ring_allgather", 4)
        self.tmp = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.tmp.cleanup()

    def test_json_round_trip(self):
        text = self.program.to_json()
        self.assertEqual(json.loads(text)["format"], "efccl-ef")
        again = efccl.loads(text)
        self.assertEqual(again, self.program)
        self.assertEqual(again.to_json(), text)

    def test_save_and_load_both_formats(self):
        for name in ("p.json", "p.xml"):
            path = os.path.join(self.tmp.name, name)
            self.program.save(path)
            with open(path) as f:
                head = f.read(1)
            self.assertEqual(head, "<" if name.endswith(".xml") else "{")
            loaded = efccl.load(path)
            self.assertEqual(loaded.collective, "allgather")
            self.assertEqual(efccl.validate(loaded), [])
            self.assertTrue(efccl.run_host(loaded)[0])

    def test_load_errors_name_file_and_location(self):
        path = os.path.join(self.tmp.name, "bad.json")
        with open(path, "w") as f:
            f.write('{"format": "efccl-ef", "version": 1, "nmae": "x"}')
        with self.assertRaises(efccl.Error) as cm:
            efccl.load(path)
        self.assertIn("bad.json", str(cm.exception))
        with self.assertRaisesRegex(efccl.Error, "cannot open|No such|not found"):
            efccl.load(os.path.join(self.tmp.name, "missing.json"))

    def test_validate_reports_broken_program(self):
        doc = json.loads(self.program.to_json())
        doc["ranks"][0]["threadblocks"][0]["send"] = 0  # a rank sending to itself
        diags = efccl.validate(efccl.loads(json.dumps(doc)))
        self.assertTrue(diags)
        self.assertTrue(any("peer-range" in d for d in diags), diags)

    def test_program_introspection(self):
        p = self.program
        self.assertEqual(p.buffer_chunks(0), (1, 4, 0))
        tbs = p.threadblocks(1)
        self.assertTrue(all(set(tb) == {"send", "recv", "channel", "ops"} for tb in tbs))
        self.assertEqual(sum(p.op_counts().values()),
                         sum(len(tb["ops"]) for r in range(4) for tb in p.threadblocks(r)))
        with self.assertRaises(IndexError):
            p.threadblocks(4)


class ProgramBuilderTest(unittest.TestCase):
    def test_allgather_trace_compiles(self):
        n = 3
        b = efccl.ProgramBuilder("ag", "allgather", n, 1)
        for r in range(n):
            c = b.chunk(r, Buffer.input, 0).copy(r, Buffer.output, r)
            for s in range(1, n):
                c = c.copy((r + s) % n, Buffer.output, r)
        p = b.compile()
        self.assertEqual(efccl.compile(b), p)
        self.assertEqual(efccl.validate(p), [])
        self.assertTrue(efccl.run_host(p)[0])

    def test_read_of_unwritten_chunk_raises_core_message(self):
        b = efccl.ProgramBuilder("x", "allreduce", 2, 2)
        with self.assertRaisesRegex(efccl.Error, r"reads rank 0 output\[1\], which was never written"):
            b.chunk(0, Buffer.output, 1).copy(1, Buffer.output, 1)
        self.assertIn("never written", b.status)
        # The builder is poisoned: later calls raise the first error again.
        with self.assertRaisesRegex(efccl.Error, "never written"):
            b.chunk(0, Buffer.input, 0)

    def test_index_out_of_range(self):
        b = efccl.ProgramBuilder("x", "allgather", 2, 1)
        with self.assertRaisesRegex(efccl.Error, r"outside the buffer \(1 chunks\)"):
            b.chunk(0, Buffer.input, 1)

    def test_stale_reference(self):
        b = efccl.ProgramBuilder("x", "allreduce", 2, 1)
        old = b.chunk(1, Buffer.input, 0)
        b.chunk(1, Buffer.input, 0).reduce(b.chunk(0, Buffer.input, 0))
        with self.assertRaisesRegex(efccl.Error, "overwritten"):
            old.copy(0, Buffer.output, 0)

    def test_incomplete_trace_names_wrong_chunk(self):
        b = efccl.ProgramBuilder("x", "allgather", 2, 1)
        b.chunk(0, Buffer.input, 0).copy(1, Buffer.output, 0)
        with self.assertRaisesRegex(efccl.Error, "does not compute allgather"):
            b.compile()

    def test_custom_collective(self):
        b = efccl.ProgramBuilder("next", "custom", 3, 1)
        for r in range(3):
            b.set_buffer_sizes(r, 1, 1)
        b.set_postconditions([(1, 0, [(0, 0)]), (2, 0, [(1, 0)])])
        b.chunk(0, Buffer.input, 0).copy(1, Buffer.output, 0)
        b.chunk(1, Buffer.input, 0).copy(2, Buffer.output, 0)
        p = b.compile()
        self.assertEqual(p.collective, "custom")
        self.assertEqual(p.postconditions, [(1, 0, [(0, 0)]), (2, 0, [(1, 0)])])
        self.assertTrue(efccl.run_host(p)[0])
        with self.assertRaisesRegex(efccl.Error, "custom"):
            p.to_msccl_xml()

    def test_named_scratch_and_options(self):
        b = efccl.ProgramBuilder("x", "allgather", 2, 1, fuse_rcs=False, gc3_priority=False)
        tmp = b.scratch_buffer("tmp")
        self.assertEqual(b.scratch_buffer("tmp"), tmp)
        self.assertEqual(tmp.kind, "scratch")
        for r in range(2):
            b.chunk(r, Buffer.input, 0).copy(r, Buffer.output, r)
            b.chunk(r, Buffer.input, 0).copy(1 - r, tmp, 0).copy(1 - r, Buffer.output, r)
        p = b.compile()
        self.assertEqual(p.buffer_chunks(0)[2], 1)
        self.assertTrue(efccl.run_host(p)[0])
        with self.assertRaises(TypeError):
            efccl.ProgramBuilder("x", "allgather", 2, 1, no_such_option=True)


if __name__ == "__main__":
    unittest.main()
