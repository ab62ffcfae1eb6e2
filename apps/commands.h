#pragma once
// Each subcommand registers itself on the CLI app and records the process exit code when it runs.
#include <CLI/CLI.hpp>

namespace origami::cli {

void register_generate_command(CLI::App& app);
void register_bench_command(CLI::App& app);
void register_policies_command(CLI::App& app);
void register_eval_command(CLI::App& app);
void register_serve_command(CLI::App& app);
void register_calibrate_command(CLI::App& app);
void register_train_gates_command(CLI::App& app);
// `bench serve`, under the `bench` command.
void register_bench_serve_command(CLI::App& bench);

void set_exit_code(int code);
int exit_code();

}  // namespace origami::cli
