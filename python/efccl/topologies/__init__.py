"""Topologies for DSL programs (MSCCLang's ``msccl.topologies``): a program may only copy or
reduce between linked ranks."""

from efccl.topologies.distributed import distributed_fully_connected, distributed_hub_and_spoke
from efccl.topologies.nvidia import dgx1, dgx_a100
from efccl.topologies.generic import fully_connected, hub_and_spoke, line, ring, star
from efccl.topologies.topology import Topology

__all__ = [
    "Topology",
    "dgx1",
    "dgx_a100",
    "distributed_fully_connected",
    "distributed_hub_and_spoke",
    "fully_connected",
    "hub_and_spoke",
    "line",
    "ring",
    "star",
]
