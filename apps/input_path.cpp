#include "input_path.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace origami::cli {

std::string input_source(const std::string& path) { return path == "-" ? "/dev/stdin" : path; }

Status check_input_path(const std::string& flag, const std::string& path) {
  if (path.empty()) return invalid_argument(flag + ": the file name is empty");
  const std::string source = input_source(path);
  struct stat st {};
  if (::stat(source.c_str(), &st) != 0)
    return invalid_argument(flag + ": cannot open '" + path + "': " + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) return invalid_argument(flag + ": '" + path + "' is a folder, not a file");
  // Standard input is readable whatever its permission bits say (it is already open).
  if (path != "-" && ::access(source.c_str(), R_OK) != 0)
    return invalid_argument(flag + ": cannot read '" + path + "': " + std::strerror(errno));
  return Status::ok();
}

Status check_not_input(const std::string& input_flag, const std::string& input_path, const std::string& output_flag,
                       const std::string& output_path) {
  if (input_path.empty() || output_path.empty()) return Status::ok();  // stdout is never the input file
  struct stat in {}, out {};
  if (::stat(input_source(input_path).c_str(), &in) != 0 || ::stat(output_path.c_str(), &out) != 0) return Status::ok();
  // Pipes and terminals can be the same object on both sides (`2>&1`-style plumbing) without
  // anything being truncated; only a regular file would be emptied before it is read.
  if (in.st_dev == out.st_dev && in.st_ino == out.st_ino && S_ISREG(in.st_mode))
    return invalid_argument(output_flag + " '" + output_path + "' is the " + input_flag + " file '" + input_path +
                            "': writing the results would erase the input before it is read; name another file");
  return Status::ok();
}

}  // namespace origami::cli
