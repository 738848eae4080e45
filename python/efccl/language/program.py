"""MSCCLProgram: tracing a DSL program and handing it to the C++ compiler.

Inside ``with MSCCLProgram(...):`` every ``Ref.copy`` / ``Ref.reduce`` does two things:

* it records the operation in a C++ ``ProgramBuilder`` (efccl._efccl), which checks it at
  once (a read of a chunk nothing wrote, an index outside a buffer, ...) and later compiles
  the trace (GC3 §5) into an EF program;
* it updates a symbolic copy of every buffer (``prog.buffers``: :class:`Chunk` /
  :class:`ReduceChunk` values, MSCCLang's representation), which ``Check()``, a collective's
  ``check`` and ``Ref.get_dst_index()`` read.

A ``Ref`` names a location (rank, buffer, index, size), as in MSCCLang: it always reads what
the location holds now.
"""

import os
import sys

from efccl import _efccl
from efccl.language.buffer import SymbolicBuffer
from efccl.language.chunk import Chunk, ReduceChunk
from efccl.language.ir import Buffer, ThreadblockPolicy

_current_program = None

# `efccl compile PROG.py -o FILE` runs PROG.py with EFCCL_COMPILE_OUTPUT=FILE: the program it
# compiles is saved there (where it calls XML() / JSON(), else when its `with MSCCLProgram`
# block ends) instead of printed. One program per run: the path is written by one program.
_COMPILE_OUTPUT_ENV = "EFCCL_COMPILE_OUTPUT"
_compile_output_owner = None


def _compile_output():
    path = os.environ.get(_COMPILE_OUTPUT_ENV)
    return path if path else None


def _save_compile_output(prog, path):
    """Saves ``prog`` to ``path`` (the EFCCL_COMPILE_OUTPUT target); refuses a second program."""
    global _compile_output_owner
    if _compile_output_owner is not None and _compile_output_owner is not prog:
        raise RuntimeError(f"{path}: this script compiles more than one program; "
                           f"efccl compile writes only one (the first, "
                           f"'{_compile_output_owner.name}', was saved already)")
    prog.save(path)
    _compile_output_owner = prog


def _curr():
    if _current_program is None:
        raise RuntimeError("No Program in context")
    return _current_program


def _is_named(buffer):
    """Scratch buffers: Buffer.scratch and any other key (MSCCLang names them with strings,
    sometimes tuples)."""
    return buffer is not Buffer.input and buffer is not Buffer.output


