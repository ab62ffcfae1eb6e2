#include "interrupt.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>

namespace origami::cli {
namespace {

std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs a lock-free flag");

void on_signal(int sig) {
  int expected = 0;
  if (!g_signal.compare_exchange_strong(expected, sig)) {
    // Second signal: the user does not want to wait. Only async-signal-safe calls here.
    static const char kMsg[] = "\norigami: second signal, exiting now\n";
    (void)!write(STDERR_FILENO, kMsg, sizeof kMsg - 1);
    _exit(128 + expected);
  }
  static const char kMsg[] = "\norigami: stopping: finishing the results already done (signal again to exit now)\n";
  (void)!write(STDERR_FILENO, kMsg, sizeof kMsg - 1);
}

}  // namespace

void install_interrupt_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // reads and writes in progress go on; the step loop polls the flag
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

int interrupt_signal() { return g_signal.load(); }

int interrupted_exit_code() { return 128 + g_signal.load(); }

void report_interrupted(const char* what) {
  const int sig = g_signal.load();
  std::fprintf(stderr, "origami: interrupted (%s): %s\n", sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "signal",
               what);
}

}  // namespace origami::cli
