#include "efccl/mprun/rendezvous.h"

#include <charconv>

namespace efccl::mprun {
namespace {

/// Splits on single spaces.
std::vector<std::string_view> words(std::string_view line) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (start <= line.size()) {
    const size_t space = line.find(' ', start);
    const size_t end = space == std::string_view::npos ? line.size() : space;
    if (end > start) out.push_back(line.substr(start, end - start));
    if (space == std::string_view::npos) break;
    start = space + 1;
  }
  return out;
}

bool to_int(std::string_view text, int* value) {
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *value);
  return ec == std::errc() && end == text.data() + text.size();
}

}  // namespace

std::string format_hello(const Hello& hello) {
  return "HELLO " + hello.job + " " + std::to_string(hello.rank) + " " +
         std::to_string(hello.size) + " " + hello.listen.to_string() + "\n";
}

StatusOr<Hello> parse_hello(std::string_view line) {
  const auto w = words(line);
  if (w.size() != 5 || w[0] != "HELLO")
    return Status::error("expected 'HELLO <job> <rank> <size> <host:port>', got '" +
                         std::string(line.substr(0, 200)) + "'");
  Hello h;
  h.job = std::string(w[1]);
  if (!to_int(w[2], &h.rank) || !to_int(w[3], &h.size))
    return Status::error("HELLO: rank and size must be integers, got '" + std::string(w[2]) +
                         "' and '" + std::string(w[3]) + "'");
  if (h.size < 1 || h.size > kMaxRanks || h.rank < 0 || h.rank >= h.size)
    return Status::error("HELLO: rank " + std::to_string(h.rank) + " of size " +
                         std::to_string(h.size) + " is out of range");
  auto a = Address::parse(w[4]);
  if (!a) return Status::error("HELLO: " + a.status().message());
  h.listen = *a;
  return h;
}

std::string format_peers(const std::vector<Address>& peers) {
  std::string line = "PEERS";
  for (const Address& a : peers) line += " " + a.to_string();
  return line + "\n";
}

std::string format_error(std::string_view why) {
  std::string text(why);
  for (char& c : text)
    if (c == '\n') c = ' ';
  return "ERROR " + text + "\n";
}

StatusOr<std::vector<Address>> parse_peers(std::string_view line, int size) {
  if (line.substr(0, 6) == "ERROR ") return Status::error(std::string(line.substr(6)));
  const auto w = words(line);
  if (w.empty() || w[0] != "PEERS")
    return Status::error("expected 'PEERS <host:port>...', got '" +
                         std::string(line.substr(0, 200)) + "'");
  if (static_cast<int>(w.size()) != size + 1)
    return Status::error("PEERS lists " + std::to_string(w.size() - 1) + " addresses, expected " +
                         std::to_string(size));
  std::vector<Address> peers;
  for (size_t i = 1; i < w.size(); ++i) {
    auto a = Address::parse(w[i]);
    if (!a) return Status::error("PEERS: " + a.status().message());
    peers.push_back(*a);
  }
  return peers;
}

std::string format_abort(int rank, int errorcode) {
  return "ABORT " + std::to_string(rank) + " " + std::to_string(errorcode) + "\n";
}

StatusOr<std::pair<int, int>> parse_abort(std::string_view line) {
  const auto w = words(line);
  std::pair<int, int> out;
  if (w.size() != 3 || w[0] != "ABORT" || !to_int(w[1], &out.first) || !to_int(w[2], &out.second))
    return Status::error("expected 'ABORT <rank> <errorcode>', got '" +
                         std::string(line.substr(0, 200)) + "'");
  return out;
}

}  // namespace efccl::mprun
