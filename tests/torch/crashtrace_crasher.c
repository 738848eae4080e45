// The program crashtrace_test runs under crashtrace.so: it dies the way its argument says.
//   segv     a read of address 0x10 in efccl_crasher_fault()
//   chained  the same, after installing a SIGSEGV handler of its own (crashtrace chains it)
//   thread   the same, in a thread named crasher-thread
//   abort    abort()
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

__attribute__((noinline)) int efccl_crasher_fault(volatile int* p) { return *p; }

static void own_handler(int sig) {
  (void)sig;
  static const char text[] = "crasher: its own handler ran\n";
  (void)!write(2, text, sizeof text - 1);
}

static void* crash_in_thread(void* arg) {
  (void)arg;
  pthread_setname_np(pthread_self(), "crasher-thread");
  efccl_crasher_fault((volatile int*)16);
  return NULL;
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "segv";
  if (strcmp(mode, "abort") == 0) abort();
  if (strcmp(mode, "chained") == 0) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = own_handler;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, NULL);
  }
  if (strcmp(mode, "thread") == 0) {
    pthread_t t;
    pthread_create(&t, NULL, crash_in_thread, NULL);
    pthread_join(t, NULL);
    return 0;
  }
  return efccl_crasher_fault((volatile int*)16);
}
