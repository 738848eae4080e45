// crashtrace: an LD_PRELOAD helper for the GPU checks (run_gpu_checks.sh --crash-trace). On
// SIGSEGV, SIGBUS, SIGABRT, SIGILL or SIGFPE it prints, to stderr, the signal, the faulting
// address, the thread (id and name) and the native backtrace of the thread that received it,
// one frame a line as "#N <object>+0x<offset> (<dynamic symbol or ?>)"; then runs the handler
// the process itself installed for that signal (Python's faulthandler: every thread's Python
// traceback), then the process dies of the signal as it would have. run_gpu_checks.sh names the
// frames of objects built with symbols (symbolize_crashtrace.py: addr2line at <offset> - 1).
//
//   gcc -shared -fPIC -O1 -g -o crashtrace.so tests/torch/crashtrace.c -ldl
//   LD_PRELOAD=$PWD/crashtrace.so PYTHONFAULTHANDLER=1 python ...
//
// To stay first (the faulting address is lost once another handler re-raises the signal), it
// interposes sigaction(): a handler the process installs later for one of these signals is
// recorded and chained after the trace instead of replacing it.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef int (*sigaction_fn)(int, const struct sigaction*, struct sigaction*);

static const int kSignals[] = {SIGSEGV, SIGBUS, SIGABRT, SIGILL, SIGFPE};
static sigaction_fn real_sigaction;
static struct sigaction chained[NSIG];  // what the process believes is installed
static volatile sig_atomic_t armed;
static volatile sig_atomic_t depth;

static int traced(int sig) {
  for (size_t i = 0; i < sizeof kSignals / sizeof kSignals[0]; ++i)
    if (kSignals[i] == sig) return 1;
  return 0;
}

static sigaction_fn resolve_sigaction(void) {
  if (real_sigaction == NULL) real_sigaction = (sigaction_fn)dlsym(RTLD_NEXT, "sigaction");
  return real_sigaction;
}

static void say(const char* text, int len) {
  while (len > 0) {
    ssize_t n = write(2, text, (size_t)len);
    if (n <= 0) return;
    text += n;
    len -= (int)n;
  }
}

static void die_of(int sig) {
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  if (resolve_sigaction() != NULL) real_sigaction(sig, &dfl, NULL);
  raise(sig);
}

static void handler(int sig, siginfo_t* info, void* context) {
  if (depth++ > 0) {  // re-raised by a chained handler, or a second thread: no second trace
    die_of(sig);
    return;
  }
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
  // The process's own handler (faulthandler re-raises: that lands in die_of above).
  const struct sigaction next = chained[sig];
  if ((next.sa_flags & SA_SIGINFO) != 0) {
    if (next.sa_sigaction != NULL) next.sa_sigaction(sig, info, context);
  } else if (next.sa_handler != SIG_DFL && next.sa_handler != SIG_IGN) {
    next.sa_handler(sig);
  }
  die_of(sig);  // the exit status and the launcher's report stay as without this library
}

// Interposed: the traced signals keep this library's handler; what the process installs for
// them is chained after the trace (and reported back as installed).
int sigaction(int sig, const struct sigaction* act, struct sigaction* old) {
  if (resolve_sigaction() == NULL) return -1;
  if (!armed || sig <= 0 || sig >= NSIG || !traced(sig)) return real_sigaction(sig, act, old);
  if (old != NULL) *old = chained[sig];
  if (act != NULL) chained[sig] = *act;
  return 0;
}

__attribute__((constructor)) static void crashtrace_install(void) {
  if (resolve_sigaction() == NULL) return;
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
    (void)real_sigaction(kSignals[i], &sa, &chained[kSignals[i]]);
  armed = 1;
}
