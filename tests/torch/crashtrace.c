// crashtrace: an LD_PRELOAD helper for the GPU checks (run_gpu_checks.sh --crash-trace). On
// SIGSEGV, SIGBUS, SIGABRT, SIGILL or SIGFPE it prints, to stderr, the signal, the faulting
// address, the thread (id and name) and the native backtrace of the thread that received it,
// one frame a line as "#N <object>+0x<offset> (<dynamic symbol or ?>)"; then the process dies of
// the signal as it would have. run_gpu_checks.sh names the frames of objects built with symbols
// (addr2line on <object> at <offset> - 1).
//
//   gcc -shared -fPIC -O1 -g -o crashtrace.so tests/torch/crashtrace.c -ldl
//   LD_PRELOAD=$PWD/crashtrace.so PYTHONFAULTHANDLER=1 python ...
//
// With PYTHONFAULTHANDLER=1 Python installs its own handler after this one: it prints every
// thread's Python traceback first, then re-raises the signal, which lands here (the native
// frames then include Python's handler and a signal frame above the faulting one).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

static const int kSignals[] = {SIGSEGV, SIGBUS, SIGABRT, SIGILL, SIGFPE};

static void say(const char* text, int len) {
  while (len > 0) {
    ssize_t n = write(2, text, (size_t)len);
    if (n <= 0) return;
    text += n;
    len -= (int)n;
  }
}

static void handler(int sig, siginfo_t* info, void* context) {
  (void)context;
  char buf[512];
  char thread[17] = {0};
  (void)prctl(PR_GET_NAME, thread, 0, 0, 0);
  void* frames[96];
  const int n = backtrace(frames, 96);
  int len = snprintf(buf, sizeof buf,
                     "=== crashtrace: pid %d thread %ld (%s): signal %d (%s), address %p, "
                     "code %d; %d frames\n",
                     (int)getpid(), (long)syscall(SYS_gettid), thread, sig, strsignal(sig),
                     info != NULL ? info->si_addr : NULL, info != NULL ? info->si_code : 0, n);
  say(buf, len);
  for (int i = 0; i < n; ++i) {
    Dl_info where;
    if (dladdr(frames[i], &where) != 0 && where.dli_fname != NULL) {
      len = snprintf(buf, sizeof buf, "  #%d %s+0x%lx (%s)\n", i, where.dli_fname,
                     (unsigned long)((uintptr_t)frames[i] - (uintptr_t)where.dli_fbase),
                     where.dli_sname != NULL ? where.dli_sname : "?");
    } else {
      len = snprintf(buf, sizeof buf, "  #%d %p\n", i, frames[i]);
    }
    say(buf, len);
  }
  len = snprintf(buf, sizeof buf, "=== crashtrace: end of pid %d thread %ld\n", (int)getpid(),
                 (long)syscall(SYS_gettid));
  say(buf, len);
  // Die of the signal as before (the exit status and the launcher's report stay the same).
  signal(sig, SIG_DFL);
  raise(sig);
}

__attribute__((constructor)) static void crashtrace_install(void) {
  // backtrace() loads the unwinder on first use (malloc inside): do it now, not in the handler.
  void* warm[4];
  (void)backtrace(warm, 4);
  // An alternate stack for this (the main) thread: a stack overflow still gets its trace.
  static char alt[1 << 16];
  stack_t ss;
  memset(&ss, 0, sizeof ss);
  ss.ss_sp = alt;
  ss.ss_size = sizeof alt;
  (void)sigaltstack(&ss, NULL);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = handler;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  for (size_t i = 0; i < sizeof kSignals / sizeof kSignals[0]; ++i)
    (void)sigaction(kSignals[i], &sa, NULL);
}