class MSCCLProgram:
    """A DSL program for ``collective`` on ``topo``; use it as a context manager.

    ``instances`` replicates the program (GC3 instances); ``interleaved_replication``,
    ``instr_fusion`` and ``dependence_nop`` switch the compiler passes of the same names;
    ``check_xml`` runs the EF validator on the compiled program; ``threadblock_policy``
    ``manual`` honours each operation's ``sendtb``/``recvtb`` (``auto`` ignores them, as
    MSCCLang does).
    """

    def __init__(self, name, topo, collective, instances, protocol="Simple",
                 threadblock_policy=ThreadblockPolicy.auto, interleaved_replication=True,
                 instr_fusion=True, check_xml=True, dependence_nop=False):
        self.name = name
        self.topo = topo
        self.collective = collective
        self.num_ranks = topo.num_nodes()
        self.instances = instances
        self.protocol = protocol
        self.threadblock_policy = threadblock_policy
        self.interleaved_replication = interleaved_replication
        self.instr_fusion = instr_fusion
        self.check_xml = check_xml
        self.dependence_nop = dependence_nop
        if protocol not in ("Simple", "LL", "LL128"):
            raise ValueError(f"Given protocol: {protocol}. Must be either Simple, LL, LL128")
        if collective.num_ranks != self.num_ranks:
            raise ValueError(f"the collective has {collective.num_ranks} ranks but the topology "
                             f"{getattr(topo, 'name', topo)} has {self.num_ranks}")
        self._custom = collective.name == "custom"
        self.buffers = self._symbolic_buffers(collective.init_buffers())

        chunk_factor = collective.chunk_factor
        if self._custom:
            # A custom collective's buffers may be longer than chunk_factor; the program's
            # chunks per loop must cover the longest.
            for rank_buffers in self.buffers:
                for key in (Buffer.input, Buffer.output):
                    chunk_factor = max(chunk_factor, len(rank_buffers.get(key, ())))
        # Custom collectives: the builder treats input and output as distinct buffers (the
        # collective's get_buffer_index does any aliasing) and marks the program in-place
        # only where it is correct under EF's custom aliasing (input == output).
        self._builder = _efccl.ProgramBuilder(
            name, collective.name, self.num_ranks, chunk_factor,
            inplace=bool(collective.inplace) and not self._custom, protocol=protocol,
            instances=instances, fuse_rcs=instr_fusion, fuse_rrcs=instr_fusion,
            fuse_rrs=instr_fusion, dependence_nop=dependence_nop,
            interleaved_replication=interleaved_replication, validate=check_xml)
        if self._custom:
            for r, rank_buffers in enumerate(self.buffers):
                self._builder.set_buffer_sizes(r, len(rank_buffers.get(Buffer.input, ())),
                                               len(rank_buffers.get(Buffer.output, ())))
        # Where each initial chunk lives in the input buffers (postconditions name those).
        self._input_position = {}
        for r, rank_buffers in enumerate(self.buffers):
            for i, c in enumerate(rank_buffers.get(Buffer.input, ())):
                if isinstance(c, Chunk):
                    self._input_position.setdefault((c.origin_rank, c.origin_index), (r, i))
        self._named = {}
        self._program = None
        self._compiled_at = -1

    # ---- context manager ----
    def __enter__(self):
        global _current_program
        if _current_program is not None:
            raise RuntimeError("There is already a MSCCL Program in context")
        _current_program = self
        return self

    def __exit__(self, exc_type, exc_value, exc_traceback):
        global _current_program
        if _current_program is not self:
            raise RuntimeError("This program is not currently in context")
        _current_program = None
        path = _compile_output()
        if exc_type is None and path is not None and _compile_output_owner is not self:
            _save_compile_output(self, path)

    # ---- buffers ----
    @staticmethod
    def _symbolic_buffers(init):
        if init is None:
            raise ValueError("the collective's init_buffers() returned nothing")
        wrapped = {}
        out = []
        for rank_buffers in init:
            d = {}
            for key, lst in rank_buffers.items():
                # Buffers that are one list (in-place aliasing) stay one buffer.
                if id(lst) not in wrapped:
                    wrapped[id(lst)] = SymbolicBuffer(lst)
                d[key] = wrapped[id(lst)]
            out.append(d)
        return out

    def _buffer(self, rank, buffer):
        """The symbolic buffer (created empty for scratch and named buffers)."""
        rank_buffers = self.buffers[rank]
        if buffer not in rank_buffers:
            if not _is_named(buffer):
                raise _efccl.Error(f"rank {rank} has no {buffer.name} buffer in this collective")
            rank_buffers[buffer] = SymbolicBuffer([])
        return rank_buffers[buffer]

    def check_buffer_exists(self, rank, name):
        self._buffer(rank, name)

    def _cpp_buffer(self, buffer):
        if buffer is Buffer.input:
            return _efccl.Buffer.input
        if buffer is Buffer.output:
            return _efccl.Buffer.output
        if buffer is Buffer.scratch:
            return _efccl.Buffer.scratch
        if buffer not in self._named:
            self._named[buffer] = self._builder.scratch_buffer(str(buffer))
        return self._named[buffer]

    def _cpp_ref(self, ref):
        return self._builder.chunk(ref.rank, self._cpp_buffer(ref.buffer), ref.index, ref.size)

    def get_ref(self, rank, buffer, index, size):
        buffer, index = self.collective.get_buffer_index(rank, buffer, index)
        return Ref(rank, buffer, index, size, self)

    def get_chunks(self, rank, buffer, index, size=1):
        buf = self.buffers[rank].get(buffer)
        return [buf[index + i] if buf is not None and index + i < len(buf) else None
                for i in range(size)]

    def _tbs(self, sendtb, recvtb):
        if self.threadblock_policy == ThreadblockPolicy.manual:
            return sendtb, recvtb
        return -1, -1

    def _check_link(self, src, dst):
        if src != dst and not self.topo.link(src, dst):
            raise _efccl.Error(f"No link from {src} to {dst} in topology "
                               f"{getattr(self.topo, 'name', self.topo)}")

    def _require_values(self, ref, what):
        # The C++ builder knows which chunks are written except a custom collective's input
        # holes (init_buffers left them None): those are checked here.
        for i, c in enumerate(self.get_chunks(ref.rank, ref.buffer, ref.index, ref.size)):
            if c is None:
                raise _efccl.Error(f"{what}: reads rank {ref.rank} {_buffer_name(ref.buffer)}"
                                   f"[{ref.index + i}], which was never written")

    # ---- operations (called by Ref) ----
    def apply_send(self, src, dst_ref, sendtb, recvtb, ch):
        if self._custom:
            self._require_values(src, "copy")
        s, r = self._tbs(sendtb, recvtb)
        self._cpp_ref(src).copy(dst_ref.rank, self._cpp_buffer(dst_ref.buffer), dst_ref.index,
                                s, r, ch)
        values = self.get_chunks(src.rank, src.buffer, src.index, src.size)
        db = self._buffer(dst_ref.rank, dst_ref.buffer)
        for i, v in enumerate(values):
            db.put(dst_ref.index + i, v)

    def apply_reduce(self, dst, other, sendtb, recvtb, ch):
        if self._custom:
            self._require_values(dst, "reduce")
            self._require_values(other, "reduce")
        s, r = self._tbs(sendtb, recvtb)
        self._cpp_ref(dst).reduce(self._cpp_ref(other), s, r, ch)
        theirs = self.get_chunks(other.rank, other.buffer, other.index, other.size)
        db = self._buffer(dst.rank, dst.buffer)
        for i, v in enumerate(theirs):
            db.put(dst.index + i, db[dst.index + i].reduce(dst.rank, v))

    # ---- results ----
    def check(self):
        """The collective's check of the traced buffers (True when correct)."""
        return self.collective.check(self)

    def _sources(self, value):
        chunks = value.chunks if isinstance(value, ReduceChunk) else [value]
        out = []
        for c in chunks:
            key = (c.origin_rank, c.origin_index)
            out.append(self._input_position.get(key, key))
        return sorted(out)

    def _custom_postconditions(self):
        """What a custom collective's output must hold: the output chunks its check() reads,
        with the values the trace left there, once check() has accepted them. A collective
        without a check (None) gets every output chunk the trace wrote."""
        outputs = {r: b[Buffer.output] for r, b in enumerate(self.buffers) if Buffer.output in b}
        for b in outputs.values():
            b.start_recording()
        try:
            verdict = self.collective.check(self)
        finally:
            read = {r: b.stop_recording() for r, b in outputs.items()}
        if verdict is not None and not verdict:
            raise _efccl.Error(f"{self.name}: the collective's check() rejects the traced "
                               f"result, so it cannot be compiled")
        if verdict is None or not any(read.values()):
            read = {r: {i for i, v in enumerate(b) if v is not None} for r, b in outputs.items()}
        posts = []
        for r in sorted(read):
            for i in sorted(read[r]):
                value = outputs[r][i] if i < len(outputs[r]) else None
                if value is None:
                    raise _efccl.Error(f"{self.name}: check() accepted rank {r} output[{i}], "
                                       f"which the program never writes")
                posts.append((r, i, self._sources(value)))
        if not posts:
            raise _efccl.Error(f"{self.name}: the program writes no output chunk")
        return posts

    def compile(self):
        """The compiled EF program (efccl.Program); raises efccl.Error with the compiler's
        message when the trace does not compute the collective or fails validation."""
        length = self._builder.trace_length
        if self._program is None or length != self._compiled_at:
            if self._custom:
                self._builder.set_postconditions(self._custom_postconditions())
            self._program = self._builder.compile()
            self._compiled_at = length
        return self._program

    def generate_xml(self):
        return self.compile().to_msccl_xml()

    def _print_xml(self):
        program = self.compile()
        if self._custom:
            # MSCCL XML has no form for postconditions; EF JSON keeps the program runnable
            # (`efccl` tools tell the formats apart by content).
            print(f"efccl: MSCCL XML cannot express the custom collective of '{self.name}'; "
                  f"printing EF JSON instead", file=sys.stderr)
            sys.stdout.write(program.to_json())
        else:
            print(program.to_msccl_xml())

    def generate_json(self):
        return self.compile().to_json()

    def save(self, path):
        self.compile().save(path)


