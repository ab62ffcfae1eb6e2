#pragma once
// Runs the `origami` binary as a user would and reads what it wrote, for the command-line tests.
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace origami::testing {

struct CommandResult {
  int exit_code = -1;  // -1 when the command could not be started or did not exit normally
  std::string out;
};

// Runs `origami <args>` through the shell (so tests may quote arguments as a user would) and
// captures stdout; stderr is dropped unless `with_stderr`, since most tests parse stdout as JSON.
inline CommandResult run_command(const std::string& args, bool with_stderr = false) {
  const std::string cmd = std::string(ORIGAMI_BINARY_DIR) + "/origami " + args + (with_stderr ? " 2>&1" : " 2>/dev/null");
  CommandResult r;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) r.out.append(buf, n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// One JSON value per line (JSONL output, or one JSON line per sweep point); blank lines skipped.
inline std::vector<nlohmann::json> parse_json_lines(const std::string& text) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

}  // namespace origami::testing
