"""Generic topologies: fully connected, ring, line, star, hub and spoke."""

from efccl.topologies.topology import Topology


def fully_connected(num_nodes):
    """Every rank links to every other rank."""
    links = [[0 if s == d else 1 for s in range(num_nodes)] for d in range(num_nodes)]
    return Topology(f"FullyConnected(n={num_nodes})", links)


def ring(num_nodes):
    """Rank i links to i-1 and i+1 (mod n), both directions."""
    links = [[0] * num_nodes for _ in range(num_nodes)]
    for i in range(num_nodes):
        for j in ((i + 1) % num_nodes, (i - 1) % num_nodes):
            if j != i:
                links[i][j] = 1
    return Topology(f"Ring(n={num_nodes})", links)


def line(num_nodes):
    """Rank i links to i-1 and i+1 where they exist."""
    links = [[1 if abs(i - j) == 1 else 0 for j in range(num_nodes)] for i in range(num_nodes)]
    return Topology(f"Line(n={num_nodes})", links)


def star(num_nodes, non_blocking=True):
    """Rank 0 links to every other rank; with non_blocking=False its links share one switch."""
    links = [[1 if (i == 0) != (j == 0) else 0 for j in range(num_nodes)]
             for i in range(num_nodes)]
    switches = []
    if not non_blocking:
        points = list(range(1, num_nodes))
        switches = [([0], points, 1, "to_points"), (points, [0], 1, "from_points")]
    return Topology(f"Star(n={num_nodes})", links, switches)


def hub_and_spoke(num_nodes):
    """Fully connected through a switch: each rank sends (and receives) at bandwidth 1 in all."""
    links = [[0 if s == d else 1 for s in range(num_nodes)] for d in range(num_nodes)]
    switches = []
    for node in range(num_nodes):
        others = [o for o in range(num_nodes) if o != node]
        switches.append(([node], others, 1, f"node_{node}_out"))
        switches.append((others, [node], 1, f"node_{node}_in"))
    return Topology(f"HubAndSpoke(n={num_nodes})", links, switches)
