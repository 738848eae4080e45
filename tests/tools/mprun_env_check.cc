// One rank of mprun_env_test: mprun_rank(), mprun_size() and share_unique_id()
// (tests/support/mprun_env.h) agree with the MPI shim's view of the job, and every rank ends
// up with rank 0's ncclUniqueId. Mode "wait" (no launcher): a rank other than 0 whose rank 0
// never publishes gives up with a message after the given milliseconds.
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "mprun_env.h"

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "share";
  if (mode == "wait") {
    try {
      share_unique_id(std::chrono::milliseconds(argc > 2 ? std::atoi(argv[2]) : 300));
      std::printf("FAIL: share_unique_id returned without a published id\n");
      return 1;
    } catch (const std::runtime_error& e) {
      std::printf("gave up: %s\n", e.what());
      return 3;
    }
  }
  MPI_Init(&argc, &argv);
  int rank = -1, size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int failures = 0;
  if (mprun_rank() != rank || mprun_size() != size) {
    std::printf("FAIL: mprun_rank/size %d/%d, MPI says %d/%d\n", mprun_rank(), mprun_size(), rank,
                size);
    ++failures;
  }
  ncclUniqueId id{};
  try {
    id = share_unique_id();
  } catch (const std::runtime_error& e) {
    std::printf("FAIL: share_unique_id: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  std::vector<ncclUniqueId> all(static_cast<size_t>(size));
  MPI_Allgather(&id, sizeof(id), MPI_BYTE, all.data(), sizeof(id), MPI_BYTE, MPI_COMM_WORLD);
  const ncclUniqueId zero{};
  for (int r = 0; r < size; ++r) {
    if (std::memcmp(&all[r], &all[0], sizeof(id)) != 0) {
      std::printf("FAIL: rank %d holds another unique id than rank 0\n", r);
      ++failures;
    }
  }
  if (std::memcmp(&all[0], &zero, sizeof(id)) == 0) {
    std::printf("FAIL: the shared unique id is all zero\n");
    ++failures;
  }
  MPI_Allreduce(MPI_IN_PLACE, &failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0 && failures == 0)
    std::printf("mprun_env_check: %d ranks share one unique id\n", size);
  MPI_Finalize();
  return failures == 0 ? 0 : 1;
}
