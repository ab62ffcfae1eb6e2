#pragma once
// SIGINT / SIGTERM handling of the commands that run requests (docs/reliability.md): the first
// signal asks the command to stop (abort the unfinished requests, write every finished result,
// exit 128 + signal: 130 for SIGINT, 143 for SIGTERM); a second signal exits at once with the
// same status, keeping only what was already written (results are flushed as they are written).
#include <string>

namespace origami::cli {

// Installs the handlers (once, before the engine starts).
void install_interrupt_handlers();
// The first signal received, 0 when none.
int interrupt_signal();
// 128 + interrupt_signal().
int interrupted_exit_code();
// "origami: interrupted (SIGINT): <what>" on stderr.
void report_interrupted(const char* what);
// "SIGINT", "SIGTERM" or "signal" for interrupt_signal() (0: "").
const char* interrupt_signal_name();

// A command whose results are printed only at the end (`bench`) keeps here, rendered ahead,
// the report of what has finished so far: the second signal writes it to stdout before it
// exits, since a signal handler cannot render one. The text is copied; setting and clearing
// are for the command's thread (not signal-safe), the handler only reads. Clear it before
// printing the final report so that a late second signal does not print it twice.
void set_interrupt_report(std::string text);
void clear_interrupt_report();

}  // namespace origami::cli
