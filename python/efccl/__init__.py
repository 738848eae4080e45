"""efccl: an NCCL-compatible collective library whose data movement is EF programs.

This package is the Python front end:

* ``efccl.language`` (with ``efccl.language.collectives`` and ``efccl.topologies``): the chunk
  DSL, source-compatible with MSCCLang (``msccl.language``); the C++ core compiles it.
* The functions below, from the C++ core (``efccl._efccl``): the raw chunk API
  (:class:`ProgramBuilder`), compiled :class:`Program` objects, validation, the host reference
  executor and the built-in algorithm library.
* ``efccl.torch`` (needs torch; import it explicitly): the torch.distributed backend
  ``"efccl"`` (docs/torch.md). It does not need the C++ core, so it works where only the
  backend was built (python/torch_backend/build.sh).

Every failure of the C++ core is raised as :class:`Error` (a ``RuntimeError``) carrying the
core's message. Where the core is not built for this Python, ``import efccl`` still works and
using one of its names raises ImportError saying why.
"""

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

try:
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
except ImportError as _core_error:  # not built for this interpreter (efccl.torch alone)
    _core_import_error = _core_error

    def __getattr__(name):
        if name in __all__:
            raise ImportError(
                f"efccl.{name} needs efccl's C++ core (efccl._efccl), which could not be "
                f"imported: {_core_import_error}"
            )
        raise AttributeError(f"module 'efccl' has no attribute {name!r}")
