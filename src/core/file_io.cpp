#include "core/file_io.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace origami {

Expected<std::string> read_file(const std::filesystem::path& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return invalid_file(path.string() + ": is a directory, not a file");
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    return not_found(path.string() + ": cannot open file" + (err != 0 ? std::string(" (") + std::strerror(err) + ")" : ""));
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return invalid_file(path.string() + ": read error");
  return ss.str();
}

}  // namespace origami
