// origami: the command-line front end (generate, bench, policies, eval, calibrate, train-gates, serve).
#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli_common.h"
#include "commands.h"
#include "interrupt.h"

int main(int argc, char** argv) {
  CLI::App app{"origami: an LLM serving engine whose paged KV cache is compressed in place"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "origami 0.1.0");
  origami::cli::register_generate_command(app);
  origami::cli::register_bench_command(app);
  origami::cli::register_policies_command(app);
  origami::cli::register_eval_command(app);
  origami::cli::register_calibrate_command(app);
  origami::cli::register_train_gates_command(app);
  origami::cli::install_interrupt_handlers();
  origami::cli::register_serve_command(app);
  origami::cli::register_bench_serve_command(*app.get_subcommand("bench"));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; every flag error is a usage error, exit 2 (docs/reliability.md).
    return app.exit(e) == 0 ? 0 : origami::cli::kExitUsage;
  }
  return origami::cli::exit_code();
}
