#include "efccl/mprun/rendezvous.h"

#include <charconv>

#include "efccl/net/printable.h"

namespace efccl::mprun {
namespace {

constexpr size_t kQuoted = 120;  // bytes of a rejected line shown in a message

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

std::string quoted(std::string_view text) { return "'" + net::printable(text, kQuoted) + "'"; }

StatusOr<net::SocketAddress> parse_address(std::string_view text) {
  return net::SocketAddress::parse(text, AF_UNSPEC, net::SocketAddress::Lookup::kNumericOnly);
}

}  // namespace

std::string format_hello(const Hello& hello) {
  return "HELLO " + hello.job + " " + std::to_string(hello.rank) + " " +
         std::to_string(hello.size) + " " + hello.listen.to_string() + "\n";
}

StatusOr<Hello> parse_hello(std::string_view line) {
  const auto w = words(line);
  if (w.size() != 5 || w[0] != "HELLO")
    return Status::error("expected 'HELLO <job> <rank> <size> <host:port>', got " + quoted(line));
  Hello h;
  h.job = std::string(w[1]);
  if (!to_int(w[2], &h.rank) || !to_int(w[3], &h.size))
    return Status::error("HELLO: rank and size must be integers, got " + quoted(w[2]) + " and " +
                         quoted(w[3]));
  if (h.size < 1 || h.size > kMaxRanks || h.rank < 0 || h.rank >= h.size)
    return Status::error("HELLO: rank " + std::to_string(h.rank) + " of size " +
                         std::to_string(h.size) + " is out of range");
  auto a = parse_address(w[4]);
  if (!a) return Status::error("HELLO: " + net::printable(a.status().message(), 2 * kQuoted));
  h.listen = *a;
  return h;
}

std::string format_peers(const std::vector<net::SocketAddress>& peers) {
  std::string line = "PEERS";
  for (const net::SocketAddress& a : peers) line += " " + a.to_string();
  return line + "\n";
}

std::string format_error(std::string_view why) {
  std::string text(why);
  for (char& c : text)
    if (c == '\n') c = ' ';
  return "ERROR " + text + "\n";
}

StatusOr<std::vector<net::SocketAddress>> parse_peers(std::string_view line, int size) {
  if (line.substr(0, 6) == "ERROR ")
    return Status::error(net::printable(line.substr(6), kMaxLineSize));
  const auto w = words(line);
  if (w.empty() || w[0] != "PEERS")
    return Status::error("expected 'PEERS <host:port>...', got " + quoted(line));
  if (static_cast<int64_t>(w.size()) != static_cast<int64_t>(size) + 1)
    return Status::error("PEERS lists " + std::to_string(w.size() - 1) + " addresses, expected " +
                         std::to_string(size));
  std::vector<net::SocketAddress> peers;
  for (size_t i = 1; i < w.size(); ++i) {
    auto a = parse_address(w[i]);
    if (!a) return Status::error("PEERS: " + net::printable(a.status().message(), 2 * kQuoted));
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
    return Status::error("expected 'ABORT <rank> <errorcode>', got " + quoted(line));
  return out;
}

}  // namespace efccl::mprun
