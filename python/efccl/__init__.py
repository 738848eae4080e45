"""efccl: an NCCL-compatible collective library whose data movement is EF programs.

This package is the Python front end:

* ``efccl.language`` (with ``efccl.language.collectives`` and ``efccl.topologies``): the chunk
  DSL, source-compatible with MSCCLang (``msccl.language``); the C++ core compiles it.
* The functions below, from the C++ core (``efccl._efccl``): the raw chunk API
  (:class:`ProgramBuilder`), compiled :class:`Program` objects, validation, the host reference
  executor and the built-in algorithm library.

Every failure of the C++ core is raised as :class:`Error` (a ``RuntimeError``) carrying the
core's message.
"""

from efccl._efccl import (
    Buffer,
    Error,
    Program,
    ProgramBuilder,
    Ref,
    compile,
    generate_algorithm,
    list_algorithms,
    load,
    loads,
    run_host,
    validate,
)

__all__ = [
    "Buffer",
    "Error",
    "Program",
    "ProgramBuilder",
    "Ref",
    "compile",
    "generate_algorithm",
    "list_algorithms",
    "load",
    "loads",
    "run_host",
    "validate",
]
