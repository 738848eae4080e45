"""The chunk DSL, source-compatible with MSCCLang (``msccl.language``).

An MSCCLang program runs unchanged after ``msccl`` is replaced by ``efccl`` in its imports;
it is compiled by efccl's C++ core. Beyond MSCCLang: ``JSON()`` prints the EF JSON,
``save(path)`` writes EF JSON or (``.xml``) MSCCL XML, ``Compile()`` returns the
``efccl.Program``, and misuse raises ``efccl.Error`` with the core's message.
"""

from efccl._efccl import Error
from efccl.language.buffer import SymbolicBuffer
from efccl.language.chunk import Chunk, ReduceChunk
from efccl.language.ir import Buffer, Instruction, ThreadblockPolicy
from efccl.language.program import (
    Check,
    Compile,
    JSON,
    MSCCLProgram,
    Print,
    Ref,
    XML,
    chunk,
    create_scratch,
    save,
)
from efccl.language import collectives

__all__ = [
    "Buffer",
    "Check",
    "Chunk",
    "Compile",
    "Error",
    "Instruction",
    "JSON",
    "MSCCLProgram",
    "Print",
    "ReduceChunk",
    "Ref",
    "SymbolicBuffer",
    "ThreadblockPolicy",
    "XML",
    "chunk",
    "collectives",
    "create_scratch",
    "save",
]
