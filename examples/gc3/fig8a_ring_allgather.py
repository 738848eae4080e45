"""GC3 Fig. 8a (as recalled, see README.md): ring AllGather, the small program the paper uses to
walk through compilation (trace -> chunk DAG -> instruction DAG -> fused rcs -> threadblocks).

Each rank's input chunk is copied into its own output slot and sent around the ring; every
intermediate rank receives it into its output and sends it on (fused into one rcs).

    PYTHONPATH=build/python python3 examples/gc3/fig8a_ring_allgather.py 4
"""

from efccl.language import *
from efccl.language.collectives import AllGather
from efccl.topologies import ring

import gc3_main


def ring_allgather(size, chunk_factor=1, instances=1, inplace=False, protocol="Simple"):
    collective = AllGather(size, chunk_factor, inplace)
    prog = MSCCLProgram("allgather_ring", ring(size), collective, instances,
                        protocol=protocol)
    with prog:
        for r in range(size):
            for k in range(chunk_factor):
                index = r * chunk_factor + k
                c = chunk(r, Buffer.input, k)
                # Own chunk into the output (nothing in-place, where the input aliases it; the
                # result is not used: MSCCLang returns None for a copy onto itself).
                c.copy(r, Buffer.output, index)
                for step in range(1, size):
                    c = c.copy((r + step) % size, Buffer.output, index, ch=k)
        assert Check()
    return prog


if __name__ == "__main__":
    p = gc3_main.parser(__doc__)
    p.add_argument("size", type=int, help="number of ranks")
    p.add_argument("--chunks", type=int, default=1, help="chunks per rank")
    p.add_argument("--instances", type=int, default=1)
    p.add_argument("--inplace", action="store_true")
    args = p.parse_args()
    gc3_main.emit(ring_allgather(args.size, args.chunks, args.instances, args.inplace,
                                 args.protocol), args)
