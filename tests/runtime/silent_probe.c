/* A C program linked against libefccl.so that makes ordinary calls (and one failing call) and
   prints nothing itself: silent_test.cc checks what efccl wrote to its stdout and stderr.
   Exit status 0 when every call returned what was expected; otherwise the reason goes to the
   file named by argv[1] (never to stdout or stderr). */
#include <nccl.h>
#include <stdio.h>
#include <string.h>

static int fail(const char* report, const char* what) {
  FILE* f = fopen(report, "w");
  if (f != NULL) {
    fputs(what, f);
    fclose(f);
  }
  return 1;
}

int main(int argc, char** argv) {
  const char* report = argc > 1 ? argv[1] : "/dev/null";
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess || version < 22800) return fail(report, "version");
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) return fail(report, "ncclGetUniqueId");
  int count = 0;
  if (ncclCommCount(NULL, &count) != ncclInvalidArgument) return fail(report, "bad comm accepted");
  if (strlen(ncclGetLastError(NULL)) == 0) return fail(report, "no last error");
  /* With a GPU, a whole communicator; without one, a failure that must stay silent too. */
  ncclComm_t comm = NULL;
  int dev = 0;
  if (ncclCommInitAll(&comm, 1, &dev) == ncclSuccess) {
    if (ncclCommDestroy(comm) != ncclSuccess) return fail(report, "ncclCommDestroy");
  }
  return 0;
}
