"""A topology: which ranks can send to which (MSCCLang's ``msccl.topologies.Topology``)."""


class Topology:
    """``links[dst][src]`` is the bandwidth (0: no link) from ``src`` to ``dst``; ``switches``
    are (sources, destinations, bandwidth, name) groups sharing bandwidth."""

    def __init__(self, name, links, switches=()):
        self.name = name
        self.links = links
        self.switches = list(switches)
        for _srcs, _dsts, bw, switch_name in self.switches:
            if bw <= 0:
                raise ValueError(f"Switch {switch_name} has bandwidth {bw}; switch bandwidths "
                                 f"must be > 0 (connectedness goes in links)")

    def sources(self, dst):
        return (src for src, bw in enumerate(self.links[dst]) if bw > 0)

    def destinations(self, src):
        return (dst for dst, row in enumerate(self.links) if row[src] > 0)

    def link(self, src, dst):
        return self.links[dst][src]

    def num_nodes(self):
        return len(self.links)

    def nodes(self):
        return range(self.num_nodes())

    def bandwidth_constraints(self):
        for dst, row in enumerate(self.links):
            for src, bw in enumerate(row):
                if bw > 0:
                    yield ([src], [dst], bw, f"{src}->{dst}")
        yield from self.switches

    def __repr__(self):
        return f"Topology({self.name})"
