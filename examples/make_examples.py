#!/usr/bin/env python3
"""Writes the hand-made EF JSON example programs in examples/ef/ (one per collective).

They are small, readable programs that exercise every op, dependencies, scratch buffers,
several channels and a custom collective. The built-in algorithm library (ef_format/algorithms)
generates the production programs; these are for reading and for the quick start.

    python3 examples/make_examples.py            # rewrites examples/ef/*.json
"""
import json
import os
import sys


def ref(buf, off):
    return {"buf": buf, "off": off}


def op(code, count=1, src=None, dst=None, deps=None):
    o = {"op": code}
    if src is not None:
        o["src"] = src
    if dst is not None:
        o["dst"] = dst
    o["count"] = count
    if deps:
        o["deps"] = [{"tb": t, "op": i} for t, i in deps]
    return o


def tb(ops, send=-1, recv=-1, channel=0):
    return {"send": send, "recv": recv, "channel": channel, "ops": ops}


def rank(threadblocks, i, o, s=0):
    return {"input_chunks": i, "output_chunks": o, "scratch_chunks": s,
            "threadblocks": threadblocks}


def program(name, collective, nranks, nchunks, ranks, nchannels=1, root=0,
            inplace=True, outofplace=True, protocol="Simple", postconditions=None):
    p = {"format": "efccl-ef", "version": 1, "name": name, "collective": collective,
         "protocol": protocol, "nranks": nranks, "nchunksperloop": nchunks,
         "nchannels": nchannels, "root": root, "inplace": inplace, "outofplace": outofplace,
         "min_bytes": 0, "max_bytes": None, "ranks": ranks}
    if postconditions is not None:
        p["postconditions"] = postconditions
    return p


def ring_allreduce(n, channels):
    """Ring reduce-scatter then ring allgather, fused (send, rrs.., rrcs, rcs.., recv);
    `channels` independent rings, each over n consecutive chunks."""
    ranks = []
    for r in range(n):
        tbs = []
        for ch in range(channels):
            base = ch * n
            c = lambda k: base + (k % n)
            ops = [op("send", src=ref("input", c(r)))]
            for s in range(1, n - 1):
                ops.append(op("rrs", src=ref("input", c(r - s))))
            last = c(r + 1)
            ops.append(op("rrcs", src=ref("input", last), dst=ref("output", last)))
            for s in range(1, n - 1):
                ops.append(op("rcs", dst=ref("output", c(r + 1 - s))))
            ops.append(op("recv", dst=ref("output", c(r + 2))))
            tbs.append(tb(ops, send=(r + 1) % n, recv=(r - 1) % n, channel=ch))
        ranks.append(rank(tbs, n * channels, n * channels))
    return program(f"ring_allreduce_{n}r_{channels}ch", "allreduce", n, n * channels, ranks,
                   nchannels=channels)


def ring_allgather(n):
    ranks = []
    for r in range(n):
        ops = [op("copy", src=ref("input", 0), dst=ref("output", r)),
               op("send", src=ref("output", r))]
        for s in range(1, n - 1):
            ops.append(op("rcs", dst=ref("output", (r - s) % n)))
        ops.append(op("recv", dst=ref("output", (r + 1) % n)))
        ranks.append(rank([tb(ops, send=(r + 1) % n, recv=(r - 1) % n)], 1, n))
    return program(f"ring_allgather_{n}r", "allgather", n, n, ranks)


def ring_reducescatter(n):
    """Chunk c travels from rank c+1 around the ring and ends reduced on rank c."""
    ranks = []
    for r in range(n):
        ops = [op("send", src=ref("input", (r - 1) % n))]
        for s in range(1, n - 1):
            ops.append(op("rrs", src=ref("input", (r - 1 - s) % n)))
        ops.append(op("rrc", src=ref("input", r), dst=ref("output", 0)))
        ranks.append(rank([tb(ops, send=(r + 1) % n, recv=(r - 1) % n)], n, 1))
    return program(f"ring_reducescatter_{n}r", "reducescatter", n, n, ranks)


def direct_alltoall(n):
    """One threadblock per peer and direction; out-of-place only (an in-place receive could
    overwrite a block before it is sent)."""
    ranks = []
    for r in range(n):
        tbs = [tb([op("copy", src=ref("input", r), dst=ref("output", r))])]
        for p in range(n):
            if p != r:
                tbs.append(tb([op("send", src=ref("input", p))], send=p))
                tbs.append(tb([op("recv", dst=ref("output", p))], recv=p))
        ranks.append(rank(tbs, n, n))
    return program(f"direct_alltoall_{n}r", "alltoall", n, n, ranks, inplace=False)


def chain_broadcast(n, nchunks, root=0):
    """A pipeline root -> root+1 -> ...; each chunk is forwarded as soon as it arrives."""
    ranks = []
    order = [(root + k) % n for k in range(n)]
    for r in range(n):
        pos = order.index(r)
        nxt = order[pos + 1] if pos + 1 < n else -1
        prv = order[pos - 1] if pos > 0 else -1
        if pos == 0:
            ops = [op("copy", count=nchunks, src=ref("input", 0), dst=ref("output", 0))]
            ops += [op("send", src=ref("input", c)) for c in range(nchunks)]
            ranks.append(rank([tb(ops, send=nxt)], nchunks, nchunks))
        elif nxt >= 0:
            ranks.append(rank([tb([op("rcs", dst=ref("output", c)) for c in range(nchunks)],
                                  send=nxt, recv=prv)], nchunks, nchunks))
        else:
            ranks.append(rank([tb([op("recv", dst=ref("output", c)) for c in range(nchunks)],
                                  recv=prv)], nchunks, nchunks))
    return program(f"chain_broadcast_{n}r", "broadcast", n, nchunks, ranks, root=root)


