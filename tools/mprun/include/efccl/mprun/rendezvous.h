// The contract between efccl-mprun and the processes it starts: the environment each rank
// gets, and the line protocol of the launcher's rendezvous server (EFCCL_MPRUN_ADDR), through
// which the ranks of the MPI shim learn each other's addresses.
//
//   rank -> launcher   HELLO <job> <rank> <size> <host:port>   (once, first; port: its listener)
//   launcher -> rank   PEERS <host:port> ... (every rank, in rank order, once all said HELLO)
//                      or ERROR <why>, then the launcher closes the connection
//   rank -> launcher   ABORT <rank> <errorcode>                 (MPI_Abort: stop the job)
//
// Addresses are numeric ("127.0.0.1:4242", "[::1]:4242"): a line never makes anyone ask DNS.
// The parsers quote what they reject through net::printable, so bytes from a stranger never
// reach a terminal as control characters.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "efccl/common/status.h"
#include "efccl/net/socket_address.h"

namespace efccl::mprun {

// Environment of every rank (besides torchrun's RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
inline constexpr const char* kEnvRank = "EFCCL_MPRUN_RANK";       ///< 0..size-1
inline constexpr const char* kEnvSize = "EFCCL_MPRUN_SIZE";       ///< number of ranks
inline constexpr const char* kEnvAddr = "EFCCL_MPRUN_ADDR";       ///< rendezvous host:port
inline constexpr const char* kEnvJob = "EFCCL_MPRUN_JOB";         ///< this job's random key
inline constexpr const char* kEnvIdFile = "EFCCL_MPRUN_ID_FILE";  ///< where rank 0 puts an id

inline constexpr int kMaxRanks = 4096;
inline constexpr size_t kMaxLineSize = 56 * kMaxRanks;  ///< a PEERS line of IPv6 addresses fits

/// A rank's registration.
struct Hello {
  std::string job;
  int rank = -1;
  int size = 0;
  net::SocketAddress listen;  ///< where the rank accepts its peers' connections
};

std::string format_hello(const Hello& hello);  ///< with the trailing newline
/// Parses a HELLO line (without the newline).
StatusOr<Hello> parse_hello(std::string_view line);

std::string format_peers(const std::vector<net::SocketAddress>& peers);  ///< with the newline
std::string format_error(std::string_view why);  ///< with the trailing newline
/// Parses the reply to HELLO: the `size` addresses of a PEERS line, or the reason of an ERROR.
StatusOr<std::vector<net::SocketAddress>> parse_peers(std::string_view line, int size);

std::string format_abort(int rank, int errorcode);  ///< with the trailing newline
/// Parses an ABORT line into (rank, errorcode).
StatusOr<std::pair<int, int>> parse_abort(std::string_view line);

}  // namespace efccl::mprun
