"""NVIDIA machines as link matrices (connectivity and NVLink counts)."""

from efccl.topologies.topology import Topology

# DGX-1 (V100) hybrid cube-mesh: NVLinks between each pair of GPUs (6 per GPU).
_DGX1_NVLINKS = {
    (0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2,
    (1, 2): 2, (1, 3): 1, (1, 5): 2,
    (2, 3): 2, (2, 6): 1,
    (3, 7): 1,
    (4, 5): 1, (4, 6): 1, (4, 7): 2,
    (5, 6): 2, (5, 7): 1,
    (6, 7): 2,
}


def dgx1():
    """8 V100s of a DGX-1; links[dst][src] is the number of NVLinks between them."""
    links = [[0] * 8 for _ in range(8)]
    for (a, b), n in _DGX1_NVLINKS.items():
        links[a][b] = links[b][a] = n
    return Topology("DGX1", links)


def dgx_a100():
    """8 A100s of a DGX A100: every pair linked through NVSwitch (12 NVLinks per GPU)."""
    links = [[0 if s == d else 12 for s in range(8)] for d in range(8)]
    switches = []
    for g in range(8):
        others = [o for o in range(8) if o != g]
        switches.append(([g], others, 12, f"gpu_{g}_out"))
        switches.append((others, [g], 12, f"gpu_{g}_in"))
    return Topology("DGX-A100", links, switches)
