"""GC3 §6.3: hierarchical AllReduce for `nodes` nodes of `gpus` GPUs (in-place).

The buffer is cut into gpus * nodes chunks; chunk g*nodes + n is "owned" by GPU g of node n.
1. Inside each node, a ring reduce-scatter over the GPUs: GPU g ends with the node's sum of
   its group g (the `nodes` chunks g*nodes .. g*nodes+nodes-1, moved as one multi-chunk ref).
2. Across nodes, for each local index g, a ring reduce-scatter over the GPUs g of all nodes:
   GPU g of node n ends with the global sum of chunk g*nodes + n.
3. Across nodes, a ring allgather of those chunks (reverse of 2).
4. Inside each node, a ring allgather of the groups (reverse of 1).
Only 1/gpus of the data crosses the network, on `gpus` parallel rings (one per NIC).

    PYTHONPATH=build/python python3 examples/gc3/hierarchical_allreduce.py 2 4
"""

from efccl.language import *
from efccl.language.collectives import AllReduce
from efccl.topologies import distributed_fully_connected, fully_connected

import gc3_main


def ring_reduce_scatter(ranks, indices, size, ch):
    """Block indices[k] (size chunks) ends reduced over all `ranks` on ranks[k]."""
    n = len(ranks)
    for k in range(n):
        c = chunk(ranks[(k + 1) % n], Buffer.input, indices[k], size)
        for step in range(2, n + 1):
            c = chunk(ranks[(k + step) % n], Buffer.input, indices[k], size).reduce(c, ch=ch)


def ring_allgather(ranks, indices, size, ch):
    """Block indices[k] of ranks[k] is copied to every other rank of `ranks`."""
    n = len(ranks)
    for k in range(n):
        c = chunk(ranks[k], Buffer.input, indices[k], size)
        for step in range(1, n):
            c = c.copy(ranks[(k + step) % n], Buffer.input, indices[k], ch=ch)


def hierarchical_allreduce(nodes, gpus, instances=1, protocol="Simple"):
    size = nodes * gpus
    topology = distributed_fully_connected(fully_connected(gpus), nodes, 1)
    collective = AllReduce(size, size, inplace=True)

    def node_ranks(n):
        return [n * gpus + g for g in range(gpus)]

    def peer_ranks(g):
        return [n * gpus + g for n in range(nodes)]

    groups = [g * nodes for g in range(gpus)]
    # Instances replicate block-wise: the rings move multi-chunk groups, and MSCCLang's
    # interleaved replication supports only single-chunk ops on the input and output buffers
    # (efccl's compiler splits such ranges; msccl-tools would emit overlapping, racy ranges).
    prog = MSCCLProgram("hierarchical_allreduce", topology, collective, instances,
                        protocol=protocol, interleaved_replication=False)
    with prog:
        for n in range(nodes):
            ring_reduce_scatter(node_ranks(n), groups, nodes, ch=0)
        for g in range(gpus):
            ring_reduce_scatter(peer_ranks(g), [g * nodes + n for n in range(nodes)], 1, ch=1)
        for g in range(gpus):
            ring_allgather(peer_ranks(g), [g * nodes + n for n in range(nodes)], 1, ch=1)
        for n in range(nodes):
            ring_allgather(node_ranks(n), groups, nodes, ch=0)
        assert Check()
    return prog


if __name__ == "__main__":
    p = gc3_main.parser(__doc__)
    p.add_argument("nodes", type=int)
    p.add_argument("gpus", type=int, help="GPUs per node")
    p.add_argument("--instances", type=int, default=1)
    args = p.parse_args()
    gc3_main.emit(hierarchical_allreduce(args.nodes, args.gpus, args.instances, args.protocol),
                  args)
