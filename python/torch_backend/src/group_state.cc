#include "group_state.h"

#include <c10/util/Exception.h>

#include <cstdio>
#include <cstring>

namespace efccl::torch_backend {
namespace {

/// `s` as a JSON string literal.
std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

const char* or_empty(const char* s) { return s != nullptr ? s : ""; }

}  // namespace

std::string GroupIdentity::describe_rank(int group_rank) const {
  std::string text = "rank " + std::to_string(group_rank);
  if (group_rank >= 0 && static_cast<size_t>(group_rank) < global_ranks.size() &&
      global_ranks[static_cast<size_t>(group_rank)] != group_rank)
    text += " (global rank " + std::to_string(global_ranks[static_cast<size_t>(group_rank)]) + ")";
  return text;
}

std::string GroupIdentity::describe() const {
  return "process group '" + name + "' (rank " + std::to_string(rank) + " of " +
         std::to_string(size) + ")";
}

bool GroupState::fail(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (failed_.load(std::memory_order_relaxed)) return false;
  failure_ = reason;
  failed_.store(true, std::memory_order_release);
  return true;
}

std::string GroupState::failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

void GroupState::throw_if_failed(const char* op) const {
  if (!failed()) return;
  C10_THROW_ERROR(DistBackendError, "efccl " + std::string(op) + " on " + identity_.describe() +
                                        ": the group can no longer be used: " + failure());
}

void GroupState::record_call(const char* collective, uint64_t bytes, bool captured) {
  std::lock_guard<std::mutex> lock(mutex_);
  CollectiveStats& s = collectives_[collective];
  ++s.calls;
  s.bytes += bytes;
  if (captured) ++s.captured;
}

void GroupState::record_peer_bytes(int peer, uint64_t sent, uint64_t received) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto& p = peer_bytes_[peer];
  p.first += sent;
  p.second += received;
}

void GroupState::record_selection(const efcclSelection_t& sel) {
  std::lock_guard<std::mutex> lock(mutex_);
  const char* collective = or_empty(sel.collective);
  const char* program = or_empty(sel.program);
  const char* source = or_empty(sel.source);
  for (ProgramUse& use : programs_) {
    if (use.collective == collective && use.program == program && use.source == source &&
        use.skipped == (sel.skipped != 0)) {
      ++use.selections;
      if (use.reason != or_empty(sel.reason)) use.reason = or_empty(sel.reason);
      return;
    }
  }
  programs_.push_back({collective, program, source, or_empty(sel.reason), sel.skipped != 0, 1});
}

// Built with string appends and std::to_string, not an ostringstream: the iostream number
// formatting inside this extension crashed (SIGSEGV in ostream::_M_insert<long>, H200,
// torch 2.11) on every call, while to_string needs no locale facets.
std::string GroupState::stats_json(const std::string& device, const std::string& origin,
                                   int pending) const {
  std::lock_guard<std::mutex> lock(mutex_);
  using std::to_string;
  std::string o = "{\"group\": " + quoted(identity_.name) + ", \"rank\": " +
                  to_string(identity_.rank) + ", \"size\": " + to_string(identity_.size) +
                  ", \"global_ranks\": [";
  for (size_t i = 0; i < identity_.global_ranks.size(); ++i)
    o += (i ? ", " : "") + to_string(identity_.global_ranks[i]);
  o += "], \"device\": " + quoted(device) + ", \"communicator\": " + quoted(origin) +
       ", \"pending_works\": " + to_string(pending) +
       ", \"failed\": " + (failed_.load() ? quoted(failure_) : std::string("null")) +
       ", \"collectives\": {";
  bool first = true;
  for (const auto& [name, s] : collectives_) {
    o += (first ? "" : ", ") + quoted(name) + ": {\"calls\": " + to_string(s.calls) +
         ", \"bytes\": " + to_string(s.bytes) + ", \"captured\": " + to_string(s.captured) +
         "}";
    first = false;
  }
  o += "}, \"peers\": {";
  first = true;
  for (const auto& [peer, bytes] : peer_bytes_) {
    o += std::string(first ? "" : ", ") + "\"" + to_string(peer) +
         "\": {\"sent_bytes\": " + to_string(bytes.first) +
         ", \"received_bytes\": " + to_string(bytes.second) + "}";
    first = false;
  }
  o += "}, \"programs\": [";
  for (size_t i = 0; i < programs_.size(); ++i) {
    const ProgramUse& u = programs_[i];
    o += (i ? ", " : "") + std::string("{\"collective\": ") + quoted(u.collective) +
         ", \"program\": " + quoted(u.program) + ", \"source\": " + quoted(u.source) +
         ", \"reason\": " + quoted(u.reason) + ", \"skipped\": " +
         (u.skipped ? "true" : "false") + ", \"selections\": " + to_string(u.selections) + "}";
  }
  o += "]}";
  return o;
}

GroupState*& current_selection_group() {
  thread_local GroupState* group = nullptr;
  return group;
}

void on_selection(const efcclSelection_t* selection, void* /*user*/) {
  GroupState* group = current_selection_group();
  if (group == nullptr || selection == nullptr) return;
  try {
    group->record_selection(*selection);
  } catch (...) {  // out of memory: the statistic is lost, the call goes on
  }
}

}  // namespace efccl::torch_backend
