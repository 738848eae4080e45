"""efccl.language: the MSCCLang-compatible DSL (tracing, errors, collectives, output)."""

import contextlib
import io
import unittest

import efccl
from efccl.language import *
from efccl.language.collectives import AllGather, AllReduce, AllToAll, Collective, ReduceScatter
from efccl.topologies import fully_connected, line, ring


def ring_allreduce_trace(size):
    for r in range(size):
        c = chunk(r, Buffer.input, r)
        for step in range(1, size):
            c = chunk((r + step) % size, Buffer.input, r).reduce(c)
        for step in range(0, size - 1):
            c = c.copy((r + step) % size, Buffer.input, r)


class TracingTest(unittest.TestCase):
    def test_program_compiles_and_runs(self):
        with MSCCLProgram("ar", fully_connected(4), AllReduce(4, 4, True), 1) as prog:
            ring_allreduce_trace(4)
            self.assertTrue(Check())
            p = Compile()
        self.assertIsInstance(p, efccl.Program)
        self.assertEqual((p.collective, p.nranks, p.inplace, p.outofplace),
                         ("allreduce", 4, True, False))
        self.assertEqual(efccl.validate(p), [])
        self.assertTrue(efccl.run_host(p)[0])
        self.assertIs(prog.compile(), prog.compile())  # cached while the trace is unchanged

    def test_reduce_returns_location_and_values_follow(self):
        with MSCCLProgram("ar", fully_connected(2), AllReduce(2, 1, False), 1) as prog:
            a = chunk(0, Buffer.input, 0)
            b = chunk(1, Buffer.input, 0)
            self.assertIs(b.reduce(a), b)
            # `b` is a location: it now holds the sum (MSCCLang semantics, no stale refs).
            self.assertEqual(prog.buffers[1][Buffer.input][0],
                             ReduceChunk(1, [Chunk(0, 0), Chunk(1, 0)]))
            b.copy(1, Buffer.output, 0)
            b.copy(0, Buffer.output, 0)
            self.assertTrue(Check())
            self.assertTrue(efccl.run_host(Compile())[0])

    def test_uninitialized_read_raises_core_message(self):
        with MSCCLProgram("ag", fully_connected(2), AllGather(2, 1, False), 1):
            c = chunk(0, Buffer.output, 1)  # a reference to an unwritten slot is allowed
            with self.assertRaises(efccl.Error) as cm:
                c.copy(1, Buffer.output, 1)
        self.assertIn("reads rank 0 output[1], which was never written", str(cm.exception))
        self.assertIsInstance(cm.exception, RuntimeError)

    def test_index_out_of_range_raises_at_chunk(self):
        with MSCCLProgram("ag", fully_connected(2), AllGather(2, 1, False), 1):
            with self.assertRaisesRegex(efccl.Error, "outside the buffer"):
                chunk(0, Buffer.input, 3)
            with self.assertRaisesRegex(efccl.Error, "out of range"):
                chunk(2, Buffer.input, 0)

    def test_missing_link_raises(self):
        with MSCCLProgram("ag", line(3), AllGather(3, 1, False), 1):
            with self.assertRaisesRegex(efccl.Error, "No link from 0 to 2"):
                chunk(0, Buffer.input, 0).copy(2, Buffer.output, 0)

    def test_incomplete_program(self):
        out = io.StringIO()
        with MSCCLProgram("ag", ring(3), AllGather(3, 1, False), 1):
            chunk(0, Buffer.input, 0).copy(1, Buffer.output, 0)
            with contextlib.redirect_stdout(out):
                self.assertFalse(Check())
            with self.assertRaisesRegex(efccl.Error, "does not compute allgather"):
                Compile()
        self.assertIn("Rank 0 chunk 0 is incorrect", out.getvalue())

    def test_context_rules(self):
        with self.assertRaisesRegex(RuntimeError, "No Program in context"):
            chunk(0, Buffer.input, 0)
        with MSCCLProgram("a", fully_connected(2), AllGather(2, 1, False), 1):
            with self.assertRaisesRegex(RuntimeError, "already"):
                with MSCCLProgram("b", fully_connected(2), AllGather(2, 1, False), 1):
                    pass
        with self.assertRaisesRegex(ValueError, "ranks"):
            MSCCLProgram("c", fully_connected(3), AllGather(2, 1, False), 1)
        with self.assertRaisesRegex(ValueError, "protocol"):
            MSCCLProgram("d", fully_connected(2), AllGather(2, 1, False), 1, protocol="Fast")

    def test_xml_and_json_output(self):
        out = io.StringIO()
        with MSCCLProgram("ag", ring(3), AllGather(3, 1, True), 1):
            for r in range(3):
                c = chunk(r, Buffer.input, 0)
                for s in range(1, 3):
                    c = c.copy((r + s) % 3, Buffer.output, r)
            with contextlib.redirect_stdout(out):
                XML()
            xml = out.getvalue()
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                JSON()
            text = out.getvalue()
        self.assertTrue(xml.lstrip().startswith("<algo"))
        self.assertIn('coll="allgather"', xml)
        from_xml = efccl.loads(xml)
        self.assertEqual(efccl.validate(from_xml), [])
        self.assertTrue(efccl.run_host(from_xml, inplace=True)[0])
        self.assertEqual(efccl.loads(text).to_json(), text)