def chain_reduce(n, nchunks, root):
    """Partial sums flow root+1 -> root+2 -> ... -> root, which reduces the last hop into
    its output."""
    ranks = []
    order = [(root + 1 + k) % n for k in range(n)]  # ends with the root
    for r in range(n):
        pos = order.index(r)
        if pos == 0:
            ops = [op("send", src=ref("input", c)) for c in range(nchunks)]
            ranks.append(rank([tb(ops, send=order[1])], nchunks, 0))
        elif r != root:
            ops = [op("rrs", src=ref("input", c)) for c in range(nchunks)]
            ranks.append(rank([tb(ops, send=order[pos + 1], recv=order[pos - 1])], nchunks, 0))
        else:
            ops = [op("rrc", src=ref("input", c), dst=ref("output", c)) for c in range(nchunks)]
            ranks.append(rank([tb(ops, recv=order[pos - 1])], nchunks, nchunks))
    return program(f"chain_reduce_{n}r", "reduce", n, nchunks, ranks, root=root)


def direct_gather(n, root):
    ranks = []
    for r in range(n):
        if r == root:
            tbs = [tb([op("copy", src=ref("input", 0), dst=ref("output", r))])]
            tbs += [tb([op("recv", dst=ref("output", p))], recv=p) for p in range(n) if p != r]
            ranks.append(rank(tbs, 1, n))
        else:
            ranks.append(rank([tb([op("send", src=ref("input", 0))], send=root)], 1, 0))
    return program(f"direct_gather_{n}r", "gather", n, n, ranks, root=root)


def direct_scatter(n, root):
    ranks = []
    for r in range(n):
        if r == root:
            tbs = [tb([op("copy", src=ref("input", r), dst=ref("output", 0))])]
            tbs += [tb([op("send", src=ref("input", p))], send=p) for p in range(n) if p != r]
            ranks.append(rank(tbs, n, 1))
        else:
            ranks.append(rank([tb([op("recv", dst=ref("output", 0))], recv=root)], 0, 1))
    return program(f"direct_scatter_{n}r", "scatter", n, n, ranks, root=root)


def allpairs_allreduce(n):
    """Rank c reduces chunk c from everyone (received into scratch), then sends the result to
    everyone. Shows scratch buffers and cross-threadblock dependencies."""
    ranks = []
    for r in range(n):
        peers = [p for p in range(n) if p != r]
        # tb 0 reduces; tbs 1..n-1 send to peers; tbs n..2n-2 receive from peers.
        send_tb = {p: 1 + i for i, p in enumerate(peers)}
        recv_tb = {p: n + i for i, p in enumerate(peers)}
        reduce_ops = [op("copy", src=ref("input", r), dst=ref("output", r))]
        for i, p in enumerate(peers):
            reduce_ops.append(op("reduce", src=ref("scratch", i), dst=ref("output", r),
                                 deps=[(recv_tb[p], 0)]))
        last = len(reduce_ops) - 1
        tbs = [tb(reduce_ops)]
        for p in peers:
            tbs.append(tb([op("send", src=ref("input", p)),
                           op("send", src=ref("output", r), deps=[(0, last)])], send=p))
        for i, p in enumerate(peers):
            tbs.append(tb([op("recv", dst=ref("scratch", i)),
                           op("recv", dst=ref("output", p))], recv=p))
        ranks.append(rank(tbs, n, n, n - 1))
    return program(f"allpairs_allreduce_{n}r", "allreduce", n, n, ranks, protocol="LL")


def shift_custom(n, nchunks):
    """A custom collective (GC3's AllToNext shape): rank r's output is rank r-1's input."""
    ranks, post = [], []
    for r in range(n):
        tbs = [tb([op("send", count=nchunks, src=ref("input", 0))], send=(r + 1) % n),
               tb([op("recv", count=nchunks, dst=ref("output", 0))], recv=(r - 1) % n)]
        ranks.append(rank(tbs, nchunks, nchunks))
        for k in range(nchunks):
            post.append({"rank": r, "index": k,
                         "sources": [{"rank": (r - 1) % n, "index": k}]})
    return program(f"shift_custom_{n}r", "custom", n, nchunks, ranks, inplace=False,
                   postconditions=post)


EXAMPLES = {
    "ring_allreduce_4r_2ch.json": lambda: ring_allreduce(4, 2),
    "ring_allgather_4r.json": lambda: ring_allgather(4),
    "ring_reducescatter_4r.json": lambda: ring_reducescatter(4),
    "direct_alltoall_4r.json": lambda: direct_alltoall(4),
    "chain_broadcast_4r.json": lambda: chain_broadcast(4, 3, root=1),
    "chain_reduce_4r.json": lambda: chain_reduce(4, 3, root=2),
    "direct_gather_4r.json": lambda: direct_gather(4, root=3),
    "direct_scatter_4r.json": lambda: direct_scatter(4, root=0),
    "allpairs_allreduce_3r.json": lambda: allpairs_allreduce(3),
    "shift_custom_4r.json": lambda: shift_custom(4, 2),
}


def main():
    out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ef")
    os.makedirs(out_dir, exist_ok=True)
    for name, make in EXAMPLES.items():
        with open(os.path.join(out_dir, name), "w") as f:
            json.dump(make(), f, indent=1)
            f.write("\n")
    print(f"wrote {len(EXAMPLES)} programs to {out_dir}", file=sys.stderr)


if __name__ == "__main__":
    main()
