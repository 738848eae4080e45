#include "launch/balance_stats.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <thread>

#include "base/relaxed_capture.h"

namespace efccl::runtime {
namespace {

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof(esc), "\\u%04x", static_cast<unsigned>(c));
      out += esc;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string number(double v) {
  if (!std::isfinite(v)) return "null";
  char text[40];
  std::snprintf(text, sizeof(text), "%.3f", v);
  return text;
}

std::string optional_number(const std::optional<double>& v) { return v ? number(*v) : "null"; }

std::string expand(const std::string& path) {
  std::string out;
  for (std::size_t i = 0; i < path.size(); ++i) {
    if (path[i] == '%' && i + 1 < path.size() && (path[i + 1] == 'p' || path[i + 1] == 'h')) {
      if (path[i + 1] == 'p') {
        out += std::to_string(getpid());
      } else {
        char host[256] = {};
        gethostname(host, sizeof(host) - 1);
        out += host;
      }
      ++i;
    } else {
      out += path[i];
    }
  }
  return out;
}

}  // namespace

BalanceStats::~BalanceStats() {
  for (Measurement& m : pending_) give_back(m);
  for (auto& [device, e] : free_events_) {
    (void)cudaSetDevice(device);
    (void)cudaEventDestroy(e);
  }
  (void)cudaGetLastError();
}

int32_t BalanceStats::add_plan(BalancePlanRecord record) {
  if (plans_.size() < kMaxPlans) {
    plans_.push_back(Plan{std::move(record)});
    return static_cast<int32_t>(plans_.size() - 1);
  }
  // Demands that change every call would grow the list without end: later plans share one
  // entry, which counts their runs (their paths and link bytes are not kept).
  if (plans_.size() == kMaxPlans) {
    BalancePlanRecord later;
    later.kind = "later plans";
    later.scope = record.scope;
    plans_.push_back(Plan{std::move(later)});
  }
  return static_cast<int32_t>(kMaxPlans);
}

cudaEvent_t BalanceStats::take_event(int device) {
  for (auto it = free_events_.begin(); it != free_events_.end(); ++it)
    if (it->first == device) {
      const cudaEvent_t e = it->second;
      free_events_.erase(it);
      return e;
    }
  cudaEvent_t e = nullptr;
  if (cudaSetDevice(device) != cudaSuccess || cudaEventCreate(&e) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return e;
}

void BalanceStats::give_back(Measurement& m) {
  for (std::size_t i = 0; i < m.devices.size(); ++i) {
    if (i < m.start.size() && m.start[i] != nullptr)
      free_events_.push_back({m.devices[i], m.start[i]});
    if (i < m.end.size() && m.end[i] != nullptr) free_events_.push_back({m.devices[i], m.end[i]});
  }
  m.start.clear();
  m.end.clear();
}

void BalanceStats::begin_run(int32_t id, const std::vector<std::pair<int, cudaStream_t>>& streams,
                             bool capturing) {
  Plan& p = plans_[static_cast<std::size_t>(id)];
  ++p.runs;
  if (capturing) {
    ++p.captured_runs;
    return;
  }
  RelaxedCapture relaxed;
  poll(false);
  if (pending_.size() >= kMaxPending || streams.empty()) return;
  Measurement m;
  m.plan = id;
  for (const auto& [device, stream] : streams) {
    const cudaEvent_t e = take_event(device);
    if (e == nullptr || cudaSetDevice(device) != cudaSuccess ||
        cudaEventRecord(e, stream) != cudaSuccess) {
      (void)cudaGetLastError();
      if (e != nullptr) free_events_.push_back({device, e});
      give_back(m);
      return;
    }
    m.devices.push_back(device);
    m.streams.push_back(stream);
    m.start.push_back(e);
  }
  pending_.push_back(std::move(m));
  ++open_;
}

void BalanceStats::after_flush() {
  if (open_ == 0) return;
  RelaxedCapture relaxed;
  // The open measurements' ends: on the same streams, which now wait for their launches.
  for (std::size_t i = pending_.size() - open_; i < pending_.size(); ++i) {
    Measurement& m = pending_[i];
    for (std::size_t d = 0; d < m.devices.size(); ++d) {
      const cudaEvent_t e = take_event(m.devices[d]);
      if (e == nullptr) break;
      m.end.push_back(e);
      if (cudaSetDevice(m.devices[d]) != cudaSuccess ||
          cudaEventRecord(e, m.streams[d]) != cudaSuccess) {
        (void)cudaGetLastError();
        break;
      }
    }
    if (m.end.size() != m.devices.size()) m.failed = true;
  }
  open_ = 0;
}

void BalanceStats::poll(bool wait) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(wait ? 2 : 0);
  std::size_t done = 0;
  for (; done + open_ < pending_.size(); ++done) {
    Measurement& m = pending_[done];
    bool ready = !m.failed;
    for (std::size_t d = 0; ready && d < m.end.size(); ++d) {
      cudaError_t e = cudaEventQuery(m.end[d]);
      while (e == cudaErrorNotReady && wait && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        e = cudaEventQuery(m.end[d]);
      }
      if (e == cudaErrorNotReady && !wait) return finish_poll(done);  // FIFO: later ones wait
      if (e != cudaSuccess) (void)cudaGetLastError();
      ready = e == cudaSuccess;
    }
    if (ready) {
      double us = 0;
      for (std::size_t d = 0; d < m.devices.size(); ++d) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, m.start[d], m.end[d]) == cudaSuccess)
          us = std::max(us, static_cast<double>(ms) * 1e3);
        else
          (void)cudaGetLastError();
      }
      Plan& p = plans_[static_cast<std::size_t>(m.plan)];
      p.measured_min_us = p.measured_runs == 0 ? us : std::min(p.measured_min_us, us);
      p.measured_max_us = std::max(p.measured_max_us, us);
      p.measured_sum_us += us;
      ++p.measured_runs;
    }
    give_back(m);
  }
  finish_poll(done);
}