def _buffer_name(buffer):
    return buffer.name if isinstance(buffer, Buffer) else f"scratch '{buffer}'"


class Ref:
    """Chunks index .. index+size-1 of ``buffer`` on ``rank`` (a location, as in MSCCLang)."""

    def __init__(self, rank, buffer, index, size, prog):
        self.rank = rank
        self.buffer = buffer
        self.index = index
        self.size = size
        self.prog = prog

    def __repr__(self):
        return f"Ref(Buffer:{self.buffer}, Index:{self.index}, Size:{self.size}, Rank:{self.rank})"

    def __eq__(self, other):
        return (isinstance(other, Ref) and
                (self.rank, self.buffer, self.index, self.size) ==
                (other.rank, other.buffer, other.index, other.size))

    def __hash__(self):
        return hash((self.rank, self.buffer, self.index, self.size))

    def _end(self):
        return self.index + self.size

    def _get_chunk(self, index):
        return self.prog._buffer(self.rank, self.buffer)[index]

    def split(self, num):
        """``num`` equal consecutive parts of this reference."""
        if self.size % num != 0:
            raise ValueError(f"Trying to split a chunk of {self.size} elements into {num} parts")
        size = self.size // num
        return [Ref(self.rank, self.buffer, self.index + i * size, size, self.prog)
                for i in range(num)]

    def group(self, other):
        """The smallest reference covering this one and ``other`` (same rank and buffer)."""
        if self.rank != other.rank:
            raise ValueError(f"Trying to concatenate chunks on ranks {self.rank} and {other.rank}")
        if self.buffer != other.buffer:
            raise ValueError(f"Trying to concatenate chunks in {self.buffer} and {other.buffer}")
        first = min(self.index, other.index)
        end = max(self._end(), other._end())
        return Ref(self.rank, self.buffer, first, end - first, self.prog)

    def copy(self, dst, buffer=None, index=-1, sendtb=-1, recvtb=-1, ch=-1):
        """Copies these chunks to ``index`` of ``buffer`` on rank ``dst`` and returns a
        reference to the copy. No buffer: the same buffer and index; a scratch or named
        buffer without an index: appended after what the buffer holds on ``dst``."""
        prog = self.prog
        if buffer is None:
            buffer = self.buffer
            if index == -1:
                index = self.index
        if index == -1:
            if _is_named(buffer):
                index = len(prog._buffer(dst, buffer))
            else:
                raise ValueError(f"copy to {buffer} needs an index")
        # MSCCLang maps the destination with the *source* rank (programs for in-place
        # allgather rely on it: copy(r2, Buffer.input, i) lands in r2's output block of the
        # sender).
        buffer, index = prog.collective.get_buffer_index(self.rank, buffer, index)
        prog._check_link(self.rank, dst)
        dst_ref = Ref(dst, buffer, index, self.size, prog)
        if dst_ref == self:
            return dst_ref  # a copy onto itself (e.g. under in-place aliasing): nothing to do
        if _is_named(buffer):
            prog._buffer(dst, buffer)
        prog.apply_send(self, dst_ref, sendtb, recvtb, ch)
        return dst_ref

    def reduce(self, other_chunkref, sendtb=-1, recvtb=-1, ch=-1):
        """Stores (other (op) this) here, receiving ``other`` from its rank when it is
        remote, and returns this reference."""
        self.prog._check_link(other_chunkref.rank, self.rank)
        self.prog.apply_reduce(self, other_chunkref, sendtb, recvtb, ch)
        return self

    def get_origin_index(self, index=0):
        return self._get_chunk(index + self.index).origin_index

    def get_origin_rank(self, index=0):
        return self._get_chunk(index + self.index).origin_rank

    def get_dst_index(self, index=0):
        return self._get_chunk(index + self.index).dst_index

    def get_dst_rank(self, index=0):
        return self._get_chunk(index + self.index).dst_rank

    def print_chunk_info(self, index=0):
        print(self._get_chunk(index + self.index))


