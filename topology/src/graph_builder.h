// A graph built node by node where the first error sticks: the presets, detection and
// NCCL_TOPO_FILE's overlay build on it and check the status once, at the end.
#pragma once

#include <utility>

#include "efccl/topology/topology.h"

namespace efccl::topo {

class GraphBuilder {
 public:
  /// Adds `n`; after an error (this one or an earlier), returns 0 and adds nothing.
  NodeIndex add(Node n) {
    if (!status_) return 0;
    auto i = t_.add_node(std::move(n));
    if (!i) {
      status_ = i.status();
      return 0;
    }
    return *i;
  }
  void link(Link l) {
    if (status_)
      if (auto r = t_.add_link(l); !r) status_ = r.status();
  }
  void duplex(NodeIndex a, NodeIndex b, LinkKind kind, double gbps, double latency, int lanes) {
    if (status_) status_ = t_.add_duplex(a, b, kind, gbps, latency, lanes);
  }
  Topology& topology() { return t_; }
  const Status& status() const { return status_; }
  /// The graph, or the first error; `check`: Topology::check() too.
  StatusOr<Topology> finish(bool check = false) {
    if (!status_) return status_;
    if (check)
      if (Status s = t_.check(); !s) return s;
    return std::move(t_);
  }

 protected:
  Topology t_;
  Status status_ = Status::ok();
};

}  // namespace efccl::topo
