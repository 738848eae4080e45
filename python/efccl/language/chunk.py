"""The symbolic values the DSL's buffers hold while a program is traced.

A :class:`Chunk` is one chunk of some rank's input as it was when the call started; a
:class:`ReduceChunk` is the reduction of several such chunks. Collectives place chunks in the
input buffers (``init_buffers``) and inspect the output buffers after tracing (``check``).
"""

from dataclasses import dataclass


@dataclass
class Chunk:
    """Input chunk ``origin_index`` of rank ``origin_rank``; ``dst_rank``/``dst_index`` say where
    it is meant to end up (-1: several places or not stated)."""

    origin_rank: int
    origin_index: int
    dst_rank: int = -1
    dst_index: int = -1

    def reduce(self, dst, chunk):
        """The reduction of this chunk with ``chunk``, computed on rank ``dst``."""
        if isinstance(chunk, ReduceChunk):
            return chunk.reduce(dst, self)
        if isinstance(chunk, Chunk):
            return ReduceChunk(dst, [self, chunk])
        raise TypeError(f"cannot reduce {self} with {chunk!r}")

    def _key(self):
        return (self.origin_rank, self.origin_index)

    def __hash__(self):
        return hash(self._key())

    def __eq__(self, other):
        return type(other) is Chunk and self._key() == other._key()

    def __lt__(self, other):
        return self._key() < other._key()


@dataclass
class ReduceChunk:
    """The reduction of ``chunks`` (a multiset of :class:`Chunk`), first formed on
    ``creation_rank``. Two ReduceChunks are equal when they reduce the same chunks."""

    creation_rank: int
    chunks: list

    def reduce(self, dst, chunk):
        if isinstance(chunk, ReduceChunk):
            return ReduceChunk(self.creation_rank, self.chunks + chunk.chunks)
        if isinstance(chunk, Chunk):
            return ReduceChunk(self.creation_rank, self.chunks + [chunk])
        raise TypeError(f"cannot reduce {self} with {chunk!r}")

    def sort(self):
        self.chunks.sort()

    def __hash__(self):
        return hash(tuple(sorted(self.chunks)))

    def __eq__(self, other):
        return isinstance(other, ReduceChunk) and sorted(self.chunks) == sorted(other.chunks)
