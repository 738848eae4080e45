"""GC3 Fig. 10a: two-step (hierarchical) AllToAll for `nodes` nodes of `gpus` GPUs.

Step 1 (inside a node): for every other node n2, each GPU g1 gives the chunk bound for GPU g2
of node n2 to its local peer g2, which collects them in the scratch buffer `to_<n2>`.
Step 2 (across nodes): GPU g of node n1 sends its whole `to_<n2>` buffer (`gpus` contiguous
chunks) to GPU g of node n2 in one transfer, straight into the output slots the chunks are
bound for. Chunks for the own node go directly. Cross-node traffic is thus `gpus` times
fewer, `gpus` times larger messages, one per GPU pair with the same local index (one NIC each).

    PYTHONPATH=build/python python3 examples/gc3/fig10a_two_step_alltoall.py 2 4
"""

from efccl.language import *
from efccl.language.collectives import AllToAll
from efccl.topologies import distributed_fully_connected, fully_connected

import gc3_main


def two_step_alltoall(nodes, gpus, instances=1, protocol="Simple"):
    size = nodes * gpus
    topology = distributed_fully_connected(fully_connected(gpus), nodes, 1)
    collective = AllToAll(size, 1, inplace=False)

    def rank(n, g):
        return n * gpus + g

    prog = MSCCLProgram("alltoall_two_step", topology, collective, instances,
                        protocol=protocol)
    with prog:
        for n1 in range(nodes):
            for hop in range(1, nodes):
                n2 = (n1 + hop) % nodes
                # Step 1: gather, on GPU g2 of node n1, the chunks bound for GPU g2 of n2.
                for g1 in range(gpus):
                    for g2 in range(gpus):
                        c = chunk(rank(n1, g1), Buffer.input, rank(n2, g2))
                        c.copy(rank(n1, g2), f"to_{n2}", g1)
                # Step 2: one cross-node transfer per GPU into the destination's output.
                for g in range(gpus):
                    c = chunk(rank(n1, g), f"to_{n2}", 0, gpus)
                    c.copy(rank(n2, g), Buffer.output, c.get_dst_index(), ch=hop - 1)
        # Chunks that stay inside their node go directly.
        for r in range(size):
            n = r // gpus
            for g in range(gpus):
                c = chunk(r, Buffer.input, rank(n, g))
                c.copy(c.get_dst_rank(), Buffer.output, c.get_dst_index())
        assert Check()
    return prog


if __name__ == "__main__":
    p = gc3_main.parser(__doc__)
    p.add_argument("nodes", type=int)
    p.add_argument("gpus", type=int, help="GPUs per node")
    p.add_argument("--instances", type=int, default=1)
    args = p.parse_args()
    gc3_main.emit(two_step_alltoall(args.nodes, args.gpus, args.instances, args.protocol), args)
