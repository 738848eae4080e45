"""GC3 Fig. 1a: ring AllReduce written with chunk operations.

Chunk r of every rank is reduced along the ring starting at rank r (each step reduces the
running value into the next rank's chunk), which leaves the full reduction on rank r-1; that
value then travels the ring once more so every rank holds it. With several channels each
rank's chunk is split into `channels` parts that go around independent rings. The compiler
fuses the steps into rrs / rrcs / rcs ops.

    PYTHONPATH=build/python python3 examples/gc3/fig1a_ring_allreduce.py 4 --channels 2
"""

from efccl.language import *
from efccl.language.collectives import AllReduce
from efccl.topologies import ring

import gc3_main


def ring_allreduce(size, channels=1, instances=1, protocol="Simple"):
    collective = AllReduce(size, size * channels, inplace=True)
    prog = MSCCLProgram("allreduce_ring", ring(size), collective, instances,
                        protocol=protocol)
    with prog:
        for ch in range(channels):
            for r in range(size):
                index = r * channels + ch
                # Reduce: r -> r+1 -> ... -> r-1, each adding its own chunk `index`.
                c = chunk(r, Buffer.input, index)
                for step in range(1, size):
                    c = chunk((r + step) % size, Buffer.input, index).reduce(c, ch=ch)
                # Broadcast the result from r-1 around the ring: r, r+1, ..., r-2.
                for step in range(0, size - 1):
                    c = c.copy((r + step) % size, Buffer.input, index, ch=ch)
        assert Check()
    return prog


if __name__ == "__main__":
    p = gc3_main.parser(__doc__)
    p.add_argument("size", type=int, help="number of ranks")
    p.add_argument("--channels", type=int, default=1)
    p.add_argument("--instances", type=int, default=1)
    args = p.parse_args()
    gc3_main.emit(ring_allreduce(args.size, args.channels, args.instances, args.protocol), args)
