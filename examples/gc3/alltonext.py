"""GC3 §6.4: AllToNext, a custom collective: rank r sends its whole buffer to rank r+1
(pipeline parallelism); the last rank sends nothing.

Inside a node the buffer goes directly (one multi-chunk copy). Across a node boundary one
NIC would carry everything, so the last GPU of node n splits its buffer into `gpus` chunks:
chunk c goes to GPU c of node n (scratch), over the network to GPU c of node n+1 (scratch),
then to GPU 0 of node n+1, its destination. All `gpus` NICs carry a share.

The collective says where data starts (init_buffers: every rank but the last holds `gpus`
chunks, each bound for the same index on the next rank) and what must hold at the end
(check). efccl compiles the output chunks that check() inspects into the program's
postconditions, which `efccl run-host` verifies.

    PYTHONPATH=build/python python3 examples/gc3/alltonext.py 2 4 --json
"""

from efccl.language import *
from efccl.language.collectives import Collective
from efccl.topologies import distributed_fully_connected, fully_connected

import gc3_main


class AllToNextCollective(Collective):
    def init_buffers(self):
        buffers = []
        for r in range(self.num_ranks):
            input_buffer = [None] * self.chunk_factor
            if r != self.num_ranks - 1:
                input_buffer = [Chunk(r, c, r + 1, c) for c in range(self.chunk_factor)]
            buffers.append({Buffer.input: input_buffer,
                            Buffer.output: [None] * self.chunk_factor})
        return buffers

    def check(self, prog):
        correct = True
        for r in range(1, self.num_ranks):
            output = prog.buffers[r][Buffer.output]
            for c in range(self.chunk_factor):
                got = output[c]
                if got is None or got.origin_rank != r - 1 or got.origin_index != c:
                    print(f"Rank {r} chunk {c} should be ({r - 1}, {c}), given {got}")
                    correct = False
        return correct


def alltonext(nodes, gpus, instances=1, protocol="Simple"):
    size = nodes * gpus
    topology = distributed_fully_connected(fully_connected(gpus), nodes, 1)
    collective = AllToNextCollective(size, gpus, inplace=False)

    def rank(n, g):
        return n * gpus + g

    prog = MSCCLProgram("alltonext", topology, collective, instances, protocol=protocol)
    with prog:
        for r in range(size - 1):
            n, g = divmod(r, gpus)
            if g != gpus - 1:
                chunk(r, Buffer.input, 0, gpus).copy(r + 1, Buffer.output, 0, ch=g % 2)
                continue
            # Crossing to node n+1: scatter, one network hop per GPU, gather on (n+1, 0).
            link = f"net_{n}"
            for c in range(gpus):
                x = chunk(r, Buffer.input, c)
                if c != g:
                    x = x.copy(rank(n, c), link, 0, ch=c % 2)
                if c != 0:
                    x = x.copy(rank(n + 1, c), link, 0, ch=c % 2)
                x.copy(r + 1, Buffer.output, x.get_dst_index(), ch=c % 2)
        assert Check()
    return prog


if __name__ == "__main__":
    p = gc3_main.parser(__doc__)
    p.add_argument("nodes", type=int)
    p.add_argument("gpus", type=int, help="GPUs per node")
    p.add_argument("--instances", type=int, default=1)
    args = p.parse_args()
    gc3_main.emit(alltonext(args.nodes, args.gpus, args.instances, args.protocol), args)
