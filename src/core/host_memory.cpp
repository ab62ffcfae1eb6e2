#include "core/host_memory.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace origami {
namespace {

// A number read from a cgroup file ("max" or a missing file: -1).
int64_t read_cgroup_value(const char* path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text == "max") return -1;
  try {
    return static_cast<int64_t>(std::stoull(text));
  } catch (...) {
    return -1;
  }
}

int64_t mem_available_from_proc() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return kib * 1024;
  }
  return -1;
}

}  // namespace

int64_t available_host_memory_bytes() {
  int64_t available = mem_available_from_proc();
  struct CgroupFiles {
    const char* limit;
    const char* usage;
  };
  for (const CgroupFiles& f : {CgroupFiles{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
                               CgroupFiles{"/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                           "/sys/fs/cgroup/memory/memory.usage_in_bytes"}}) {
    const int64_t limit = read_cgroup_value(f.limit);
    // cgroup v1 writes "no limit" as a huge page-aligned number.
    if (limit <= 0 || limit >= (int64_t{1} << 60)) continue;
    const int64_t usage = std::max<int64_t>(read_cgroup_value(f.usage), 0);
    const int64_t room = std::max<int64_t>(limit - usage, 0);
    available = available < 0 ? room : std::min(available, room);
    break;
  }
  return available;
}

std::string format_bytes(double bytes) {
  static const char* kUnits[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int unit = 0;
  while (bytes >= 1024.0 && unit < 6) {
    bytes /= 1024.0;
    ++unit;
  }
  char buf[64];
  if (unit == 0) std::snprintf(buf, sizeof buf, "%.0f bytes", bytes);
  else std::snprintf(buf, sizeof buf, "%.1f %s", bytes, kUnits[unit]);
  return buf;
}

Status check_host_memory(double needed_bytes, const std::string& what) {
  const int64_t available = available_host_memory_bytes();
  if (available < 0 || needed_bytes <= static_cast<double>(available)) return Status::ok();
  return Status(ErrorCode::kResourceExhausted, what + " needs about " + format_bytes(needed_bytes) + ", but only " +
                                                   format_bytes(static_cast<double>(available)) +
                                                   " of host memory is available");
}

}  // namespace origami
