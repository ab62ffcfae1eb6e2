#pragma once
// SIGINT / SIGTERM handling of the commands that run requests (docs/reliability.md): the first
// signal asks the command to stop (abort the unfinished requests, write every finished result,
// exit 128 + signal: 130 for SIGINT, 143 for SIGTERM); a second signal exits at once with the
// same status, keeping only what was already written (results are flushed as they are written).
namespace origami::cli {

// Installs the handlers (once, before the engine starts).
void install_interrupt_handlers();
// The first signal received, 0 when none.
int interrupt_signal();
// 128 + interrupt_signal().
int interrupted_exit_code();
// "origami: interrupted (SIGINT): <what>" on stderr.
void report_interrupted(const char* what);

}  // namespace origami::cli
