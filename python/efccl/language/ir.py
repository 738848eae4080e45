"""Names of the DSL's buffers and policies (MSCCLang's ``msccl.language.ir`` spelling)."""

from enum import Enum


class Buffer(Enum):
    """The three buffers of every rank. Named scratch buffers are plain strings."""

    input = "i"
    output = "o"
    scratch = "s"

    def __str__(self):
        return self.value

    def __lt__(self, other):
        return self.value < other.value


class ThreadblockPolicy(Enum):
    """auto: the compiler places ops on threadblocks (sendtb/recvtb are ignored);
    manual: every op goes on the threadblocks its sendtb/recvtb name."""

    auto = "auto"
    manual = "manual"

    def __str__(self):
        return self.value


class Instruction(Enum):
    """The op codes of the compiled program, in MSCCL XML spelling."""

    nop = "nop"
    send = "s"
    recv = "r"
    recv_copy_send = "rcs"
    recv_reduce_send = "rrs"
    recv_reduce_copy = "rrc"
    recv_reduce_copy_send = "rrcs"
    copy = "cpy"
    reduce = "re"

    def __str__(self):
        return self.value
