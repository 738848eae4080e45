"""Several copies of a local topology (nodes) joined by remote links."""

from efccl.topologies.topology import Topology


def _links(local, copies, remote_bw):
    n = local.num_nodes()
    total = n * copies
    return [[remote_bw if s // n != d // n else local.links[d % n][s % n] for s in range(total)]
            for d in range(total)]


def _switches(local, copies):
    n = local.num_nodes()
    out = []
    for srcs, dsts, bw, name in local.switches:
        for i in range(copies):
            out.append(([s + i * n for s in srcs], [d + i * n for d in dsts], bw,
                        f"copy_{i}_{name}_local"))
    return out


def distributed_fully_connected(local_topology, num_copies, remote_bw):
    """``num_copies`` nodes of ``local_topology``; every pair of ranks on different nodes is
    linked with bandwidth ``remote_bw``."""
    return Topology(f"DistributedFullyConnected(local={local_topology.name},"
                    f"copies={num_copies},bw={remote_bw})",
                    _links(local_topology, num_copies, remote_bw),
                    _switches(local_topology, num_copies))


def distributed_hub_and_spoke(local_topology, num_copies, remote_bw):
    """Like distributed_fully_connected, with each node's remote traffic through one switch."""
    n = local_topology.num_nodes()
    total = n * num_copies
    switches = _switches(local_topology, num_copies)
    for i in range(num_copies):
        local = [j + i * n for j in range(n)]
        remote = [k for k in range(total) if k // n != i]
        switches.append((local, remote, remote_bw, f"copy_{i}_out_remote"))
        switches.append((remote, local, remote_bw, f"copy_{i}_in_remote"))
    return Topology(f"DistributedHubAndSpoke(local={local_topology.name},"
                    f"copies={num_copies},bw={remote_bw})",
                    _links(local_topology, num_copies, remote_bw), switches)
