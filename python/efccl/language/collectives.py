"""The collectives a DSL program can implement (MSCCLang's ``msccl.language.collectives``).

A collective says how the buffers start (``init_buffers``: which :class:`Chunk` each input slot
holds), how in-place calls alias them (``get_buffer_index``), and what the program must leave
in the output (``check``). The four standard ones are compiled against the C++ core's own
definition of the collective; for a custom subclass of :class:`Collective` the compiler derives
the postconditions from ``check`` (see ``MSCCLProgram.compile``).
"""

from efccl.language.chunk import Chunk, ReduceChunk
from efccl.language.ir import Buffer


def _expected_reduction(num_ranks, index):
    chunks = [Chunk(r, index) for r in range(num_ranks)]
    return chunks[0] if num_ranks == 1 else ReduceChunk(-1, chunks)


class Collective:
    """Base class; ``chunk_factor`` is MSCCLang's (chunks per rank-block for allgather,
    alltoall and reducescatter, chunks per buffer for allreduce and custom collectives)."""

    def __init__(self, num_ranks, chunk_factor, inplace):
        self.num_ranks = num_ranks
        self.chunk_factor = chunk_factor
        self.inplace = inplace
        self.name = "custom"

    def init_buffers(self):
        """One dict per rank: {Buffer.input: [Chunk or None, ...], Buffer.output: [...]}."""
        return None

    def check(self, prog):
        """True when prog.buffers holds the expected result (None: no check)."""
        return None

    def get_buffer_index(self, rank, buffer, index):
        """Where (buffer, index) of `rank` really is (in-place aliasing)."""
        return buffer, index

    def _report(self, rank, index, expected, given):
        print(f"Rank {rank} chunk {index} is incorrect: expected {expected}, given {given}")


class AllReduce(Collective):
    """out_r[c] = reduction over q of in_q[c]; chunk_factor chunks per buffer."""

    def __init__(self, num_ranks, chunk_factor, inplace):
        super().__init__(num_ranks, chunk_factor, inplace)
        self.name = "allreduce"

    def init_buffers(self):
        buffers = []
        for r in range(self.num_ranks):
            input_buffer = [Chunk(r, c, -1, c) for c in range(self.chunk_factor)]
            output_buffer = input_buffer if self.inplace else [None] * self.chunk_factor
            buffers.append({Buffer.input: input_buffer, Buffer.output: output_buffer})
        return buffers

    def check(self, prog):
        buf = Buffer.input if self.inplace else Buffer.output
        correct = True
        for r in range(self.num_ranks):
            output = prog.buffers[r][buf]
            for c in range(self.chunk_factor):
                expected = _expected_reduction(self.num_ranks, c)
                if output[c] is None or output[c] != expected:
                    self._report(r, c, expected, output[c])
                    correct = False
        return correct

    def get_buffer_index(self, rank, buffer, index):
        if self.inplace and buffer == Buffer.output:
            return Buffer.input, index
        return buffer, index


class AllGather(Collective):
    """out_r[q*chunk_factor + c] = in_q[c]."""

    def __init__(self, num_ranks, chunk_factor, inplace):
        super().__init__(num_ranks, chunk_factor, inplace)
        self.name = "allgather"

    def init_buffers(self):
        cf = self.chunk_factor
        buffers = []
        for r in range(self.num_ranks):
            output_buffer = [None] * (self.num_ranks * cf)
            input_buffer = [Chunk(r, c, -1, r * cf + c) for c in range(cf)]
            if self.inplace:
                # The input is a window of the output; refs to it are redirected there.
                output_buffer[r * cf:(r + 1) * cf] = input_buffer
            buffers.append({Buffer.input: input_buffer, Buffer.output: output_buffer})
        return buffers

    def check(self, prog):
        cf = self.chunk_factor
        correct = True
        for r in range(self.num_ranks):
            output = prog.buffers[r][Buffer.output]
            for q in range(self.num_ranks):
                for c in range(cf):
                    index = q * cf + c
                    chunk = output[index]
                    if chunk is None or chunk != Chunk(q, c):
                        self._report(r, index, Chunk(q, c), chunk)
                        correct = False
        return correct

    def get_buffer_index(self, rank, buffer, index):
        if self.inplace and buffer == Buffer.input:
            return Buffer.output, index + rank * self.chunk_factor
        return buffer, index


class AllToAll(Collective):
    """out_r[q*chunk_factor + c] = in_q[r*chunk_factor + c]."""

    def __init__(self, num_ranks, chunk_factor, inplace):
        super().__init__(num_ranks, chunk_factor, inplace)
        self.name = "alltoall"

    def init_buffers(self):
        cf = self.chunk_factor
        n = self.num_ranks * cf
        buffers = []
        for r in range(self.num_ranks):
            input_buffer = [Chunk(r, i, i // cf, i % cf + r * cf) for i in range(n)]
            output_buffer = input_buffer if self.inplace else [None] * n
            buffers.append({Buffer.input: input_buffer, Buffer.output: output_buffer})
        return buffers

    def check(self, prog):
        cf = self.chunk_factor
        correct = True
        for r in range(self.num_ranks):
            output = prog.buffers[r][Buffer.output]
            for q in range(self.num_ranks):
                for c in range(cf):
                    index = q * cf + c
                    expected = Chunk(q, r * cf + c)
                    if output[index] is None or output[index] != expected:
                        self._report(r, index, expected, output[index])
                        correct = False
        return correct


class ReduceScatter(Collective):
    """out_r[c] = reduction over q of in_q[r*chunk_factor + c]."""

    def __init__(self, num_ranks, chunk_factor, inplace):
        super().__init__(num_ranks, chunk_factor, inplace)
        self.name = "reduce_scatter"

    def init_buffers(self):
        cf = self.chunk_factor
        buffers = []
        for r in range(self.num_ranks):
            input_buffer = [Chunk(r, q * cf + c, q, c)
                            for q in range(self.num_ranks) for c in range(cf)]
            if self.inplace:
                buffers.append({Buffer.input: input_buffer})
            else:
                buffers.append({Buffer.input: input_buffer, Buffer.output: [None] * cf})
        return buffers

    def check(self, prog):
        cf = self.chunk_factor
        buf = Buffer.input if self.inplace else Buffer.output
        correct = True
        for r in range(self.num_ranks):
            output = prog.buffers[r][buf]
            for c in range(cf):
                index = r * cf + c if self.inplace else c
                expected = _expected_reduction(self.num_ranks, r * cf + c)
                if output[index] is None or output[index] != expected:
                    self._report(r, index, expected, output[index])
                    correct = False
        return correct

    def get_buffer_index(self, rank, buffer, index):
        if self.inplace and buffer == Buffer.output:
            return Buffer.input, index + rank * self.chunk_factor
        return buffer, index


__all__ = ["Collective", "AllReduce", "AllGather", "AllToAll", "ReduceScatter"]