class BuffersTest(unittest.TestCase):
    def test_named_scratch_append_and_dst_index(self):
        with MSCCLProgram("a2a", fully_connected(2), AllToAll(2, 1, False), 1) as prog:
            # Each rank parks both of its chunks in a named buffer on the other, appended.
            for r in range(2):
                for i in range(2):
                    ref = chunk(r, Buffer.input, i).copy(1 - r, "park")
                    self.assertEqual((ref.buffer, ref.index), ("park", i))
            self.assertEqual(len(prog.buffers[0]["park"]), 2)
            for r in range(2):
                parked = chunk(r, "park", 0, 2)
                for part in parked.split(2):
                    part.copy(part.get_dst_rank(), Buffer.output, part.get_dst_index())
            self.assertTrue(Check())
            p = Compile()
        self.assertEqual(p.buffer_chunks(0)[2], 2)
        self.assertTrue(efccl.run_host(p)[0])

    def test_split_group(self):
        with MSCCLProgram("ar", fully_connected(2), AllReduce(2, 4, False), 1):
            whole = chunk(0, Buffer.input, 0, 4)
            parts = whole.split(2)
            self.assertEqual([(p.index, p.size) for p in parts], [(0, 2), (2, 2)])
            self.assertEqual(parts[1].group(parts[0]), whole)
            with self.assertRaises(ValueError):
                whole.split(3)

    def test_inplace_reducescatter_aliasing(self):
        n = 3
        with MSCCLProgram("rs", ring(n), ReduceScatter(n, 1, True), 1):
            for r in range(n):
                c = chunk((r + 1) % n, Buffer.input, r)
                for s in range(2, n + 1):
                    c = chunk((r + s) % n, Buffer.input, r).reduce(c)
            self.assertTrue(Check())
            p = Compile()
        self.assertTrue(p.inplace)
        self.assertTrue(efccl.run_host(p, inplace=True)[0])

    def test_manual_threadblocks(self):
        with MSCCLProgram("ag", fully_connected(3), AllGather(3, 1, False), 1,
                          threadblock_policy=ThreadblockPolicy.manual):
            for r in range(3):
                chunk(r, Buffer.input, 0).copy(r, Buffer.output, r, sendtb=0)
                for q in range(3):
                    if q != r:
                        chunk(r, Buffer.input, 0).copy(q, Buffer.output, r, sendtb=1 + q,
                                                       recvtb=4 + r)
            p = Compile()
        self.assertTrue(efccl.run_host(p)[0])
        self.assertEqual(len(p.threadblocks(0)), 5)  # tbs 0 (copy), 2, 3 (sends), 5, 6 (recvs)


class CustomCollectiveTest(unittest.TestCase):
    class Broadcast0(Collective):
        """Rank 0's chunk goes to the output of every other rank."""

        def init_buffers(self):
            return [{Buffer.input: [Chunk(r, c, -1, c) if r == 0 else None
                                    for c in range(self.chunk_factor)],
                     Buffer.output: [None] * self.chunk_factor} for r in range(self.num_ranks)]

        def check(self, prog):
            return all(prog.buffers[r][Buffer.output][c] == Chunk(0, c)
                       for r in range(1, self.num_ranks) for c in range(self.chunk_factor))

    def test_postconditions_come_from_check(self):
        with MSCCLProgram("bc", fully_connected(3), self.Broadcast0(3, 2, False), 1):
            c = chunk(0, Buffer.input, 0, 2).copy(1, Buffer.output, 0)
            c.copy(2, Buffer.output, 0)
            # A chunk check() does not look at is not a postcondition.
            chunk(0, Buffer.input, 1).copy(0, Buffer.output, 1)
            self.assertTrue(Check())
            p = Compile()
        self.assertEqual(p.collective, "custom")
        self.assertEqual(p.postconditions, [(1, 0, [(0, 0)]), (1, 1, [(0, 1)]),
                                            (2, 0, [(0, 0)]), (2, 1, [(0, 1)])])
        self.assertTrue(efccl.run_host(p)[0])

    def test_rejected_by_check(self):
        with MSCCLProgram("bc", fully_connected(3), self.Broadcast0(3, 1, False), 1):
            chunk(0, Buffer.input, 0).copy(1, Buffer.output, 0)
            with self.assertRaisesRegex(efccl.Error, "check\\(\\) rejects"):
                Compile()

    def test_empty_input_slot(self):
        with MSCCLProgram("bc", fully_connected(3), self.Broadcast0(3, 1, False), 1):
            with self.assertRaisesRegex(efccl.Error, r"reads rank 1 input\[0\], which was never written"):
                chunk(1, Buffer.input, 0).copy(2, Buffer.output, 0)

    def test_xml_of_custom_prints_json(self):
        out, err = io.StringIO(), io.StringIO()
        with MSCCLProgram("bc", fully_connected(2), self.Broadcast0(2, 1, False), 1):
            chunk(0, Buffer.input, 0).copy(1, Buffer.output, 0)
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                XML()
        self.assertIn("custom collective", err.getvalue())
        self.assertTrue(efccl.run_host(efccl.loads(out.getvalue()))[0])


if __name__ == "__main__":
    unittest.main()