void BalanceStats::finish_poll(std::size_t done) {
  pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(done));
}

std::string BalanceStats::to_json(const topo::Topology& topology, const std::string& source,
                                  const std::vector<int32_t>& local_ranks, int32_t nranks,
                                  bool wait) {
  if (wait) {
    RelaxedCapture relaxed;
    poll(true);
  }
  std::vector<double> link_total(topology.links().size(), 0.0);
  std::string plans;
  for (std::size_t id = 0; id < plans_.size(); ++id) {
    const Plan& p = plans_[id];
    const BalancePlanRecord& r = p.record;
    std::string pairs;
    for (const BalancePlanRecord::Pair& pair : r.pairs) {
      std::string paths;
      for (const BalancePlanRecord::Path& path : pair.paths)
        paths += std::string(paths.empty() ? "" : ",") + "{\"via\":" + quoted(path.via) +
                 ",\"bytes\":" + std::to_string(path.bytes) +
                 ",\"channels\":" + std::to_string(path.channels) + "}";
      pairs += std::string(pairs.empty() ? "" : ",") + "{\"src\":" + std::to_string(pair.src) +
               ",\"dst\":" + std::to_string(pair.dst) + ",\"bytes\":" + std::to_string(pair.bytes) +
               ",\"paths\":[" + paths + "]}";
    }
    std::string links;
    for (const auto& [l, bytes] : r.link_bytes) {
      if (l < link_total.size()) link_total[l] += bytes * static_cast<double>(p.runs);
      links += std::string(links.empty() ? "" : ",") + "{\"link\":" + std::to_string(l) +
               ",\"bytes\":" + number(bytes) + "}";
    }
    std::string measured = "null";
    if (p.measured_runs > 0)
      measured = "{\"mean\":" + number(p.measured_sum_us / static_cast<double>(p.measured_runs)) +
                 ",\"min\":" + number(p.measured_min_us) + ",\"max\":" + number(p.measured_max_us) +
                 "}";
    plans += std::string(plans.empty() ? "" : ",") + "\n {\"id\":" + std::to_string(id) +
             ",\"kind\":" + quoted(r.kind) + ",\"scope\":" + quoted(r.scope) +
             ",\"transfers\":" + std::to_string(r.transfers) + ",\"pairs\":[" + pairs + "]" +
             ",\"max_load_us\":" + number(r.max_load_us) +
             ",\"direct_max_load_us\":" + number(r.direct_max_load_us) +
             ",\"predicted_us\":" + optional_number(r.predicted_us) +
             ",\"direct_predicted_us\":" + optional_number(r.direct_predicted_us) +
             ",\"runs\":" + std::to_string(p.runs) +
             ",\"captured_runs\":" + std::to_string(p.captured_runs) +
             ",\"measured_runs\":" + std::to_string(p.measured_runs) +
             ",\"measured_us\":" + measured + ",\"link_bytes_per_run\":[" + links + "]}";
  }
  std::string links;
  for (topo::LinkIndex l = 0; l < link_total.size(); ++l) {
    if (link_total[l] <= 0) continue;
    const topo::Link& link = topology.link(l);
    links += std::string(links.empty() ? "" : ",") + "\n {\"link\":" + std::to_string(l) +
             ",\"from\":" + quoted(topology.node(link.from).id) +
             ",\"to\":" + quoted(topology.node(link.to).id) +
             ",\"kind\":" + quoted(std::string(topo::to_string(link.kind))) +
             ",\"gbps\":" + number(link.gbps) + ",\"bytes\":" + number(link_total[l]) + "}";
  }
  std::string ranks;
  for (int32_t r : local_ranks) ranks += std::string(ranks.empty() ? "" : ",") + std::to_string(r);
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return "{\"efccl_balance_stats\":1,\"host\":" + quoted(host) +
         ",\"pid\":" + std::to_string(getpid()) + ",\"nranks\":" + std::to_string(nranks) +
         ",\"local_ranks\":[" + ranks + "],\"topology\":" + quoted(source) + ",\"links\":[" +
         links + "],\"plans\":[" + plans + "]}";
}

Status BalanceStats::append_to(const std::string& path, const std::string& json) {
  const std::string file = expand(path);
  std::ofstream out(file, std::ios::app);
  // One line per communicator: newlines inside the object are for reading only.
  std::string line = json;
  std::replace(line.begin(), line.end(), '\n', ' ');
  out << line << '\n';
  out.close();
  if (!out) return Status::error("EFCCL_BALANCE_STATS: cannot write '" + file + "'");
  return Status::ok();
}

}  // namespace efccl::runtime