def chunk(rank, buffer, index, size=1):
    """A reference to chunks index .. index+size-1 of ``buffer`` on ``rank``. Unlike MSCCLang,
    an unwritten location gives a reference too; reading it raises efccl.Error."""
    prog = _curr()
    if not 0 <= rank < prog.num_ranks:
        raise _efccl.Error(f"rank {rank} out of range 0..{prog.num_ranks - 1}")
    ref = prog.get_ref(rank, buffer, index, size)
    if _is_named(ref.buffer):
        prog._buffer(rank, ref.buffer)
    prog._cpp_ref(ref)  # range check now, with the core's message
    return ref


def create_scratch(rank, name):
    """Creates the named scratch buffer ``name`` on ``rank`` (chunk() and copy() also do)."""
    _curr()._buffer(rank, name)
    return name


def Check():
    """The collective's check of the traced buffers (prints what is wrong)."""
    return _curr().check()


def XML():
    """Prints the compiled program as MSCCL XML (EF JSON for custom collectives, with a note
    on stderr: MSCCL XML cannot state their postconditions). Under `efccl compile`
    (EFCCL_COMPILE_OUTPUT set) the program is saved to that path instead."""
    path = _compile_output()
    if path is not None:
        _save_compile_output(_curr(), path)
        return
    _curr()._print_xml()


def JSON():
    """Prints the compiled program as EF JSON. Under `efccl compile` (EFCCL_COMPILE_OUTPUT
    set) the program is saved to that path instead."""
    path = _compile_output()
    if path is not None:
        _save_compile_output(_curr(), path)
        return
    sys.stdout.write(_curr().generate_json())


def Compile():
    """The compiled program of the current MSCCLProgram (an efccl.Program)."""
    return _curr().compile()


def save(path):
    """Writes the compiled program: MSCCL XML when ``path`` ends in .xml, else EF JSON."""
    _curr().save(path)


def Print():
    """Prints the trace so far, one line per output buffer slot that holds a value."""
    prog = _curr()
    for r, rank_buffers in enumerate(prog.buffers):
        for key, buf in rank_buffers.items():
            for i, v in enumerate(buf):
                if v is not None:
                    print(f"rank {r} {_buffer_name(key)}[{i}]: {v}")
