#include "interrupt.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <string>
#include <utility>

namespace origami::cli {
namespace {

std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs a lock-free flag");
// The report the second signal prints (set_interrupt_report). A replaced report is freed only
// while no handler has started reading: the handler raises g_report_busy before it loads the
// pointer (both sequentially consistent), so a report it may hold is never freed under it.
std::atomic<const std::string*> g_report{nullptr};
std::atomic<bool> g_report_busy{false};
static_assert(std::atomic<const std::string*>::is_always_lock_free && std::atomic<bool>::is_always_lock_free,
              "the signal handler needs lock-free atomics");

void write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    data += n;
    size -= static_cast<size_t>(n);
  }
}

void publish_report(const std::string* fresh) {
  const std::string* old = g_report.exchange(fresh);
  if (old != nullptr && !g_report_busy.load()) delete old;
}

void on_signal(int sig) {
  int expected = 0;
  if (!g_signal.compare_exchange_strong(expected, sig)) {
    // Second signal: the user does not want to wait. Only async-signal-safe calls here: the
    // report rendered ahead (if any) goes to stdout, then the process ends.
    g_report_busy.store(true);
    if (const std::string* report = g_report.load()) write_all(STDOUT_FILENO, report->data(), report->size());
    static const char kMsg[] = "\norigami: second signal, exiting now\n";
    write_all(STDERR_FILENO, kMsg, sizeof kMsg - 1);
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

const char* interrupt_signal_name() {
  const int sig = g_signal.load();
  return sig == 0 ? "" : sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "signal";
}

void report_interrupted(const char* what) { std::fprintf(stderr, "origami: interrupted (%s): %s\n", interrupt_signal_name(), what); }

void set_interrupt_report(std::string text) { publish_report(new std::string(std::move(text))); }

void clear_interrupt_report() { publish_report(nullptr); }

}  // namespace origami::cli
