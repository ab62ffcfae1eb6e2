#include "core/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <algorithm>
#include <cstdint>

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

Expected<std::string> read_small_regular_file(const std::filesystem::path& path, size_t max_bytes) {
  // O_NONBLOCK: opening a FIFO for reading otherwise waits until a writer opens it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    const int err = errno;
    return not_found(path.string() + ": cannot open file (" + std::strerror(err) + ")");
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return invalid_file(path.string() + ": cannot stat file");
  if (S_ISDIR(st.st_mode)) return invalid_file(path.string() + ": is a directory, not a file");
  if (!S_ISREG(st.st_mode))
    return invalid_file(path.string() + ": is not a regular file (a FIFO, device or socket is never read)");
  if (static_cast<uint64_t>(st.st_size) > max_bytes)
    return invalid_file(path.string() + ": is " + std::to_string(st.st_size) + " bytes, more than the limit of " +
                        std::to_string(max_bytes));
  // A regular file never blocks; read at most max_bytes + 1 so that one growing meanwhile is
  // still caught.
  std::string bytes;
  bytes.resize(static_cast<size_t>(st.st_size) + 1);
  size_t got = 0;
  for (;;) {
    if (got == bytes.size()) {
      if (bytes.size() > max_bytes) break;
      bytes.resize(std::min(max_bytes + 1, bytes.size() * 2 + 1));
    }
    const ssize_t n = ::read(fd, bytes.data() + got, bytes.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return invalid_file(path.string() + ": read error");
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  if (got > max_bytes)
    return invalid_file(path.string() + ": is more than the limit of " + std::to_string(max_bytes) + " bytes");
  bytes.resize(got);
  return bytes;
}

}  // namespace origami
