// origami: the command-line front end (generate, bench, policies, eval).
#include <CLI/CLI.hpp>
#include <cstdio>

#include "commands.h"

int main(int argc, char** argv) {
  CLI::App app{"origami: an LLM serving engine whose paged KV cache is compressed in place"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "origami 0.1.0");
  origami::cli::register_generate_command(app);
  origami::cli::register_bench_command(app);
  origami::cli::register_policies_command(app);
  origami::cli::register_eval_command(app);
  origami::cli::register_serve_command(app);
  origami::cli::register_bench_serve_command(*app.get_subcommand("bench"));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return origami::cli::exit_code();
}
