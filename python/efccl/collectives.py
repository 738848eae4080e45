"""Placeholder for ``msccl.collectives`` (the SCCL synthesizer's collective specifications).

MSCCLang programs sometimes ``from msccl.collectives import *`` without using anything from
it; after renaming ``msccl`` to ``efccl`` that import keeps working. The DSL's collectives are
in :mod:`efccl.language.collectives`.
"""

__all__ = []
