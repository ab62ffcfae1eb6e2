#include "output_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "cli_common.h"

namespace origami::cli {

Status check_output_path(const std::string& flag, const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p(path);
  if (path.empty()) return invalid_argument(flag + ": the file name is empty");
  if (fs::is_directory(p, ec)) return invalid_argument(flag + ": '" + path + "' is a folder, not a file");
  if (fs::exists(p, ec)) {
    if (access(path.c_str(), W_OK) != 0)
      return invalid_argument(flag + ": cannot write '" + path + "': " + std::strerror(errno));
    // access() says yes to root for anything; opening (without truncating) is the real test. Only
    // regular files are probed: opening a FIFO for writing could block or signal its reader.
    if (fs::is_regular_file(p, ec)) {
      const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
      if (fd < 0) return invalid_argument(flag + ": cannot write '" + path + "': " + std::strerror(errno));
      ::close(fd);
    }
    return Status::ok();
  }
  const fs::path parent = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  if (!fs::is_directory(parent, ec))
    return invalid_argument(flag + ": cannot write '" + path + "': folder '" + parent.string() + "' does not exist");
  if (access(parent.c_str(), W_OK | X_OK) != 0)
    return invalid_argument(flag + ": cannot write '" + path + "': folder '" + parent.string() + "': " + std::strerror(errno));
  // Creating the file is the real test (root passes access() on /proc, a read-only mount, ...);
  // the probe is removed, so an output written only at the end (--plot) appears only then.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return invalid_argument(flag + ": cannot write '" + path + "': " + std::strerror(errno));
  ::close(fd);
  ::unlink(path.c_str());
  return Status::ok();
}

OutputFile::~OutputFile() { (void)close(); }

Status OutputFile::open(const std::string& flag, const std::string& path) {
  flag_ = flag;
  path_ = path.empty() ? "stdout" : path;
  if (path.empty()) {
    file_ = stdout;
    owned_ = false;
    return Status::ok();
  }
  ORIGAMI_RETURN_IF_ERROR(check_output_path(flag, path));
  file_ = std::fopen(path.c_str(), "w");
  if (file_ == nullptr) return invalid_argument(flag + ": cannot write '" + path + "': " + std::strerror(errno));
  owned_ = true;
  return Status::ok();
}

Status OutputFile::fail(const char* what) {
  if (error_.is_ok())
    error_ = Status(ErrorCode::kResourceExhausted,
                    flag_ + ": " + what + " '" + path_ + "' failed: " + std::strerror(errno) + " (results from here on are lost)");
  return error_;
}

Status OutputFile::write(const std::string& text) {
  if (!error_.is_ok() || file_ == nullptr) return error_;
  errno = 0;
  if (std::fwrite(text.data(), 1, text.size(), file_) != text.size()) return fail("writing");
  if (std::fflush(file_) != 0) return fail("writing");
  return Status::ok();
}

Status OutputFile::close() {
  if (file_ == nullptr) return error_;
  errno = 0;
  const bool flushed = std::fflush(file_) == 0;
  const bool closed = !owned_ || std::fclose(file_) == 0;
  file_ = nullptr;
  if (!flushed || !closed) return fail("closing");
  return error_;
}

bool flush_stdout() {
  errno = 0;
  if (std::fflush(stdout) == 0 && !std::ferror(stdout)) return true;
  print_error(std::string("writing to stdout failed: ") + std::strerror(errno != 0 ? errno : EIO));
  return false;
}

}  // namespace origami::cli
